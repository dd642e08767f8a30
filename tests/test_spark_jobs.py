"""The maintenance jobs' effect on known tables: sealing keeps every row and merges files; retention
removes exactly what the logical state says is gone; vacuum keeps what readers and writers need.
Every result is read back by Spark (chispa) and by DuckDB's delta extension."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession

from spark_jobs import cli as jobs_cli
from spark_jobs import compaction
from storage_delta.commit.store import StoreRoot, commit_adds, open_existing, write_data_file
from storage_delta.commit.writer import MessageTable, StoredMessage
from storage_delta.format import schema as sch
from storage_delta.maintenance import files as maintenance
from storage_delta.maintenance.files import live_files
from storage_delta.tables.removals import StreamLogicalState
from tests.harness import duckdb_connection

BLOCK = 200
COUNT = 1000
T0 = 1_700_000_000_000_000_000


def _messages(stream: str, first: int, last: int, ts0: int = T0) -> list[StoredMessage]:
    return [
        StoredMessage(stream, BLOCK, s, ts0 + s, f"{stream.lower()}.{s % 4}", None, b"x" * 40 + b"%d" % s)
        for s in range(first, last + 1)
    ]


def build_store(root: Path) -> StoreRoot:
    """Stream A: 1,000 messages in blocks 0-5, 50 per commit (four files per full block). Stream B:
    50 messages. Everything in small commits, as the gateway's group commit leaves it."""
    store = StoreRoot(str(root))
    table = MessageTable(store)
    version = 0
    for first in range(1, COUNT + 1, 50):
        version += 1
        table.commit(_messages("A", first, first + 49), version)
    table.commit(_messages("B", 1, 50), version + 1)
    return store


def _read(spark: SparkSession, store: StoreRoot, stream: str) -> DataFrame:
    return (
        spark.read.format("jetlake")
        .option("root", store.uri)
        .option("stream", stream)
        .option("view", "raw")
        .load()
        .orderBy("seq")
    )


def duckdb_seqs(store: StoreRoot, stream: str) -> list[int]:
    rows = duckdb_connection().execute(
        "SELECT seq FROM delta_scan(?) WHERE stream = ? ORDER BY seq", [store.table_uri(sch.MESSAGES), stream]
    )
    return [r[0] for r in rows.fetchall()]


def _disk_bytes(store: StoreRoot) -> int:
    base = Path(store.table_uri(sch.MESSAGES))
    return sum(p.stat().st_size for p in base.rglob("*.parquet"))


@pytest.mark.spark
def test_seal_merges_full_blocks_and_keeps_every_row(spark: SparkSession, tmp_path: Path) -> None:
    store = build_store(tmp_path)
    before = _read(spark, store, "A").collect()
    out = compaction.seal(spark, store)
    # Blocks 0-4 are full (block 5 holds only seq 1000 and is still being written); B has one block.
    assert (out.files_removed, out.files_added, out.rows_removed) == (24, 5, 0)
    per_block: dict[tuple[str, int], int] = {}
    for f in live_files(store):
        per_block[(f.stream, f.block)] = per_block.get((f.stream, f.block), 0) + 1
    assert per_block == {
        ("A", 0): 1,
        ("A", 1): 1,
        ("A", 2): 1,
        ("A", 3): 1,
        ("A", 4): 1,
        ("A", 5): 1,
        ("B", 0): 1,
    }
    assert_df_equality(
        _read(spark, store, "A"), spark.createDataFrame(before, _read(spark, store, "A").schema)
    )
    assert duckdb_seqs(store, "A") == list(range(1, COUNT + 1))
    # A second run finds nothing to do.
    assert compaction.seal(spark, store).files_removed == 0


@pytest.mark.spark
def test_retention_removes_exactly_what_the_state_hides(spark: SparkSession, tmp_path: Path) -> None:
    store = build_store(tmp_path)
    removed = [(1, 450), (600, 610), (777, 777)]
    # B is not live (deleted); A's removals: a floor at 451 and two interior holes.
    out = compaction.retention(spark, store, lambda _root: {"A": StreamLogicalState("A", 0, removed)})
    keep = [s for s in range(1, COUNT + 1) if not any(a <= s <= b for a, b in removed)]
    assert duckdb_seqs(store, "A") == keep
    assert duckdb_seqs(store, "B") == []
    assert [r.seq for r in _read(spark, store, "A").select("seq").collect()] == keep
    assert out.rows_removed == COUNT - len(keep) + 50
    # Commits of 50 split at block boundaries: blocks 0-1 (9 files), 400, 401-450, 600 and B's file
    # hold nothing visible and go by metadata; 601-650 and 751-799 (block 3) are rewritten into one.
    assert (out.files_removed, out.files_added) == (15, 1)
    assert out.bytes_after < out.bytes_before
    # Nothing left to do, and a later incarnation of A (created after the commit of 901-950)
    # hides everything stored before it.
    assert (
        compaction.retention(
            spark, store, lambda _root: {"A": StreamLogicalState("A", 0, removed)}
        ).files_removed
        == 0
    )
    out = compaction.retention(spark, store, lambda _root: {"A": StreamLogicalState("A", T0 + 951, [])})
    assert duckdb_seqs(store, "A") == list(range(951, COUNT + 1))


@pytest.mark.spark
def test_vacuum_keeps_a_margin_and_never_an_uncommitted_file(spark: SparkSession, tmp_path: Path) -> None:
    store = build_store(tmp_path)
    out = compaction.retention(spark, store, lambda _root: {"A": StreamLogicalState("A", 0, [(1, 600)])})
    on_disk = _disk_bytes(store)
    # Removed files stay for the margin: a reader that planned on an older version still finds them.
    assert maintenance.vacuum(store, margin_hours=1) == []
    assert _disk_bytes(store) == on_disk
    # A concurrent writer's file, written but not yet committed (delta-rs #3645), survives a full
    # vacuum (margin of an hour or more) and a lite one (any margin).
    pending = write_data_file(
        store, sch.MESSAGES, {"stream": "A", "block": "5"}, _table(_messages("A", 1001, 1001))
    )
    assert maintenance.vacuum(store, margin_hours=1) == []
    gone = maintenance.vacuum(store, margin_hours=0)
    assert len(gone) == out.files_removed > 0
    assert _disk_bytes(store) < on_disk
    dt = open_existing(store, sch.MESSAGES)
    assert dt is not None
    commit_adds(dt, [pending], sch.MESSAGE_TABLE_SCHEMA, sch.MESSAGE_PARTITIONS)
    assert duckdb_seqs(store, "A") == list(range(601, COUNT + 2))
    maintenance.checkpoint(store)
    assert any(
        n.endswith(".checkpoint.parquet") for n in os.listdir(Path(store.uri) / "messages" / "_delta_log")
    )
    assert duckdb_seqs(store, "A") == list(range(601, COUNT + 2))


def _table(messages: list[StoredMessage]) -> pa.Table:
    return pa.table(
        {
            "seq": [m.seq for m in messages],
            "ts": [m.ts for m in messages],
            "subject": [m.subject for m in messages],
            "hdrs": pa.array([m.hdrs for m in messages], pa.binary()),
            "data": [m.data for m in messages],
        },
        schema=sch.MESSAGE_FILE_SCHEMA,
    )


def test_schedule_runs_each_job_on_its_interval_and_survives_a_failure() -> None:
    runs: list[str] = []
    stop = threading.Event()

    def run(job: str) -> None:
        runs.append(job)
        if len(runs) > 40:
            stop.set()
        if job == "retention":
            raise RuntimeError("a bad run must not end the schedule")

    timer = threading.Timer(1.5, stop.set)
    timer.start()
    jobs_cli.schedule(run, {"seal": 0.1, "retention": 0.4}, stop)
    timer.cancel()
    # Both run at once at the start, then each on its own interval (generous bounds: shared CPU).
    assert sorted(runs[:2]) == ["retention", "seal"]
    assert runs.count("retention") >= 2
    assert runs.count("seal") > runs.count("retention")


def test_a_run_whose_swap_was_abandoned_plans_again() -> None:
    """A swap abandoned to a racing writer (the gateway compacting the same files) is planned
    again, at most ``REPLANS`` times; the figures add up over the attempts."""
    first = compaction.Outcome(rows_removed=3, files_removed=1, bytes_before=10, bytes_after=9, abandoned=2)
    second = compaction.Outcome(rows_removed=5, files_removed=2, files_added=1, bytes_before=9, bytes_after=4)
    attempts = iter([first, second])
    assert compaction._replanned(lambda: next(attempts)) == compaction.Outcome(
        rows_removed=8, files_removed=3, files_added=1, bytes_before=10, bytes_after=4
    )
    calls = []

    def racing() -> compaction.Outcome:
        calls.append(1)
        return compaction.Outcome(abandoned=1)

    assert compaction._replanned(racing).abandoned == 1
    assert len(calls) == 1 + compaction.REPLANS
