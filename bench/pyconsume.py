"""The consumer workloads driven by nats-py instead of nats.js: the client most of jetlake's users
run (and the one the project's own tests use). It does what ``loadgen.mjs`` does in its ``pull`` and
``push`` modes, so the two clients' figures compare: a durable consumer from the stream's first
message, every message acked, the clock stopped when the server's ack floor reaches the last one."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig

Result = dict[str, Any]


async def _consumed(nc: Client, stream: str, name: str, start: float, received: int, last_seq: int) -> Result:
    jsm = nc.jetstream()
    await nc.flush()
    # Polled, as the nats.js mode does: the server's ack floor has no event to wait on.
    while (await jsm.consumer_info(stream, name)).ack_floor.stream_seq < last_seq:  # noqa: ASYNC110
        await asyncio.sleep(0.005)
    secs = time.monotonic() - start
    await jsm.delete_consumer(stream, name)
    return {"messages": received, "seconds": secs, "consumed_per_s": received / secs}


async def _pull(nc: Client, stream: str, count: int, window: int) -> Result:
    js = nc.jetstream()
    name = f"bpull{time.time_ns()}"
    await js.add_consumer(
        stream, ConsumerConfig(durable_name=name, ack_policy=AckPolicy.EXPLICIT, max_ack_pending=-1)
    )
    sub = await js.pull_subscribe_bind(name, stream=stream)
    received = last_seq = 0
    start = time.monotonic()
    while received < count:
        for msg in await sub.fetch(min(window, count - received), timeout=10):
            await msg.ack()
            last_seq = msg.metadata.sequence.stream
            received += 1
    return await _consumed(nc, stream, name, start, received, last_seq)


async def _push(nc: Client, stream: str, count: int, window: int) -> Result:
    js = nc.jetstream()
    name = f"bpush{time.time_ns()}"
    inbox = f"_INBOX.bench.{name}"
    received = last_seq = 0
    finished = asyncio.get_running_loop().create_future()

    async def on_msg(msg: Msg) -> None:
        nonlocal received, last_seq
        if not msg.reply:
            return  # no flow control or heartbeats are asked for
        await nc.publish(msg.reply, b"+ACK")
        last_seq = msg.metadata.sequence.stream
        received += 1
        if received == count:
            finished.set_result(None)

    # Acks are plain publishes to the reply subject, as in the nats.js mode.
    sub = await nc.subscribe(inbox, cb=on_msg, pending_msgs_limit=window * 4)
    await nc.flush()
    start = time.monotonic()
    await js.add_consumer(
        stream,
        ConsumerConfig(
            durable_name=name, deliver_subject=inbox, ack_policy=AckPolicy.EXPLICIT, max_ack_pending=window
        ),
    )
    await finished
    await sub.unsubscribe()
    return await _consumed(nc, stream, name, start, received, last_seq)


async def _run(mode: str, url: str, stream: str, count: int, window: int) -> Result:
    nc = await nats.connect(url, name=f"jetlake-bench-py-{mode}", allow_reconnect=False)
    try:
        return await (_pull if mode == "pull" else _push)(nc, stream, count, window)
    finally:
        await nc.close()


def consume(mode: str, url: str, stream: str, count: int, window: int) -> Result:
    """``mode`` is ``pull`` (fetches of ``window``) or ``push`` (``window`` acks pending at most)."""
    if mode not in ("pull", "push"):
        raise ValueError(f"unknown consume mode {mode!r}")
    return asyncio.run(_run(mode, url, stream, count, window))
