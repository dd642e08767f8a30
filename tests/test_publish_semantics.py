"""Publish semantics (PubAck, Nats-Msg-Id, the expected-* headers, rollup refusal, max_msg_size,
no_ack), each case run against the real JetStream and jetlake and compared answer for answer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from nats.aio.client import Client
from nats.errors import TimeoutError

from tests.differential import assert_same, run_case
from tests.harness import Jetlake, ReferenceJetStream


async def api(nc: Client, subject: str, body: Any = b"") -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    msg = await nc.request(f"$JS.API.{subject}", data, timeout=5)
    return dict(json.loads(msg.data))


async def pub(nc: Client, subject: str, data: bytes = b"x", hdrs: dict[str, str] | None = None) -> Any:
    """The raw PubAck (or error PubAck) as JSON, or "no answer"."""
    try:
        msg = await nc.request(subject, data, timeout=2, headers=hdrs)
    except TimeoutError:
        return "no answer"
    return json.loads(msg.data)


def state(info: dict[str, Any]) -> dict[str, Any]:
    return {k: info["state"].get(k) for k in ("messages", "bytes", "first_seq", "last_seq", "num_subjects")}


# Each step: (subject suffix, headers); the answers of a whole sequence are compared, because
# every check reads what the earlier steps stored.
EXPECT_STEPS: list[tuple[str, dict[str, str] | None]] = [
    ("a", None),  # plain PubAck {stream, seq}
    ("a", {"Nats-Msg-Id": "a"}),  # stored, id remembered
    ("a", {"Nats-Msg-Id": "a"}),  # duplicate: original seq, "duplicate": true, nothing stored
    ("a", {"Nats-Msg-Id": ""}),  # an empty id is no id
    ("a", {"Nats-Expected-Stream": "{name}"}),  # the right stream
    ("a", {"Nats-Expected-Stream": "OTHER"}),  # 10060
    ("a", {"Nats-Expected-Last-Sequence": "4"}),  # right last sequence
    ("a", {"Nats-Expected-Last-Sequence": "99"}),  # 10071 wrong last sequence: 5
    ("a", {"Nats-Expected-Last-Sequence": "abc"}),  # unparsable: a sequence no stream has
    ("a", {"Nats-Expected-Last-Sequence": "0"}),  # 0 is a real expectation, not "unset"
    ("b", {"Nats-Expected-Last-Subject-Sequence": "0"}),  # first message on b
    ("b", {"Nats-Expected-Last-Subject-Sequence": "0"}),  # b now has one: wrong last sequence
    ("b", {"Nats-Expected-Last-Subject-Sequence": "6"}),  # right per-subject sequence
    ("a", {"Nats-Expected-Last-Subject-Sequence": "5"}),  # a's last is 5
    (
        "a",
        {"Nats-Expected-Last-Subject-Sequence": "7", "Nats-Expected-Last-Subject-Sequence-Subject": "{s}.b"},
    ),
    (
        "a",
        {"Nats-Expected-Last-Subject-Sequence": "7", "Nats-Expected-Last-Subject-Sequence-Subject": "{s}.b"},
    ),
    (
        "a",
        {"Nats-Expected-Last-Subject-Sequence": "0", "Nats-Expected-Last-Subject-Sequence-Subject": "{s}.z"},
    ),
    ("a", {"Nats-Expected-Last-Subject-Sequence-Subject": "{s}.b"}),  # subject without sequence: 10193
    ("a", {"Nats-Expected-Last-Msg-Id": "a"}),  # the last message had no id: wrong last msg ID
    ("a", {"Nats-Msg-Id": "m1"}),
    ("a", {"Nats-Expected-Last-Msg-Id": "m1", "Nats-Msg-Id": "m2"}),  # right last id
    ("a", {"Nats-Expected-Last-Msg-Id": "m1"}),  # wrong last msg ID: m2
    ("a", {"Nats-Msg-Id": "a", "Nats-Expected-Last-Sequence": "1"}),  # sequence checks before dedup
    ("a", {"Nats-Msg-Id": "a", "Nats-Expected-Last-Msg-Id": "zz"}),  # dedup before last-id check
    ("a", {"Nats-Rollup": "sub"}),  # rollups need allow_rollup_hdrs: 10111
    ("a", {"Nats-Rollup": "bogus"}),
    ("a", {"Nats-TTL": "5s"}),  # TTL on a stream without allow_msg_ttl: 10166
    ("a", {"Nats-TTL": "bogus"}),  # an unparsable TTL is only checked later: 10165
    ("a", {"Nats-Incr": "1"}),  # counters are off: 10168
    ("a", {"Nats-Incr": "x"}),  # 10171
    ("a", {"Nats-Expected-Stream": "OTHER", "Nats-Expected-Last-Sequence": "1"}),  # stream first
    ("a", {"Nats-Expected-Last-Sequence": "1", "Nats-Expected-Last-Subject-Sequence": "1"}),
]


async def test_expected_headers_and_dedup(targets: dict[str, str], unique: str) -> None:
    """Every expected-* header, Nats-Msg-Id and the order nats-server checks them in."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{s}.>"]})
        answers = []
        for suffix, hdrs in EXPECT_STEPS:
            h = {k: v.replace("{name}", name).replace("{s}", s) for k, v in (hdrs or {}).items()}
            answers.append(await pub(nc, f"{s}.{suffix}", b"x", h or None))
        return {"answers": answers, "state": state(await api(nc, f"STREAM.INFO.{name}"))}

    out = await assert_same(targets, case, unique)
    assert out["answers"][2] == {"stream": unique, "seq": 2, "duplicate": True}
    assert out["answers"][5]["error"]["err_code"] == 10060


async def test_duplicate_window_expires(targets: dict[str, str], unique: str) -> None:
    """A repeated id inside duplicate_window is a duplicate; after the window it is stored anew."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        await api(
            nc,
            f"STREAM.CREATE.{name}",
            {"name": name, "subjects": [f"{s}.>"], "duplicate_window": 500_000_000},
        )
        first = await pub(nc, f"{s}.a", b"1", {"Nats-Msg-Id": "k"})
        again = await pub(nc, f"{s}.b", b"2", {"Nats-Msg-Id": "k"})
        await asyncio.sleep(0.8)
        later = await pub(nc, f"{s}.a", b"3", {"Nats-Msg-Id": "k"})
        return [first, again, later, state(await api(nc, f"STREAM.INFO.{name}"))]

    out = await assert_same(targets, case, unique)
    assert out[2] == {"stream": unique, "seq": 2}


async def test_concurrent_duplicates_share_one_sequence(targets: dict[str, str], unique: str) -> None:
    """Many publishes of one id at once (the original still in flight): one message, one sequence."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{s}.>"]})
        answers = await asyncio.gather(*[pub(nc, f"{s}.a", b"x", {"Nats-Msg-Id": "same"}) for _ in range(50)])
        return {
            "seqs": sorted({a["seq"] for a in answers}),
            "duplicates": sum(1 for a in answers if a.get("duplicate")),
            "state": state(await api(nc, f"STREAM.INFO.{name}")),
        }

    out = await assert_same(targets, case, unique)
    assert out["seqs"] == [1]
    assert out["duplicates"] == 49


async def test_max_msg_size(targets: dict[str, str], unique: str) -> None:
    """max_msg_size counts header block plus payload; a larger message gets 10054 and is not stored."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{s}.>"], "max_msg_size": 100})
        return [
            await pub(nc, f"{s}.a", b"x" * 100),
            await pub(nc, f"{s}.a", b"x" * 101),
            await pub(nc, f"{s}.a", b"x" * 60, {"X-Pad": "y" * 20}),
            await pub(nc, f"{s}.a", b"x" * 50, {"X-Pad": "y" * 60}),
            await pub(nc, f"{s}.a", b"", {"X-Pad": "y" * 120}),
            state(await api(nc, f"STREAM.INFO.{name}")),
        ]

    out = await assert_same(targets, case, unique)
    assert out[1]["error"]["err_code"] == 10054


async def test_rollup_value_checked_when_allowed(targets: dict[str, str], unique: str) -> None:
    """With allow_rollup_hdrs, an unknown Nats-Rollup value is refused; with deny_purge the create
    itself is refused."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        cfg = {"name": name, "subjects": [f"{s}.>"], "allow_rollup_hdrs": True}
        created = await api(nc, f"STREAM.CREATE.{name}", cfg)
        denied = await api(
            nc,
            f"STREAM.CREATE.{name}X",
            {**cfg, "name": f"{name}X", "subjects": [f"{s}x"], "deny_purge": True},
        )
        return [
            created["config"]["allow_rollup_hdrs"],
            denied["error"],
            await pub(nc, f"{s}.a", b"1", {"Nats-Rollup": "everything"}),
            state(await api(nc, f"STREAM.INFO.{name}")),
        ]

    await assert_same(targets, case, unique)


async def test_no_ack_stream_answers_nothing(targets: dict[str, str], unique: str) -> None:
    """A no_ack stream stores publishes but sends no PubAck, not even for an error."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{s}.>"], "no_ack": True})
        answers = [
            await pub(nc, f"{s}.a", b"1"),
            await pub(nc, f"{s}.a", b"2", {"Nats-Expected-Stream": "OTHER"}),
        ]
        return {"answers": answers, "state": state(await api(nc, f"STREAM.INFO.{name}"))}

    out = await assert_same(targets, case, unique)
    assert out["answers"] == ["no answer", "no answer"]


async def test_sealed_stream_refuses_publish(targets: dict[str, str], unique: str) -> None:
    """A create asking for sealed is refused (sealing is an update); see test_stream_config."""

    async def case(nc: Client, name: str) -> Any:
        return await api(nc, f"STREAM.CREATE.{name}", {"name": name, "sealed": True})

    out = await assert_same(targets, case, unique)
    assert out["error"]["err_code"] == 10052


async def test_dedup_window_survives_restart(
    reference: ReferenceJetStream, jetlake: Jetlake, unique: str
) -> None:
    """The duplicate window and the last msg id are rebuilt from the messages table on start: a
    repeat after a gateway restart is still a duplicate, as after a nats-server restart."""

    async def before(nc: Client, name: str) -> Any:
        s = name.lower()
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{s}.>"]})
        return [await pub(nc, f"{s}.a", b"1", {"Nats-Msg-Id": f"id{i}"}) for i in range(3)]

    async def after(nc: Client, name: str) -> Any:
        s = name.lower()
        return [
            await pub(nc, f"{s}.a", b"1", {"Nats-Msg-Id": "id0"}),
            await pub(nc, f"{s}.a", b"1", {"Nats-Expected-Last-Msg-Id": "id2"}),
            await pub(nc, f"{s}.a", b"1", {"Nats-Msg-Id": "id1"}),
            state(await api(nc, f"STREAM.INFO.{name}")),
        ]

    targets = {"jetstream": reference.url, "jetlake": jetlake.url}
    first = await run_case(targets, before, unique)
    await asyncio.to_thread(jetlake.stop_gateway)
    await asyncio.to_thread(jetlake.start_gateway)
    second = await run_case(targets, after, unique)
    assert first["jetlake"] == first["jetstream"]
    assert second["jetlake"] == second["jetstream"]
    assert second["jetstream"][0] == {"stream": unique, "seq": 1, "duplicate": True}
