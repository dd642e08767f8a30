"""Index snapshots (storage_delta/index_snapshot.py): a restart that reads a stream's snapshot and
only the message files above it rebuilds exactly the stream a scan of every file rebuilds, also
after ``kill -9`` while publishes, deletes and snapshots run; a snapshot of another incarnation or
an unreadable one is ignored."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import nats
import numpy as np
import pyarrow.parquet as pq
import pytest
from nats.aio.client import Client

from gateway.adapters.ack_recorder import AckRecorder
from gateway.adapters.registry import Registry
from gateway.adapters.removals import RemovalRecorder
from gateway.adapters.snapshots import Snapshots
from gateway.api.configs import StreamConfig
from gateway.engine.stream import Stream
from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import MessageTable
from storage_delta.format.schema import FILE_RECORD
from storage_delta.maintenance.files import live_files
from storage_delta.read import index_snapshot
from storage_delta.read.index_snapshot import IndexSnapshot
from storage_delta.read.reader import MessageReader
from storage_delta.tables.acklog import AckLogTable, AckLogWriter
from storage_delta.tables.catalog import CatalogTable
from storage_delta.tables.removals import RemovalLog, load_stream_states
from tests.harness import Jetlake

CREATED = 1_700_000_000_000_000_000


def filled(messages: int = 200) -> Stream:
    """A stream with committed messages on a few subjects and holes (a delete, a subject purge)."""
    stream = Stream(StreamConfig("S", subjects=("s.>",)), CREATED, 1 << 20)
    for i in range(messages):
        msg = stream.accept(
            f"s.{i % 5}", b"NATS/1.0\r\nA: b\r\n\r\n" if i % 7 == 0 else None, b"x" * i, CREATED
        )
        stream.committed(msg.seq)
    stream.remove(3)
    stream.purge("s.2", seq=100)
    return stream


def test_a_stream_restored_from_its_snapshot_is_the_same_stream(tmp_path: Path) -> None:
    root = StoreRoot(str(tmp_path))
    stream = filled()
    stream.accept("s.9", None, b"not committed", CREATED)  # beyond the snapshot: left out
    through, stored = stream.stored_snapshot()
    assert through == 200
    index_snapshot.write(root, "S", IndexSnapshot(CREATED, through, stored))
    back = index_snapshot.read(root, "S", CREATED)
    assert back is not None
    assert back.through == 200
    again = Stream(stream.config, CREATED, 1 << 20)
    again.restore_stored(back.index)
    stream.rollback()  # the uncommitted message goes: what was durable is what comes back
    assert again.info_state(0, ">", deleted_details=True) == stream.info_state(0, ">", deleted_details=True)
    assert [again.last_seq_for(f"s.{i}") for i in range(5)] == [
        stream.last_seq_for(f"s.{i}") for i in range(5)
    ]
    # another incarnation of the name, an unreadable file, a deleted stream: no snapshot
    assert index_snapshot.read(root, "S", CREATED + 1) is None
    path = tmp_path / index_snapshot.DIR / "S.parquet"
    # a value changed where parquet's checks pass it (the metadata pyarrow reads): its digest fails
    table = pq.read_table(path)
    meta = {**(table.schema.metadata or {}), b"jetlake.through": b"190"}
    pq.write_table(table.replace_schema_metadata(meta), path)
    with pytest.raises(index_snapshot.DamagedSnapshot, match="digest"):
        index_snapshot.read(root, "S", CREATED)
    index_snapshot.write(root, "S", IndexSnapshot(CREATED, through, stored))
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(index_snapshot.DamagedSnapshot, match="unreadable"):
        index_snapshot.read(root, "S", CREATED)
    index_snapshot.remove_others(root, {"OTHER"})
    assert not path.exists()


def test_load_index_reads_no_file_the_snapshot_covers(tmp_path: Path) -> None:
    """The snapshot replaces the files below it: with them deleted from disk the index is the same
    as a full scan's (a read of any of them would fail)."""
    root = StoreRoot(str(tmp_path))
    stream = Stream(StreamConfig("S", subjects=("s.>",)), CREATED, 1 << 20)
    table = MessageTable(root)
    for version in range(1, 11):  # ten commit files of 20 messages
        batch = [stream.accept(f"s.{i % 3}", None, b"p%d" % i, CREATED + i) for i in range(20)]
        table.commit(batch, version)
        stream.committed(batch[-1].seq)
        if version == 6:
            through, stored = stream.stored_snapshot()
            index_snapshot.write(root, "S", IndexSnapshot(CREATED, through, stored))
    table.close()
    full = MessageReader(root).stored_index("S", CREATED)
    for f in live_files(root, "S"):
        if f.max_seq is not None and f.max_seq <= 120:
            os.remove(tmp_path / "messages" / f.path)
    index, through, damage = index_snapshot.load_index(
        root, MessageReader(root), "S", CREATED, CREATED, FILE_RECORD
    )
    assert through == 120
    assert damage is None
    for name in ("seq", "ts", "size"):
        assert np.array_equal(getattr(index, name), getattr(full, name)), name
    assert [index.subjects[c] for c in index.subject_codes] == [full.subjects[c] for c in full.subject_codes]


async def _api(nc: Client, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    msg = await nc.request(f"$JS.API.{subject}", json.dumps(body or {}).encode(), timeout=10)
    answer: dict[str, Any] = json.loads(msg.data)
    return answer


async def _load(url: str, first: int, count: int, deletes: list[int]) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for i in range(first, first + count):
            headers = {"Nats-Msg-Id": f"id-{i}"} if i % 3 == 0 else None
            await js.publish(f"snap.s{i % 8}", b"m%d" % i, headers=headers)
        for seq in deletes:
            assert (await _api(nc, "STREAM.MSG.DELETE.SNAP", {"seq": seq}))["success"]
    finally:
        await nc.close()


async def _view(url: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    try:
        info = await _api(nc, "STREAM.INFO.SNAP", {"subjects_filter": ">", "deleted_details": True})
        lasts = [await _api(nc, "STREAM.MSG.GET.SNAP", {"last_by_subj": f"snap.s{i}"}) for i in range(8)]
        dup = await nc.jetstream().publish("snap.s0", b"again", headers={"Nats-Msg-Id": "id-597"})
    finally:
        await nc.close()
    return {"state": info["state"], "lasts": lasts, "duplicate": (dup.seq, dup.duplicate)}


def _with_snap_stream(tmp_path: Path, interval_ms: int) -> tuple[Jetlake, StoreRoot]:
    """A started jetlake whose snapshot rounds are ``interval_ms`` apart (due from 50 new
    messages), with the stream ``SNAP`` created; the caller stops it."""
    gw = Jetlake(tmp_path)
    gw.gateway_env = {
        "JETLAKE_INDEX_SNAPSHOT_INTERVAL_MS": str(interval_ms),
        "JETLAKE_INDEX_SNAPSHOT_MIN_NEW": "50",
    }
    gw.start()

    async def create() -> None:
        nc = await nats.connect(gw.url)
        try:
            await nc.jetstream().add_stream(name="SNAP", subjects=["snap.>"], max_msgs_per_subject=60)
        finally:
            await nc.close()

    try:
        asyncio.run(create())
    except BaseException:
        gw.stop()
        raise
    return gw, StoreRoot(str(gw.data_root))


@pytest.mark.waits
def test_recovery_from_a_snapshot_equals_a_full_scan_after_kill_9(tmp_path: Path) -> None:
    gw, root = _with_snap_stream(tmp_path, interval_ms=100)
    try:
        asyncio.run(_load(gw.url, 0, 400, [5, 17, 390]))
        created = next(int(e.body["created"]) for e in CatalogTable(root).load() if e.name == "SNAP")
        for _ in range(100):  # the snapshot task runs every 100 ms
            snap = index_snapshot.read(root, "SNAP", created)
            if snap is not None and snap.through >= 300:
                break
            asyncio.run(asyncio.sleep(0.1))
        assert snap is not None
        assert snap.through >= 300
        asyncio.run(_load(gw.url, 400, 200, [410]))  # the tail above the snapshot, and a delete in it
        gw.kill_gateway()
        snap = index_snapshot.read(root, "SNAP", created)
        assert snap is not None
        assert snap.through < 600  # the restart must read a tail

        gw.start_gateway()
        from_snapshot = asyncio.run(_view(gw.url))
        gw.kill_gateway()
        shutil.rmtree(gw.data_root / index_snapshot.DIR)
        gw.start_gateway()
        from_files = asyncio.run(_view(gw.url))
        assert from_snapshot == from_files
        state = from_files["state"]
        assert {390, 410} <= set(state["deleted"])  # 5 and 17 are below the first sequence by now
        assert from_files["duplicate"] == (597 + 1, True)  # id-597 was stored as sequence 598
        removed = load_stream_states(root)["SNAP"]  # what the snapshot showed was durable there
        assert all(removed.is_removed(s) for s in (5, 17, 390, 410))

        gw.stop_gateway()  # a clean stop snapshots everything
        snap = index_snapshot.read(root, "SNAP", created)
        assert snap is not None
        assert snap.through == state["last_seq"]
    finally:
        gw.stop()


class Subjects:
    """The subjects the registry listens to, without a leaf link."""

    def __init__(self) -> None:
        self.live: set[str] = set()

    def subscribe(self, subject: str) -> None:
        self.live.add(subject)

    def unsubscribe(self, subject: str) -> None:
        self.live.discard(subject)


async def test_a_snapshot_shows_no_removal_the_removal_log_lacks(tmp_path: Path) -> None:
    """Removals made in memory and not yet recorded (limits, TTLs, acked work-queue messages are
    recorded within seconds) are made durable before a snapshot that shows them is written: a
    snapshot never knows of a removal that the tables (and Spark) do not."""
    root = StoreRoot(str(tmp_path))
    executor = ThreadPoolExecutor(2)
    try:
        acks = AckRecorder(AckLogWriter(AckLogTable(root), executor, 0, 0.1, 1000, 0))
        subjects = Subjects()
        registry = Registry(CatalogTable(root), executor, 1 << 20, acks, subjects)
        await registry.start()
        stream = await registry.add_stream(StreamConfig("S", subjects=("s.>",)), CREATED)
        assert subjects.live == {"s.>"}  # the registry listens to a stream's subjects
        for i in range(100):
            stream.committed(stream.accept(f"s.{i % 4}", None, b"x", CREATED + i).seq)
        stream.remove(10)
        stream.purge("s.1", seq=50)
        assert load_stream_states(root)["S"].removed == []  # nothing recorded yet
        snapshots = Snapshots(
            registry, RemovalRecorder(registry, RemovalLog(root), executor), root, executor, 1, 1
        )
        assert await snapshots.take() == 1
        assert await snapshots.take() == 0  # nothing new since
        snap = index_snapshot.read(root, "S", CREATED)
        assert snap is not None
        holes = set(range(1, snap.through + 1)) - set(snap.index.seq.tolist())
        assert holes == {10} | set(range(2, 50, 4))
        removed = load_stream_states(root)["S"]
        assert all(removed.is_removed(s) for s in holes)
        await registry.close()
    finally:
        executor.shutdown()


async def test_a_long_stream_is_due_after_min_new_messages_not_a_share_of_it(tmp_path: Path) -> None:
    """A snapshot is due once ``min_new`` messages were committed since the last, however long the
    stream: what a restart after ``kill -9`` reads beyond its snapshot stays bounded by ``min_new``
    (a quarter of a 1M-message stream was 250,000 messages to read again)."""
    root = StoreRoot(str(tmp_path))
    executor = ThreadPoolExecutor(2)
    try:
        acks = AckRecorder(AckLogWriter(AckLogTable(root), executor, 0, 0.1, 1000, 0))
        registry = Registry(CatalogTable(root), executor, 1 << 20, acks, Subjects())
        await registry.start()
        stream = await registry.add_stream(StreamConfig("S", subjects=("s.>",)), CREATED)
        recorder = RemovalRecorder(registry, RemovalLog(root), executor)
        snapshots = Snapshots(registry, recorder, root, executor, 1, 100)
        for i in range(10_000):
            stream.committed(stream.accept("s.x", None, b"x", CREATED + i).seq)
        assert await snapshots.take() == 1
        for i in range(99):
            stream.committed(stream.accept("s.x", None, b"x", CREATED + i).seq)
        assert await snapshots.take() == 0
        stream.committed(stream.accept("s.x", None, b"x", CREATED).seq)
        assert await snapshots.take() == 1  # 100 new of 10,100: due
        snap = index_snapshot.read(root, "S", CREATED)
        assert snap is not None
        assert snap.through == 10_100
        await registry.close()
    finally:
        executor.shutdown()


@pytest.mark.waits
def test_a_start_that_read_many_messages_from_the_files_writes_their_snapshot_at_once(tmp_path: Path) -> None:
    """Rounds an hour apart: the gateway killed before its first writes no snapshot; the next start
    reads the 200 messages from the files and writes their snapshot right away, so a third start
    would not read them again (without the start's round: none for an hour)."""
    gw, root = _with_snap_stream(tmp_path, interval_ms=3_600_000)
    try:
        asyncio.run(_load(gw.url, 0, 200, []))
        created = next(int(e.body["created"]) for e in CatalogTable(root).load() if e.name == "SNAP")
        gw.kill_gateway()
        assert index_snapshot.read(root, "SNAP", created) is None
        gw.start_gateway()
        snap = None
        for _ in range(100):
            snap = index_snapshot.read(root, "SNAP", created)
            if snap is not None:
                break
            asyncio.run(asyncio.sleep(0.1))
        assert snap is not None
        assert snap.through == 200
    finally:
        gw.stop()
