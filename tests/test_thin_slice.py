"""The walking skeleton's JetStream behaviours, each run against the real JetStream and jetlake."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError, TimeoutError

from tests.differential import assert_same


async def api(nc: Client, subject: str, body: Any = b"") -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    msg = await nc.request(f"$JS.API.{subject}", data, timeout=5)
    answer: dict[str, Any] = json.loads(msg.data)
    return answer


def stream_cfg(name: str) -> dict[str, Any]:
    return {"name": name, "subjects": [f"{name.lower()}.>"]}


async def test_account_info_counts_streams(targets: dict[str, str], unique: str) -> None:
    """$JS.API.INFO answers with the account's limits and API level."""

    async def case(nc: Client, name: str) -> Any:
        info = await api(nc, "INFO")
        return {k: info[k] for k in ("type", "limits", "memory", "reserved_memory")} | {
            "api_level": info["api"]["level"]
        }

    out = await assert_same(targets, case, unique)
    assert out["type"] == "io.nats.jetstream.api.v1.account_info_response"


async def test_stream_create_and_info(targets: dict[str, str], unique: str) -> None:
    """STREAM.CREATE fills in JetStream's defaults; repeating it is idempotent; INFO shows it."""

    async def case(nc: Client, name: str) -> Any:
        first = await api(nc, f"STREAM.CREATE.{name}", stream_cfg(name))
        again = await api(nc, f"STREAM.CREATE.{name}", stream_cfg(name))
        info = await api(nc, f"STREAM.INFO.{name}")
        return {"first": first, "again": again, "info": info}

    out = await assert_same(targets, case, unique)
    assert out["first"]["config"]["retention"] == "limits"
    assert out["info"]["state"]["messages"] == 0


@pytest.mark.parametrize(
    ("subject_name", "body"),
    [
        # a different config under an existing name
        ("SAME", {"name": "SAME", "subjects": ["other.x"]}),
        # malformed JSON
        ("BADJSON", b"{not json"),
        # the name in the subject and in the body differ
        ("SUBJ", {"name": "BODY", "subjects": ["body.x"]}),
        # an empty body
        ("EMPTY", b""),
        # subjects overlapping another stream's
        ("OVERLAP", {"name": "OVERLAP", "subjects": ["same.>"]}),
    ],
)
async def test_stream_create_errors(
    targets: dict[str, str], unique: str, subject_name: str, body: Any
) -> None:
    """Bad stream creates get JetStream's error code and change nothing."""

    async def case(nc: Client, name: str) -> Any:
        await api(nc, f"STREAM.CREATE.SAME{name}", {"name": f"SAME{name}", "subjects": ["same.>"]})
        b = body
        if isinstance(b, dict):
            b = {**b, "name": b["name"] + name if b["name"] != "BODY" else "BODY"}
        err = await api(nc, f"STREAM.CREATE.{subject_name}{name}", b)
        names = await api(nc, "STREAM.NAMES", {"subject": "same.>"})
        error = err["error"]
        # Go's JSON parser words its messages its own way; the code is the contract.
        desc = error["description"].split(":")[0] if error["err_code"] == 10025 else error["description"]
        return {"code": error["code"], "err_code": error["err_code"], "desc": desc, "names": names["streams"]}

    out = await assert_same(targets, case, unique)
    assert out["err_code"] in (10025, 10056, 10058, 10065)


async def test_stream_info_unknown(targets: dict[str, str], unique: str) -> None:
    """STREAM.INFO of a stream that does not exist: 404 / 10059."""

    async def case(nc: Client, name: str) -> Any:
        return await api(nc, f"STREAM.INFO.{name}")

    out = await assert_same(targets, case, unique)
    assert out["error"]["err_code"] == 10059


async def test_publish_pubacks_and_state(targets: dict[str, str], unique: str) -> None:
    """Every publish gets a PubAck {stream, seq} in order; stream info counts messages and bytes."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
        acks = await asyncio.gather(
            *[
                js.publish(
                    f"{name.lower()}.{i % 3}", f"m{i}".encode(), headers={"X-I": str(i)} if i % 2 else None
                )
                for i in range(200)
            ]
        )
        await nc.publish(f"{name.lower()}.silent", b"no reply wanted")
        await nc.flush()
        info = await api(nc, f"STREAM.INFO.{name}")
        for _ in range(50):  # the silent publish has no PubAck to wait for
            if info["state"]["messages"] == 201:
                break
            await asyncio.sleep(0.05)
            info = await api(nc, f"STREAM.INFO.{name}")
        return {"acks": [(a.stream, a.seq) for a in acks], "state": info["state"]}

    out = await assert_same(targets, case, unique)
    assert [seq for _, seq in out["acks"]] == list(range(1, 201))
    assert out["state"]["messages"] == 201


async def test_publish_without_stream_has_no_responders(targets: dict[str, str], unique: str) -> None:
    """A publish to a subject no stream captures: no responders, as with no JetStream at all."""

    async def case(nc: Client, name: str) -> Any:
        try:
            await nc.request(f"nostream.{name.lower()}", b"x", timeout=2)
        except NoRespondersError:
            return "no responders"
        return "answered"

    assert await assert_same(targets, case, unique) == "no responders"


async def test_unknown_api_subject_is_silent(targets: dict[str, str], unique: str) -> None:
    """An API subject the server does not know gets no answer at all."""

    async def case(nc: Client, name: str) -> Any:
        try:
            await nc.request(f"$JS.API.NO.SUCH.THING.{name}", b"{}", timeout=1)
        except TimeoutError:
            return "silent"
        return "answered"

    assert await assert_same(targets, case, unique) == "silent"


async def test_pull_fetch_ack(targets: dict[str, str], unique: str) -> None:
    """A durable pull consumer delivers every message under its stored subject with its headers,
    the ack token carries the sequences, and acks move the floor."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        subj = name.lower()
        await js.add_stream(name=name, subjects=[f"{subj}.>"])
        for i in range(30):
            await js.publish(f"{subj}.{i % 3}", f"m{i}".encode(), headers={"X-I": str(i)})
        sub = await js.pull_subscribe(f"{subj}.>", durable="dur")
        before = await api(nc, f"CONSUMER.INFO.{name}.dur")
        got: list[Any] = []
        while len(got) < 30:
            for m in await sub.fetch(10, timeout=5):
                md = m.metadata
                got.append(
                    (
                        m.subject,
                        m.data.decode(),
                        (m.headers or {}).get("X-I"),
                        md.sequence.stream,
                        md.sequence.consumer,
                        md.num_delivered,
                        md.num_pending,
                    )
                )
                if len(got) <= 25:
                    await m.ack_sync()
        mid = await api(nc, f"CONSUMER.INFO.{name}.dur")
        return {"got": got, "before": before, "after": mid}

    out = await assert_same(targets, case, unique)
    assert out["got"][0] == (f"{unique.lower()}.0", "m0", "0", 1, 1, 1, 29)
    assert out["after"]["ack_floor"] == {"consumer_seq": 25, "stream_seq": 25}
    assert out["after"]["num_ack_pending"] == 5


async def test_fetch_on_empty_consumer_times_out(targets: dict[str, str], unique: str) -> None:
    """fetch() on a consumer with nothing to deliver waits for its expiry and reports a timeout."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
        sub = await js.pull_subscribe(f"{name.lower()}.>", durable="idle")
        try:
            await sub.fetch(1, timeout=1)
        except TimeoutError:
            return "timeout"
        return "messages"

    assert await assert_same(targets, case, unique) == "timeout"


async def test_raw_pull_request_statuses(targets: dict[str, str], unique: str) -> None:
    """Raw MSG.NEXT: no_wait on an empty consumer answers 404; expires answers 408 with pending
    headers after delivering what there is."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
        await api(
            nc,
            f"CONSUMER.CREATE.{name}.c",
            {"stream_name": name, "config": {"durable_name": "c", "ack_policy": "explicit"}},
        )
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        seen: list[Any] = []

        async def collect(n: int) -> None:
            for _ in range(n):
                m = await sub.next_msg(timeout=3)
                hdrs = dict(m.headers or {})
                seen.append(
                    (
                        m.subject == inbox,
                        hdrs.get("Status"),
                        hdrs.get("Description"),
                        hdrs.get("Nats-Pending-Messages"),
                        m.data.decode(),
                    )
                )

        await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{name}.c", b'{"batch":1,"no_wait":true}', reply=inbox)
        await collect(1)
        await js.publish(f"{name.lower()}.a", b"one")
        await nc.publish(
            f"$JS.API.CONSUMER.MSG.NEXT.{name}.c", b'{"batch":3,"expires":300000000}', reply=inbox
        )
        await collect(2)
        return seen

    out = await assert_same(targets, case, unique)
    assert out[0][1] == "404"
    assert out[2][1] == "408"
