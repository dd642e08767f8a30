"""Structured streaming over a stream: offsets are sequences, micro-batches are bounded by
``max_messages_per_trigger``, a query stopped mid-ingest and restarted from its checkpoint leaves
every message in the sink exactly once, and a running query reads every message once while the
gateway's compaction and the seal, retention and removals jobs rewrite and vacuum files under it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import nats
import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from spark_jobs.cli import run_job
from spark_jobs.datasource import MESSAGE_SCHEMA, JetlakeStreamReader, ReadOptions
from spark_jobs.settings import JobSettings
from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import MessageTable, StoredMessage
from storage_delta.format.schema import DEFAULT_BLOCK_SIZE
from storage_delta.maintenance.files import LiveFile, live_files, rewrite_files, swap_files
from storage_delta.tables.repair import check_at_start
from tests.differential import api
from tests.harness import Jetlake

STREAM = "TICKS"
BLOCK_SIZE = 400
COUNT = 1000
BASE_TS = 1_700_000_000_000_000_000


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """1,000 messages, one per second of stored time, in blocks 0-2, committed 100 at a time."""
    root = str(tmp_path_factory.mktemp("stream-store"))
    table = MessageTable(StoreRoot(root))
    messages = [
        StoredMessage(STREAM, BLOCK_SIZE, s, BASE_TS + s * 1_000_000_000, f"t.{s % 3}", None, b"%d" % s)
        for s in range(1, COUNT + 1)
    ]
    for version, start in enumerate(range(0, COUNT, 100), start=1):
        table.commit(messages[start : start + 100], version)
    return root


def _stream(spark: SparkSession, root: str, stream: str, **options: str) -> DataFrame:
    """``options`` as given; pass ``view="raw"`` for a store without a catalog."""
    reader = spark.readStream.format("jetlake").option("root", root).option("stream", stream)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _available_now(df: DataFrame, name: str, checkpoint: str) -> StreamingQuery:
    """A ``Trigger.AvailableNow`` query of ``df`` into the memory table ``name``."""
    return (
        df.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )


def _batch(spark: SparkSession, root: str, stream: str, **options: str) -> DataFrame:
    reader = spark.read.format("jetlake").option("root", root).option("stream", stream)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _reader(root: str, **options: str) -> JetlakeStreamReader:
    return JetlakeStreamReader(ReadOptions.parse({"root": root, "stream": STREAM, **options}), MESSAGE_SCHEMA)


def test_planner_reads_a_small_micro_batch(store: str) -> None:
    """The rows Spark takes from the planner are the ones the micro-batch's task would read, only
    for the offsets just planned, once; a batch over two blocks, or over ``prefetch_bytes`` of
    files, is left to its tasks."""
    reader = _reader(store, view="raw")
    start, end = {"seq": 401}, {"seq": 451}
    parts = reader.partitions(start, end)
    assert len(parts) == 1
    fetched = reader.getCache(start, end)
    assert fetched is not None
    got = pa.Table.from_batches(list(fetched))
    assert got["seq"].to_pylist() == list(range(401, 451))
    assert got.equals(pa.Table.from_batches(list(reader.read(parts[0]))))
    assert reader.getCache(start, end) is None
    reader.partitions(start, end)
    assert reader.getCache(start, {"seq": 452}) is None
    # Blocks 0 and 1: two tasks.
    assert len(reader.partitions({"seq": 350}, {"seq": 450})) == 2
    assert reader.getCache({"seq": 350}, {"seq": 450}) is None
    for limit in ("0", "1"):
        small = _reader(store, view="raw", prefetch_bytes=limit)
        assert len(small.partitions(start, end)) == 1
        assert small.getCache(start, end) is None


def test_a_compaction_while_a_micro_batch_is_planned_leaves_it_to_the_planner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's compaction swaps the batch's one-message files for a merged one right after
    the planner listed them: the batch is still read by the planner, from the files it planned."""
    root = StoreRoot(str(tmp_path))
    table = MessageTable(root)
    for seq in range(1, 11):
        table.commit([StoredMessage(STREAM, BLOCK_SIZE, seq, BASE_TS + seq, "t.0", None, b"%d" % seq)], seq)
    reader = _reader(str(tmp_path), view="raw")
    listed = reader.store.files
    swapped: list[int] = []

    def list_then_compact(stream: str) -> list[LiveFile]:
        files = listed(stream)
        if not swapped:
            _, merged = rewrite_files(root, STREAM, 0, [f.path for f in files])
            assert merged is not None
            swapped.append(int(swap_files(root, files, [merged], data_change=False)))
        return files

    monkeypatch.setattr(reader.store, "files", list_then_compact)
    start, end = {"seq": 3}, {"seq": 9}
    parts = reader.partitions(start, end)
    assert swapped == [1]
    assert len(live_files(root, STREAM)) == 1
    fetched = reader.getCache(start, end)
    assert fetched is not None
    got = pa.Table.from_batches(list(fetched))
    assert got["seq"].to_pylist() == list(range(3, 9))
    assert got.equals(pa.Table.from_batches(list(reader.read(parts[0]))))


@pytest.mark.spark
def test_available_now_in_bounded_micro_batches(spark: SparkSession, store: str, tmp_path: Path) -> None:
    query = _available_now(
        _stream(spark, store, STREAM, view="raw", max_messages_per_trigger="300"),
        "ticks_bounded",
        str(tmp_path / "ckpt"),
    )
    query.awaitTermination(120)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    # ReadMaxRows(300) from the option: 1,000 sequences take four micro-batches.
    assert sizes == [300, 300, 300, 100]
    last = query.lastProgress
    assert last is not None
    assert json.loads(last["sources"][0]["endOffset"]) == {"seq": COUNT + 1}
    got = spark.table("ticks_bounded")
    assert_df_equality(got.orderBy("seq"), _batch(spark, store, STREAM, view="raw").orderBy("seq"))


@pytest.mark.spark
def test_start_time_and_subject_filter(spark: SparkSession, store: str, tmp_path: Path) -> None:
    # Message s is stored at BASE_TS + s seconds: 12:00:00.5 after second 700 starts at 701.
    start = datetime.fromtimestamp(BASE_TS / 1e9 + 700.5, UTC).replace(tzinfo=None).isoformat()
    query = _available_now(
        _stream(spark, store, STREAM, view="raw", start_time=start, subject="t.1"),
        "ticks_late",
        str(tmp_path / "ckpt"),
    )
    query.awaitTermination(120)
    seqs = [r.seq for r in spark.table("ticks_late").orderBy("seq").collect()]
    assert seqs == [s for s in range(701, COUNT + 1) if s % 3 == 1]
    batch = _batch(spark, store, STREAM, view="raw", start_time=start + "+00:00", subject="t.1")
    assert [r.seq for r in batch.orderBy("seq").collect()] == seqs


async def _publish(url: str, stream: str, enough: asyncio.Event) -> int:
    """Publishes rounds of 50 until told it is enough; returns how many were acknowledged."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    sent = 0
    try:
        while not enough.is_set():
            await asyncio.gather(
                *[js.publish(f"{stream}.{i % 5}", b"m-%d" % i) for i in range(sent, sent + 50)]
            )
            sent += 50
            await asyncio.sleep(0.05)
    finally:
        await nc.close()
    return sent


def _wait_for_progress(query: StreamingQuery, rows: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while sum(p["numInputRows"] for p in query.recentProgress) < rows:
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, "the query made no progress"
        time.sleep(0.2)


@pytest.mark.spark
@pytest.mark.slow
async def test_restart_during_ingest_is_exactly_once(
    spark: SparkSession, jetlake: Jetlake, unique: str, tmp_path: Path
) -> None:
    nc = await nats.connect(jetlake.url)
    try:
        await nc.jetstream().add_stream(name=unique, subjects=[f"{unique}.>"])
    finally:
        await nc.close()
    sink, ckpt = tmp_path / "sink", tmp_path / "ckpt"

    def start() -> StreamingQuery:
        return (
            _stream(spark, str(jetlake.data_root), unique, max_messages_per_trigger="400")
            .writeStream.format("parquet")
            .option("path", str(sink))
            .option("checkpointLocation", str(ckpt))
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    enough = asyncio.Event()
    publisher = asyncio.create_task(_publish(jetlake.url, unique, enough))
    try:
        first = await asyncio.to_thread(start)
        await asyncio.to_thread(_wait_for_progress, first, 300)
        # Stopped while messages keep arriving, possibly in the middle of a micro-batch.
        await asyncio.to_thread(first.stop)
        second = await asyncio.to_thread(start)
        await asyncio.to_thread(_wait_for_progress, second, 300)
        enough.set()
        total = await publisher
        await asyncio.to_thread(second.processAllAvailable)
        await asyncio.to_thread(second.stop)
    finally:
        enough.set()
        if not publisher.done():
            publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await publisher
    rows = spark.read.parquet(str(sink)).select("seq", "subject", "data").collect()
    seqs = sorted(r.seq for r in rows)
    assert seqs == list(range(1, total + 1)), "a gap or a duplicate in the sink"
    # Sequences follow publish order within each gather round only, so check the set of payloads.
    assert sorted(bytes(r.data) for r in rows) == sorted(b"m-%d" % i for i in range(total))


def _blocks(root: str, stream: str) -> dict[int, int]:
    """Live files per block."""
    out: dict[int, int] = {}
    for f in live_files(StoreRoot(root), stream):
        out[f.block] = out.get(f.block, 0) + 1
    return out


@pytest.mark.spark
@pytest.mark.slow
async def test_rewrites_and_vacuum_beneath_a_running_query(
    spark: SparkSession, jetlake: Jetlake, unique: str, tmp_path: Path
) -> None:
    """The stream starts 300 sequences below its second block, so block 0 fills and is sealed while
    the query runs; one message per commit gives the gateway's continuous compaction runs of small
    files to merge; three deleted messages give the retention job a block to rewrite. The jobs run
    as ``jetlake jobs run`` runs them (each followed by a vacuum with the margin and a checkpoint),
    round after round, while messages keep arriving and the query, held to 25 sequences a trigger,
    plans and reads behind them. Its output is the stream: every message once, none of the deleted,
    and the query never failed on a file that was rewritten away."""
    root = str(jetlake.data_root)
    first = DEFAULT_BLOCK_SIZE - 300
    total = 600
    deleted = {first + 10, first + 20, first + 100}
    seen: list[tuple[int, bytes]] = []

    def on_batch(df: DataFrame, _batch: int) -> None:
        seen.extend((r.seq, bytes(r.data)) for r in df.select("seq", "data").collect())

    nc = await nats.connect(jetlake.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=unique, subjects=[f"{unique}.>"], first_seq=first)

        async def publish(n: int) -> None:
            for _ in range(n):  # one commit each
                await js.publish(f"{unique}.x", b"m", timeout=30)

        await publish(150)
        for s in sorted(deleted):
            assert (await api(nc, f"STREAM.MSG.DELETE.{unique}", {"seq": s}))["success"]
        query = await asyncio.to_thread(
            lambda: (
                _stream(spark, root, unique, max_messages_per_trigger="25")
                .writeStream.foreachBatch(on_batch)
                .option("checkpointLocation", str(tmp_path / "ckpt"))
                .trigger(processingTime="50 milliseconds")
                .start()
            )
        )
        publisher = asyncio.create_task(publish(total - 150))
        settings = JobSettings(data_root=root, vacuum_margin_hours=1)
        rounds = 0
        try:
            while not publisher.done() or rounds < 2:
                for job in ("seal", "retention", "removals"):
                    await asyncio.to_thread(run_job, spark, job, settings)
                rounds += 1
                assert query.isActive, query.exception()
            await publisher
            await asyncio.to_thread(query.processAllAvailable)
        finally:
            if not publisher.done():
                publisher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await publisher
            await asyncio.to_thread(query.stop)
        assert query.exception() is None
    finally:
        await nc.close()

    expected = [s for s in range(first, first + total) if s not in deleted]
    assert sorted(seq for seq, _ in seen) == expected, "a gap or a duplicate in the query's output"
    assert all(data == b"m" for _, data in seen)
    # The rewrites happened: block 0 is sealed into one file without the deleted rows, and the
    # gateway merged block 1's one-message commits.
    blocks = _blocks(root, unique)
    assert blocks[0] == 1
    assert blocks[1] < total - 300
    raw = _batch(spark, root, unique, view="raw").select("seq").collect()
    assert sorted(r.seq for r in raw) == expected


@pytest.mark.spark
def test_a_running_query_and_its_restart_survive_log_trims(spark: SparkSession, tmp_path: Path) -> None:
    """A stream written one message per commit whose log is checkpointed every 10 commits and
    trimmed to the newest checkpoint each time (``log_retention_s`` 0, #22): a query that runs
    while the log is trimmed under it, then is stopped, and restarted from its checkpoint after
    the log lost every entry it had seen, has each message once."""
    root = StoreRoot(str(tmp_path / "store"), fsync=False, log_retention_s=0.0)  # no power cut here
    table = MessageTable(root, checkpoint_every=10**9)
    written = 0

    def write(count: int) -> None:
        nonlocal written
        for _ in range(count):
            written += 1
            table.commit(
                [StoredMessage("TRIM", BLOCK_SIZE, written, BASE_TS + written, "t.x", None, b"x")], written
            )
            if written % 10 == 0:  # the writer's checkpoint and trim, here one after another
                table._appender.hygiene()

    sink, ckpt = tmp_path / "sink", tmp_path / "ckpt"

    def start() -> StreamingQuery:
        return (
            _stream(spark, root.uri, "TRIM", view="raw", max_messages_per_trigger="50")
            .writeStream.format("parquet")
            .option("path", str(sink))
            .option("checkpointLocation", str(ckpt))
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    write(60)
    first = start()
    _wait_for_progress(first, 50)
    write(60)
    _wait_for_progress(first, 120)
    first.stop()
    write(60)
    log_dir = tmp_path / "store" / "messages" / "_delta_log"
    assert min(int(n[:20]) for n in os.listdir(log_dir) if n[:20].isdigit()) >= 170
    second = start()
    second.processAllAvailable()
    second.stop()
    seqs = sorted(r.seq for r in spark.read.parquet(str(sink)).select("seq").collect())
    assert seqs == list(range(1, 181))


@pytest.fixture
def set_aside(tmp_path: Path) -> tuple[str, range]:
    """A store whose ``messages`` entry of version 2 (sequences 101-200 of ``TICKS``) lost its
    ``add`` line past the stream's name and its file: the gateway's start check sets it aside
    (rewritten without the line, the marker taking ``TICKS`` offline), so every Delta reader now
    reads ``TICKS`` with a hole. ``OTHER`` is whole."""
    root = str(tmp_path / "store")
    table = MessageTable(StoreRoot(root))
    for version in range(1, 4):
        seqs = range(100 * (version - 1) + 1, 100 * version + 1)
        table.commit(
            [StoredMessage(STREAM, BLOCK_SIZE, s, BASE_TS + s, "t.x", None, b"%d" % s) for s in seqs], version
        )
    table.commit(
        [StoredMessage("OTHER", BLOCK_SIZE, s, BASE_TS + s, "o.x", None, b"o") for s in range(1, 11)], 4
    )
    entry = Path(root) / "messages" / "_delta_log" / f"{2:020d}.json"
    body = entry.read_bytes()
    start = body.index(b'{"add":{"path":"')
    path = body[start + len(b'{"add":{"path":"') :].split(b'"', 1)[0].decode()
    entry.write_bytes(body[: start + len(f'{{"add":{{"path":"stream={STREAM}/')])
    (Path(root) / "messages" / path).unlink()
    check = check_at_start(StoreRoot(root))
    assert [scope.names(STREAM) for scope, _ in check.offline] == [True]
    return root, range(101, 201)


@pytest.mark.spark
def test_a_stream_offline_for_damage_is_not_read_unless_asked(
    spark: SparkSession, set_aside: tuple[str, range], tmp_path: Path
) -> None:
    """A stream the gateway took offline for a set-aside log entry (its rows may be missing
    without a word) fails a batch read and a streaming query with an error naming it and
    ``jetlake repair``; other streams read as before; ``read_offline`` reads what is left."""
    root, lost = set_aside
    says = rf"stream {STREAM} is offline: .*_delta_log/{2:020d}\.json.*jetlake repair.*read_offline"
    with pytest.raises(Exception, match=says):
        _batch(spark, root, STREAM, view="raw").count()
    assert _batch(spark, root, "OTHER", view="raw").count() == 10
    query = _available_now(
        _stream(spark, root, STREAM, view="raw"), "offline_refused", str(tmp_path / "refused")
    )
    with pytest.raises(Exception, match=says):
        query.awaitTermination(120)
    kept = [s for s in range(1, 301) if s not in lost]
    batch = _batch(spark, root, STREAM, view="raw", read_offline="true")
    assert [r.seq for r in batch.orderBy("seq").collect()] == kept
    query = _available_now(
        _stream(spark, root, STREAM, view="raw", read_offline="true"), "offline_read", str(tmp_path / "read")
    )
    query.awaitTermination(120)
    assert [r.seq for r in spark.table("offline_read").orderBy("seq").collect()] == kept
