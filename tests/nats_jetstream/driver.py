"""The next-generation Python clients (`nats-core` + `nats-jetstream`) against one server.

usage: python3.13 driver.py <nats-url> <stream> <case>

Run from their own Python 3.13 virtual environment (`make nats-jetstream-client`), never imported
by the tests: tests/test_nats_jetstream_client.py runs each case against the real JetStream and
jetlake and compares the JSON line it prints ({"error": ...} and exit 1 if the case failed). The
line holds the client's own view of each answer: its dataclasses, every field it decodes (not in
its strict mode, which refuses the `domain` that both servers name in stream info). Times and
server ids are left to the test's scrub; the client's random names are left out here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sys
from datetime import datetime, timedelta
from typing import Any

from nats.client import Client, connect
from nats.client.errors import NoRespondersError
from nats.jetstream import (
    JetStream,
    JetStreamError,
    MessageNotFoundError,
    StreamMessage,
    new,
)
from nats.jetstream.message import Message
from nats.jetstream.stream import Stream

Report = dict[str, Any]


def plain(value: Any) -> Any:
    """A client value (dataclasses, times, durations) as JSON."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, datetime):
        return "<time>"
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.decode()
    return value


def failure(exc: BaseException) -> dict[str, Any]:
    """What the client raised: its class and, for an API error, the server's codes and words."""
    out: dict[str, Any] = {"raised": type(exc).__name__}
    if isinstance(exc, JetStreamError):
        out.update(code=exc.code, err_code=exc.error_code, description=exc.description)
    else:
        out["text"] = str(exc)
    return out


def seen(msg: Message) -> list[Any]:
    meta = msg.metadata
    return [msg.subject, msg.data.decode(), meta.sequence.stream, meta.sequence.consumer, meta.num_delivered]


def stored(msg: StreamMessage) -> dict[str, Any]:
    headers = msg.headers._data if msg.headers is not None else None
    return {"subject": msg.subject, "seq": msg.sequence, "data": msg.data.decode(), "headers": headers}


async def streams(js: JetStream, name: str) -> Report:
    """Create (again, and differently), info, update, names and listing, delete."""
    out: Report = {}
    stream = await js.create_stream(name=name, subjects=[f"{name}.>"], max_msgs=100, storage="file")
    out["create"] = plain(stream.info)
    again = await js.create_stream(name=name, subjects=[f"{name}.>"], max_msgs=100, storage="file")
    out["create_again"] = plain(again.info) == out["create"]
    try:
        await js.create_stream(name=name, subjects=[f"{name}.>"], max_msgs=7)
    except JetStreamError as exc:
        out["create_different"] = failure(exc)
    updated = await js.update_stream(name=name, subjects=[f"{name}.>"], max_msgs=50, allow_direct=True)
    out["update"] = plain(updated)
    await js.publish(f"{name}.a", b"1")
    await js.publish(f"{name}.b", b"2")
    out["info_subjects"] = plain(await js.get_stream_info(name, subjects_filter=">"))
    out["names"] = [n async for n in js.stream_names() if n.startswith(name)]
    out["listed"] = [i.config.name async for i in js.list_streams(subject=f"{name}.b")]
    out["delete"] = await js.delete_stream(name)
    for step in ("info", "delete"):
        try:
            await (js.get_stream_info(name) if step == "info" else js.delete_stream(name))
        except JetStreamError as exc:
            out[f"{step}_deleted"] = failure(exc)
    return out


async def publish(js: JetStream, name: str) -> Report:
    """PubAcks with and without a message id, and each expected-* header, right and wrong."""
    await js.create_stream(name=name, subjects=[f"{name}.>"])
    subject = f"{name}.a"
    cases: list[tuple[str, str, dict[str, str] | None]] = [
        ("plain", subject, None),
        ("msg_id", subject, {"Nats-Msg-Id": "m1"}),
        ("msg_id_again", subject, {"Nats-Msg-Id": "m1"}),
        ("other_subject", f"{name}.b", None),
        ("expected_stream", subject, {"Nats-Expected-Stream": name}),
        ("expected_stream_wrong", subject, {"Nats-Expected-Stream": "OTHER"}),
        ("expected_last_seq", subject, {"Nats-Expected-Last-Sequence": "4"}),
        ("expected_last_seq_wrong", subject, {"Nats-Expected-Last-Sequence": "4"}),
        ("expected_subject_seq", subject, {"Nats-Expected-Last-Subject-Sequence": "5"}),
        ("expected_subject_seq_wrong", subject, {"Nats-Expected-Last-Subject-Sequence": "5"}),
        ("msg_id_2", subject, {"Nats-Msg-Id": "m2"}),
        ("expected_msg_id", subject, {"Nats-Expected-Last-Msg-Id": "m2", "Nats-Msg-Id": "m3"}),
        ("expected_msg_id_wrong", subject, {"Nats-Expected-Last-Msg-Id": "m2"}),
    ]
    out: Report = {}
    for case, subj, headers in cases:
        try:
            out[case] = plain(await js.publish(subj, case.encode(), headers=headers))
        except JetStreamError as exc:
            out[case] = failure(exc)
    try:
        await js.publish(f"NO{name}.x", b"", retry_attempts=0)
    except NoRespondersError as exc:
        out["no_stream"] = failure(exc)
    out["state"] = plain((await js.get_stream_info(name)).state)
    return out


async def get(js: JetStream, name: str) -> Report:
    """Message get through STREAM.MSG.GET and through DIRECT.GET (which the client picks by the
    stream's allow_direct), last by subject, a missing sequence."""
    out: Report = {}
    for direct in (False, True):
        stream_name = f"{name}D" if direct else name
        stream = await js.create_stream(name=stream_name, subjects=[f"{stream_name}.>"], allow_direct=direct)
        await js.publish(f"{stream_name}.a", b"one", headers={"X-Tag": "t1"})
        await js.publish(f"{stream_name}.b", b"two")
        await js.publish(f"{stream_name}.a", b"three")
        await stream.get_info()
        part: Report = {
            "seq2": stored(await stream.get_message(2)),
            "last_a": stored(await stream.get_last_message_for_subject(f"{stream_name}.a")),
            "seq1": stored(await stream.get_message(1)),
        }
        for case, fetch in (
            ("missing", stream.get_message(9)),
            ("missing_subject", stream.get_last_message_for_subject(f"{stream_name}.z")),
        ):
            try:
                await fetch
            except MessageNotFoundError as exc:
                part[case] = failure(exc)
        out["direct" if direct else "msg_get"] = part
    out["js_get"] = stored(await js.get_message(name, 1))
    out["js_get_last"] = stored(await js.get_last_message_for_subject(name, f"{name}.b"))
    return out


async def fill(js: JetStream, name: str, count: int, subjects: tuple[str, ...] = ("a",)) -> Stream:
    stream = await js.create_stream(name=name, subjects=[f"{name}.>"])
    for n in range(1, count + 1):
        await js.publish(f"{name}.{subjects[n % len(subjects)]}", str(n).encode())
    return stream


async def fetch(js: JetStream, name: str) -> Report:
    """fetch, a nak and its redelivery, fetch_nowait, next on an empty consumer, max_bytes, and a
    heartbeat too large for the request's expiry."""
    stream = await fill(js, name, 10)
    consumer = await stream.create_consumer(name="C", durable_name="C", ack_policy="explicit")
    out: Report = {"created": plain(consumer.info)}
    first = [m async for m in await consumer.fetch(max_messages=4, max_wait=1)]
    # The nak and acks go once the batch is in, the last ack as a request: both servers take a
    # consumer's acks in order, so its answer says the nak was taken before the next pull (a
    # pull overtaking the nak would find nothing queued for redelivery yet).
    await first[0].nak()
    for msg in first[1:-1]:
        await msg.ack()
    await first[-1].double_ack()
    out["first"] = [seen(m) for m in first]
    second = [m async for m in await consumer.fetch(max_messages=4, max_wait=1)]
    out["second"] = [seen(m) for m in second]
    for msg in second:
        await msg.double_ack()
    rest = await consumer.fetch_nowait(max_messages=10)
    out["nowait"] = [seen(m) async for m in rest]
    empty = await consumer.fetch_nowait(max_messages=10)
    out["nowait_empty"] = ([seen(m) async for m in empty], empty.error)
    try:
        await consumer.next(max_wait=0.3)
    except TimeoutError as exc:
        out["next_empty"] = failure(exc)
    bytes_consumer = await stream.create_consumer(name="B", durable_name="B", ack_policy="none")
    by_bytes = await bytes_consumer.fetch(max_bytes=150, max_wait=0.5)
    out["max_bytes"] = [seen(m) async for m in by_bytes]
    too_large = await bytes_consumer.fetch(max_messages=1, max_wait=1, heartbeat=0.8)
    out["heartbeat_too_large"] = ([seen(m) async for m in too_large], failure(too_large.error or Exception()))
    out["info"] = plain(await js.get_consumer_info(name, "C"))
    return out


class HeartbeatMisses(logging.Handler):
    """Counts the client's 'Heartbeat timeout' warnings: it logs one when a pull request's
    idle heartbeats stop for twice their interval."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "Heartbeat timeout" in record.getMessage():
            self.count += 1


async def messages(js: JetStream, name: str) -> Report:
    """messages() with idle heartbeats: 12 stored, 1.5 s idle (the client counts a miss after
    twice the 0.5 s interval without a heartbeat or message), then 8 more published while it
    waits; all acked, none missed."""
    stream = await fill(js, name, 12)
    consumer = await stream.create_consumer(name="M", durable_name="M", ack_policy="explicit")
    misses = HeartbeatMisses()
    logging.getLogger("nats.jetstream.consumer.pull").addHandler(misses)
    got: list[list[Any]] = []
    later: asyncio.Task[None] | None = None

    async def publish_later() -> None:
        await asyncio.sleep(1.5)
        for n in range(13, 21):
            await js.publish(f"{name}.a", str(n).encode())

    feed = await consumer.messages(max_messages=5, heartbeat=0.5, max_wait=2)
    async for msg in feed:
        got.append(seen(msg))
        # the last ack as a request: its answer says all the acks before it were taken
        await (msg.double_ack() if len(got) == 20 else msg.ack())
        if len(got) == 12:
            later = asyncio.create_task(publish_later())
        if len(got) == 20:
            break
    await feed.stop()
    if later is not None:
        await later
    logging.getLogger("nats.jetstream.consumer.pull").removeHandler(misses)
    info = await js.get_consumer_info(name, "M")
    return {
        "messages": got,
        "heartbeat_misses": misses.count,
        "delivered": info.delivered,
        "ack_floor": info.ack_floor,
        "num_ack_pending": info.num_ack_pending,
        "num_pending": info.num_pending,
    }


async def ordered(js: JetStream, name: str) -> Report:
    """Ordered consumers (client-managed, memory-stored, ack none): messages(), fetch (a new
    server consumer from the next sequence each time), filtered last-per-subject."""
    stream = await fill(js, name, 20, ("a", "b"))
    out: Report = {}
    oc = await stream.ordered_consumer()
    out["config"] = {
        k: v
        for k, v in plain(oc.info.config).items()
        if k not in ("name", "durable_name")  # the client's random prefix
    }
    got = []
    feed = await oc.messages(max_messages=7)
    async for msg in feed:
        got.append(seen(msg))
        if len(got) == 20:
            break
    await feed.stop()
    await oc.close()
    out["messages"] = got
    oc = await stream.ordered_consumer(filter_subjects=[f"{name}.b"])
    out["fetches"] = [[seen(m) async for m in await oc.fetch(max_messages=4, max_wait=0.5)] for _ in range(3)]
    await oc.close()
    oc = await stream.ordered_consumer(deliver_policy="last_per_subject")
    out["last_per_subject"] = [seen(m) async for m in await oc.fetch(max_messages=5, max_wait=0.5)]
    await oc.close()
    out["consumers_left"] = [n async for n in js.consumer_names(name)]
    return out


async def reset(js: JetStream, name: str) -> Report:
    """CONSUMER.RESET (ADR-60): to a sequence, to above the ack floor, below a bounded start."""
    stream = await fill(js, name, 8)
    consumer = await stream.create_consumer(name="R", durable_name="R", ack_policy="explicit")
    out: Report = {}
    batch = [m async for m in await consumer.fetch(max_messages=5, max_wait=1)]
    for msg in batch[:3]:
        await msg.ack()
    done = await consumer.reset(seq=2)
    out["to_2"] = {"reset_seq": done.reset_seq, "info": plain(done.info)}
    out["after_to_2"] = [seen(m) async for m in await consumer.fetch(max_messages=3, max_wait=1)]
    done = await consumer.reset()
    out["to_floor"] = {"reset_seq": done.reset_seq, "info": plain(done.info)}
    out["after_to_floor"] = [seen(m) async for m in await consumer.fetch(max_messages=2, max_wait=1)]
    fifth = await stream.get_message(5)
    bounded: list[tuple[str, dict[str, Any]]] = [
        ("by_start_sequence", {"opt_start_seq": 5}),
        ("by_start_time", {"opt_start_time": fifth.time}),
        ("new", {}),
        ("last", {}),
    ]
    for policy, start in bounded:
        consumer = await stream.create_consumer(
            name=policy, durable_name=policy, ack_policy="explicit", deliver_policy=policy, **start
        )
        for seq in (3, 6, None):
            try:
                done = await consumer.reset(seq=seq)
                out[f"{policy}_{seq}"] = done.reset_seq
            except JetStreamError as exc:
                out[f"{policy}_{seq}"] = failure(exc)
    return out


async def manage(js: JetStream, name: str) -> Report:
    """Purge (by subject, keeping some, up to a sequence), message delete (plain and secure),
    consumer update, names, list, pause and resume, delete, and the errors of missing ones."""
    stream = await fill(js, name, 12, ("a", "b", "c"))
    out: Report = {}
    await stream.purge(filter=f"{name}.a")
    out["purge_subject"] = plain((await stream.get_info()).state)
    await stream.purge(filter=f"{name}.b", keep=1)
    out["purge_keep"] = plain((await stream.get_info()).state)
    await stream.delete_message(11)
    await stream.secure_delete_message(8)
    out["deleted"] = plain((await stream.get_info(deleted_details=True)).state)
    for case, step in (("delete_again", stream.delete_message(8)), ("get_deleted", stream.get_message(8))):
        try:
            await step
        except JetStreamError as exc:
            out[case] = failure(exc)
    await stream.create_consumer(name="U", durable_name="U", ack_policy="explicit", description="one")
    updated = await stream.update_consumer(
        name="U", durable_name="U", ack_policy="explicit", description="two"
    )
    out["update"] = plain(updated.info.config)
    try:
        await stream.update_consumer(name="U", durable_name="U", ack_policy="none")
    except JetStreamError as exc:
        out["update_refused"] = failure(exc)
    await stream.create_consumer(name="V", durable_name="V", ack_policy="none")
    out["names"] = sorted([n async for n in js.consumer_names(name)])
    out["listed"] = sorted([i.name async for i in js.list_consumers(name)])
    await stream.pause_consumer("U", 4_102_444_800.0)  # 2100-01-01
    out["paused"] = (await stream.get_consumer_info("U")).paused
    await stream.resume_consumer("U")
    out["resumed"] = (await stream.get_consumer_info("U")).paused
    out["delete_consumer"] = await stream.delete_consumer("V")
    for case, missing in (
        ("info_missing", stream.get_consumer_info("V")),
        ("delete_missing", stream.delete_consumer("V")),
        ("pause_missing", stream.pause_consumer("V", 4_102_444_800.0)),
    ):
        try:
            await missing
        except JetStreamError as exc:
            out[case] = failure(exc)
    await stream.purge(sequence=10)
    out["purge_upto"] = plain((await stream.get_info()).state)
    await stream.purge()
    out["purge_all"] = plain((await stream.get_info()).state)
    return out


CASES = {
    "streams": streams,
    "publish": publish,
    "get": get,
    "fetch": fetch,
    "messages": messages,
    "ordered": ordered,
    "reset": reset,
    "manage": manage,
}


async def main(url: str, stream: str, case: str) -> Report:
    nc: Client = await connect(url)
    try:
        return await CASES[case](new(nc), stream)
    finally:
        await nc.close()


if __name__ == "__main__":
    try:
        report = asyncio.run(main(*sys.argv[1:4]))
    except Exception as exc:
        print(json.dumps({"error": failure(exc)}))
        sys.exit(1)
    print(json.dumps(report))
