"""Power cuts: ``kill -9`` of the gateway and, at the same moment, the loss of every write that was not
synced, under publish and ack load; then a restart on what the disk kept.

The store root is a FUSE file system (``tests/powercut.py``) that keeps unsynced file data and
directory entries in memory and, at the cut, leaves on its lower directory only what was synced. Per
trial (seeded, at a random moment of the load): publishers with ``Nats-Msg-Id`` (one awaiting each
PubAck, others keeping several publishes in flight) and a pull consumer acking with ``ack_sync``;
then the gateway is killed, the power cut, and the gateway restarted on the lower directory.

With ``sync_interval`` ``always`` (the default): every PubAck'd message is stored under its PubAck's
sequence, none twice, the sequences contiguous; no message whose ``ack_sync`` returned is delivered
again; DuckDB's delta extension reads the tables; the restarted gateway takes publishes and its
consumer drains. With ``sync_interval`` ``1m`` the same cut loses acknowledged messages: the test
that says so is what shows these trials can fail.

``TRIALS`` trials in CI (``POWER_CUT_TRIALS`` for more), each about 10-20 s on a busy 2-core machine.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from tests.harness import Jetlake, duckdb_connection
from tests.powercut import PowerCutMount
from tests.test_crash_matrix import STREAM, Seen, consumer, create_work, drain

TRIALS = int(os.environ.get("POWER_CUT_TRIALS", "10"))
WINDOW = 8  # publishes one pipelined publisher keeps in flight


async def sync_publisher(nc: Client, worker: int, stop: asyncio.Event, seen: Seen) -> None:
    """One publish at a time, each awaited; a failed one is retried with the same ``Nats-Msg-Id``
    until the load stops."""
    js = nc.jetstream()
    i = 0
    while not stop.is_set():
        msg_id = f"s{worker}-{i}"
        try:
            ack = await js.publish(
                f"matrix.{worker}", msg_id.encode(), timeout=1, headers={"Nats-Msg-Id": msg_id}
            )
        except Exception:
            seen.retries += 1
            await asyncio.sleep(0.05)
            continue
        seen.acked[msg_id] = ack.seq
        i += 1


async def pipelined_publisher(nc: Client, worker: int, stop: asyncio.Event, seen: Seen) -> None:
    """``WINDOW`` publishes in flight at a time; those whose PubAck came back count as acked."""
    js = nc.jetstream()
    batch = 0
    while not stop.is_set():
        ids = [f"p{worker}-{batch}-{k}" for k in range(WINDOW)]
        acks = await asyncio.gather(
            *(
                js.publish(f"matrix.p{worker}", i.encode(), timeout=2, headers={"Nats-Msg-Id": i})
                for i in ids
            ),
            return_exceptions=True,
        )
        for msg_id, ack in zip(ids, acks, strict=True):
            if isinstance(ack, BaseException):
                seen.retries += 1
            else:
                seen.acked[msg_id] = ack.seq
        batch += 1


def stored_messages(data_root: Path) -> dict[int, str]:
    """seq -> data of the stream's rows, as DuckDB's delta extension reads the table (empty when the
    cut left no table at all)."""
    if not (data_root / "messages" / "_delta_log").is_dir():
        return {}
    rows = (
        duckdb_connection()
        .execute(
            "SELECT seq, data FROM delta_scan(?) WHERE stream = ? ORDER BY seq",
            [str(data_root / "messages"), STREAM],
        )
        .fetchall()
    )
    stored: dict[int, str] = {}
    for seq, data in rows:
        assert seq not in stored, f"sequence {seq} stored twice"
        stored[seq] = bytes(data).decode()
    return stored


async def load_then_cut(gw: Jetlake, fs: PowerCutMount, rng: random.Random, quiet_s: float) -> Seen:
    """Stream, consumer and load; at a random moment ``kill -9`` and the power cut. With ``quiet_s``
    the load stops first and the cut comes that long after the last acknowledgement."""
    nc = await nats.connect(gw.url, max_reconnect_attempts=-1)
    try:
        await create_work(nc)
        seen = Seen()
        stop = asyncio.Event()
        tasks = [asyncio.create_task(sync_publisher(nc, w, stop, seen)) for w in range(2)]
        tasks += [asyncio.create_task(pipelined_publisher(nc, w, stop, seen)) for w in range(2)]
        tasks.append(asyncio.create_task(consumer(nc, stop, seen, rng)))
        await asyncio.sleep(rng.uniform(1.0, 4.0))
        if quiet_s:
            stop.set()
            await asyncio.gather(*tasks)
            await asyncio.sleep(quiet_s)
        seen.killed_at = time.monotonic()
        await asyncio.to_thread(gw.kill_gateway)
        seen.dead_at = time.monotonic()
        await asyncio.to_thread(fs.cut)
        stop.set()
        await asyncio.gather(*tasks)
        return seen
    finally:
        await nc.close()


def cut_and_restart(
    tmp_path: Path, seed: int, sync_interval: str, quiet_s: float = 0.0
) -> tuple[Jetlake, Seen]:
    """A trial up to the restart on the lower directory; the caller stops the returned gateway."""
    rng = random.Random(seed)
    env = {
        "JETLAKE_ACK_FLUSH_INTERVAL_MS": "50",
        "JETLAKE_SYNC_INTERVAL": sync_interval,
        # index snapshots are written during the load too, so a cut can land on one
        "JETLAKE_INDEX_SNAPSHOT_INTERVAL_MS": "300",
        "JETLAKE_INDEX_SNAPSHOT_MIN_NEW": "300",
    }
    gw = Jetlake(tmp_path)
    fs = PowerCutMount(tmp_path / "lower", gw.data_root, tmp_path / "powercut.log")
    fs.start()
    try:
        gw.start_server()
        gw.start_gateway(env)
        seen = asyncio.run(load_then_cut(gw, fs, rng, quiet_s))
        gw.data_root = fs.lower  # the disk after the power came back
        gw.start_gateway(env)
    except BaseException:
        gw.stop()
        raise
    finally:
        fs.close()
    return gw, seen


async def serve_after_restart(gw: Jetlake, seen: Seen, last: int) -> None:
    """The restarted gateway takes a publish after the last stored sequence, and its consumer
    drains without delivering anything whose ``ack_sync`` returned before the cut."""
    nc = await nats.connect(gw.url)
    try:
        ack = await nc.jetstream().publish("matrix.after", b"after", headers={"Nats-Msg-Id": "after"})
        assert (ack.stream, ack.seq, bool(ack.duplicate)) == (STREAM, last + 1, False)
        info = await drain(nc, seen)
        assert info["ack_floor"]["stream_seq"] == last + 1
    finally:
        await nc.close()


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(TRIALS), ids=lambda t: f"trial-{t}")
def test_power_cut_loses_nothing_acknowledged(tmp_path: Path, trial: int) -> None:
    gw, seen = cut_and_restart(tmp_path, 16_000 + trial, "always")
    try:
        stored = stored_messages(gw.data_root)
        print(
            f"trial {trial + 1}/{TRIALS}: cut after {seen.killed_at - seen.started:.2f} s, "
            f"{len(seen.acked)} PubAck'd, {len(stored)} stored, {len(seen.synced)} ack_synced, "
            f"{seen.retries} failed publishes; kept a checkpoint: "
            f"{(gw.data_root / 'messages' / '_delta_log' / '_last_checkpoint').exists()}, "
            f"an index snapshot: {any((gw.data_root / '_jetlake_index').glob('*.parquet'))}"
        )
        assert seen.acked, "nothing published before the cut"
        assert seen.synced, "nothing acked before the cut"
        # every PubAck'd message under its PubAck's sequence; contiguous; nothing stored twice
        assert {msg_id: stored.get(seq) for msg_id, seq in seen.acked.items()} == {m: m for m in seen.acked}
        assert sorted(stored) == list(range(1, len(stored) + 1))
        assert len(set(stored.values())) == len(stored)
        asyncio.run(serve_after_restart(gw, seen, len(stored)))
        assert seen.violations == [], "messages acked with ack_sync before the cut came back"
    finally:
        gw.stop()


@pytest.mark.slow
def test_a_long_sync_interval_loses_acknowledged_messages_in_a_power_cut(tmp_path: Path) -> None:
    """What JetStream's default risks, shown: the trials above can fail."""
    gw, seen = cut_and_restart(tmp_path, 16_999, "1m")
    try:
        stored = stored_messages(gw.data_root)
        lost = [msg_id for msg_id, seq in seen.acked.items() if stored.get(seq) != msg_id]
        print(f"sync_interval 1m: {len(lost)} of {len(seen.acked)} PubAck'd messages lost")
        assert seen.acked
        assert lost
    finally:
        gw.stop()


@pytest.mark.slow
def test_a_sync_interval_keeps_what_was_acknowledged_an_interval_before_the_cut(tmp_path: Path) -> None:
    """The flusher of a duration ``sync_interval`` syncs what the commits wrote: a cut that comes
    two intervals after the last acknowledgement loses nothing (without the flusher it loses what
    the test above loses; ``sync(2)``, which the flusher once was, does not reach this file system)."""
    gw, seen = cut_and_restart(tmp_path, 16_998, "500ms", quiet_s=1.0)
    try:
        stored = stored_messages(gw.data_root)
        assert seen.acked
        assert {msg_id: stored.get(seq) for msg_id, seq in seen.acked.items()} == {m: m for m in seen.acked}
        asyncio.run(serve_after_restart(gw, seen, len(stored)))
        assert seen.violations == [], "messages acked with ack_sync before the cut came back"
    finally:
        gw.stop()
