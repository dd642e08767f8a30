"""Publish semantics (PubAck, Nats-Msg-Id, the expected-* headers, rollup refusal, max_msg_size,
no_ack), each case run against the real JetStream and jetlake and compared answer for answer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError

from tests.differential import assert_same, assert_same_across_restart
from tests.harness import Jetlake, ReferenceJetStream


async def api(nc: Client, subject: str, body: Any = b"") -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    msg = await nc.request(f"$JS.API.{subject}", data, timeout=5)
    return dict(json.loads(msg.data))


async def pub(
    nc: Client, subject: str, data: bytes = b"x", hdrs: dict[str, str] | None = None, wait_s: float = 2
) -> Any:
    """The raw PubAck (or error PubAck) as JSON, or "no answer"."""
    try:
        msg = await nc.request(subject, data, timeout=wait_s, headers=hdrs)
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
    (
        "a",
        {"Nats-Expected-Last-Subject-Sequence": "7", "Nats-Expected-Last-Subject-Sequence-Subject": "{s}.*"},
    ),
    (
        "a",
        {"Nats-Expected-Last-Subject-Sequence": "0", "Nats-Expected-Last-Subject-Sequence-Subject": "{s}.>"},
    ),
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
    ("a", {"Nats-Schedule": "@at 2030-01-01T00:00:00Z"}),  # schedules are off: 10188
    ("a", {"Nats-Schedule-Next": "purge", "Nats-Scheduler": "{s}.sched"}),  # 10188
    ("a", {"Nats-Schedule-Next": "later"}),  # only a purge: 10212
    ("a", {"Nats-Scheduler": "{s}.sched"}),  # only with Schedule-Next: 10212
    ("a", {"Nats-Stream-Source": "X"}),  # only sourced messages carry it: 10227
    ("a", {"Nats-Batch-Id": "b1", "Nats-Batch-Sequence": "1"}),  # atomic batches are off: 10174
    ("a", {"Nats-Batch-Id": "b1", "Nats-Expected-Stream": "OTHER"}),  # batch refusal comes first
    ("a", {"Nats-Required-Api-Level": "9"}),  # ignored on a publish
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
    assert out["answers"][2] == {"stream": unique, "domain": "jetlake", "seq": 2, "duplicate": True}
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
    assert out[2] == {"stream": unique, "domain": "jetlake", "seq": 2}


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
            await pub(nc, f"{s}.a", b"1", wait_s=0.5),
            await pub(nc, f"{s}.a", b"2", {"Nats-Expected-Stream": "OTHER"}, wait_s=0.5),
        ]
        return {"answers": answers, "state": state(await api(nc, f"STREAM.INFO.{name}"))}

    out = await assert_same(targets, case, unique)
    assert out["answers"] == ["no answer", "no answer"]


async def test_sealed_stream_refuses_publish(targets: dict[str, str], unique: str) -> None:
    """A create asking for sealed is refused; once an update seals the stream, publishes get 10109
    (before any header check) and nothing is stored."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        cfg = {"name": name, "subjects": [f"{s}.>"]}
        refused = await api(nc, f"STREAM.CREATE.{name}", {**cfg, "sealed": True})
        await api(nc, f"STREAM.CREATE.{name}", cfg)
        first = await pub(nc, f"{s}.a")
        sealed = await api(nc, f"STREAM.UPDATE.{name}", {**cfg, "sealed": True})
        return [
            refused["error"],
            first,
            sealed["config"]["sealed"],
            await pub(nc, f"{s}.a"),
            await pub(nc, f"{s}.a", b"x", {"Nats-Expected-Stream": "OTHER"}),
            state(await api(nc, f"STREAM.INFO.{name}")),
        ]

    out = await assert_same(targets, case, unique)
    assert out[3]["error"]["err_code"] == 10109


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

    _, second = await assert_same_across_restart(reference, jetlake, before, after, unique, kill=False)
    assert second[0] == {"stream": unique, "domain": "jetlake", "seq": 1, "duplicate": True}


async def test_rollups(targets: dict[str, str], unique: str) -> None:
    """Nats-Rollup: sub keeps only the new message of its subject, all only the new message of the
    stream; the removed messages leave holes the stream state counts."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        cfg = {"name": name, "subjects": [f"{s}.>"], "allow_rollup_hdrs": True}
        await api(nc, f"STREAM.CREATE.{name}", cfg)
        for subj in ("a", "a", "b", "c", "a"):
            await pub(nc, f"{s}.{subj}")
        steps = [await pub(nc, f"{s}.a", b"roll", {"Nats-Rollup": "sub"})]
        info = await api(nc, f"STREAM.INFO.{name}", {"subjects_filter": ">"})
        steps.append((state(info), info["state"].get("subjects"), info["state"].get("num_deleted")))
        steps.append(await pub(nc, f"{s}.b", b"all", {"Nats-Rollup": "ALL"}))
        info = await api(nc, f"STREAM.INFO.{name}", {"subjects_filter": ">"})
        steps.append((state(info), info["state"].get("subjects"), info["state"].get("num_deleted")))
        return steps

    out = await assert_same(targets, case, unique)
    assert out[3][0]["messages"] == 1


@pytest.mark.slow
async def test_rollup_survives_kill_9(reference: ReferenceJetStream, jetlake: Jetlake, unique: str) -> None:
    """A rollup's purge is replayed from the stored headers on start: killing the gateway right
    after the PubAck (before the removal log has it) changes no answer."""

    async def before(nc: Client, name: str) -> Any:
        s = name.lower()
        await api(
            nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{s}.>"], "allow_rollup_hdrs": True}
        )
        for subj in ("a", "a", "b", "a"):
            await pub(nc, f"{s}.{subj}")
        return [
            await pub(nc, f"{s}.a", b"roll", {"Nats-Rollup": "sub"}),
            await pub(nc, f"{s}.c", b"all", {"Nats-Rollup": "all"}),
        ]

    async def after(nc: Client, name: str) -> Any:
        info = await api(nc, f"STREAM.INFO.{name}", {"subjects_filter": ">"})
        return (state(info), info["state"].get("subjects"), info["state"].get("num_deleted"))

    _, second = await assert_same_across_restart(reference, jetlake, before, after, unique, kill=True)
    assert second[0]["messages"] == 1


async def test_first_seq(targets: dict[str, str], unique: str) -> None:
    """A stream created with first_seq gives its first publish that sequence."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{s}.>"], "first_seq": 100})
        empty = state(await api(nc, f"STREAM.INFO.{name}"))
        acks = [
            await pub(nc, f"{s}.a"),
            await pub(nc, f"{s}.a", b"x", {"Nats-Expected-Last-Sequence": "100"}),
        ]
        return [empty, acks, state(await api(nc, f"STREAM.INFO.{name}"))]

    out = await assert_same(targets, case, unique)
    assert out[1][0]["seq"] == 100


async def test_concurrent_expected_last_sequence(targets: dict[str, str], unique: str) -> None:
    """Publishes racing on one Nats-Expected-Last-Sequence: the first wins, the others see its
    sequence although its commit may still be in flight."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{s}.>"]})
        hdrs = {"Nats-Expected-Last-Sequence": "0"}
        answers = await asyncio.gather(*[pub(nc, f"{s}.a", b"x", hdrs) for _ in range(30)])
        return sorted(json.dumps(a, sort_keys=True) for a in answers)

    out = await assert_same(targets, case, unique)
    assert sum(1 for a in out if '"seq": 1' in a) == 1


# A burst sent without waiting: (subject suffix, payload, headers, with a reply). The gateway gets
# it in few reads and accepts publishes without headers together; every step must still see all
# the steps before it.
BURST_STEPS: list[tuple[str, bytes, dict[str, str] | None, bool]] = [
    *[("a", b"x", None, True) for _ in range(5)],  # seq 1-5
    ("b", b"x" * 65, None, True),  # over max_msg_size: refused alone
    ("a", b"x", {"Nats-Expected-Last-Sequence": "5"}, True),  # sees the five before it: seq 6
    ("c", b"core", None, False),  # no reply: stored, answers nothing (seq 7)
    ("a", b"y", {"Nats-Msg-Id": "k"}, True),  # seq 8
    ("a", b"z", None, True),  # seq 9
    ("a", b"y", {"Nats-Msg-Id": "k"}, True),  # duplicate of 8, still in flight
    ("a", b"x", {"Nats-Expected-Last-Sequence": "9"}, True),  # seq 10
    ("a", b"x", {"Nats-Expected-Last-Subject-Sequence": "10"}, True),  # a's last: seq 11
    *[("b", b"x", None, True) for _ in range(5)],  # seq 12-16
]


async def test_burst_of_publishes_in_one_read(targets: dict[str, str], unique: str) -> None:
    """Publishes sent back to back, with and without headers and replies: each PubAck, error and
    duplicate answer is what JetStream gives, and the stream holds the same messages."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{s}.>"], "max_msg_size": 64})
        inbox = nc.new_inbox()
        answers: dict[str, Any] = {}
        wanted = sum(1 for *_, reply in BURST_STEPS if reply)
        all_in = asyncio.Event()

        async def answer(msg: Msg) -> None:
            answers[msg.subject] = json.loads(msg.data)
            if len(answers) == wanted:
                all_in.set()

        sub = await nc.subscribe(f"{inbox}.*", cb=answer)
        for i, (suffix, data, hdrs, reply) in enumerate(BURST_STEPS):
            await nc.publish(f"{s}.{suffix}", data, reply=f"{inbox}.{i}" if reply else "", headers=hdrs)
        await nc.flush()
        await asyncio.wait_for(all_in.wait(), 10)
        await sub.unsubscribe()
        return {
            "answers": [answers.get(f"{inbox}.{i}") for i in range(len(BURST_STEPS))],
            "state": state(await api(nc, f"STREAM.INFO.{name}")),
        }

    out = await assert_same(targets, case, unique)
    assert out["answers"][6] == {"stream": unique, "domain": "jetlake", "seq": 6}
    assert out["answers"][10] == {"stream": unique, "domain": "jetlake", "seq": 8, "duplicate": True}
    assert out["state"]["messages"] == 16
