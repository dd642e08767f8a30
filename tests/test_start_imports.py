"""What a gateway loads matters to its restart: the time from ``kill -9`` to the first answer is
mostly the new process's imports on a loaded machine (#22). pandas alone took half a second to a
second of it, pulled in by ``pyarrow.dataset`` (filtered parquet reads, ``pq.read_table``), though
the gateway never makes a DataFrame. This checks the process itself, through the shared objects it
has mapped, after it served what a start and a client touch: catalog, ack log and removal log
loads, index snapshot, recovery from the files, compaction, reads by sequence, by time and by
subject, and headers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from tests.harness import Jetlake, serving
from tests.test_small_files import EAGER


@pytest.fixture
def eager(tmp_path: Path) -> Iterator[Jetlake]:
    target = Jetlake(tmp_path)
    target.gateway_env = dict(EAGER)
    yield from serving(target)


def _mapped(jetlake: Jetlake) -> str:
    assert jetlake.gateway is not None
    assert jetlake.gateway.poll() is None
    return Path(f"/proc/{jetlake.gateway.pid}/maps").read_text()


async def _use(jetlake: Jetlake, name: str) -> int:
    """Publishes (some with headers), a purge of one subject, a consumer's fetch and acks, reads by
    sequence, by subject and by time; returns the stream's message count."""
    nc = await nats.connect(jetlake.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=name, subjects=[f"{name.lower()}.>"], max_msgs_per_subject=50)
        for i in range(60):
            await js.publish(f"{name.lower()}.s{i % 3}", b"m%d" % i, headers={"K": str(i)} if i % 4 else None)
        await js.purge_stream(name, subject=f"{name.lower()}.s2")
        await js.add_consumer(name, ConsumerConfig(durable_name="C", ack_policy=AckPolicy.EXPLICIT))
        sub = await js.pull_subscribe_bind("C", stream=name)
        for msg in await sub.fetch(10, timeout=10):
            await msg.ack_sync()
        assert (await js.get_msg(name, 5)).data == b"m4"
        assert (await js.get_last_msg(name, f"{name.lower()}.s1")).data == b"m58"
        first = await js.get_msg(name, 1)
        by_time = await js.add_consumer(
            name,
            ConsumerConfig(
                ack_policy=AckPolicy.NONE,
                deliver_policy=DeliverPolicy.BY_START_TIME,
                opt_start_time=first.time,
            ),
        )
        assert by_time.num_pending == 40
        return int((await js.stream_info(name)).state.messages)
    finally:
        await nc.close()


async def test_a_gateway_serves_and_restarts_without_importing_pandas(eager: Jetlake, unique: str) -> None:
    count = await _use(eager, unique)
    assert count == 40
    assert "pandas" not in _mapped(eager)
    eager.kill_gateway()
    await asyncio.to_thread(eager.start_gateway)
    nc = await nats.connect(eager.url)
    try:
        info = await nc.jetstream().stream_info(unique)
        assert info.state.messages == count
        assert (await nc.jetstream().get_msg(unique, 59)).data == b"m58"
    finally:
        await nc.close()
    await asyncio.sleep(0.5)  # a compaction round or two over the restarted stream
    maps = _mapped(eager)
    assert "pyarrow" in maps  # the check sees the gateway's libraries at all
    assert "pandas" not in maps
