"""The delta-rs hazards the writer is built around, each provoked for real on a real table."""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from deltalake.transaction import RemoveAction

from storage_delta.commit import store as tables
from storage_delta.commit.deltalog import ConcurrentRemoval, LocalLogEntries, LogAppender, commit_path
from storage_delta.commit.store import StoreRoot, write_data_file
from storage_delta.commit.writer import APP_ID, GroupCommitWriter, MessageTable, StoredMessage
from storage_delta.format import schema as sch
from storage_delta.format.integrity import scan_log
from storage_delta.maintenance.files import live_files, swap_files
from storage_delta.maintenance.seal import seal_stream
from storage_delta.maintenance.vacuum import vacuum
from tests.harness import duckdb_connection


def message(stream: str, seq: int) -> StoredMessage:
    return StoredMessage(
        stream, 10, seq, 1_700_000_000_000_000_000 + seq, f"{stream.lower()}.x", None, b"m%d" % seq
    )


def seqs_in_table(root: StoreRoot) -> dict[str, list[int]]:
    rows = (
        duckdb_connection()
        .execute("SELECT stream, seq FROM delta_scan(?) ORDER BY stream, seq", [f"{root.uri}/{sch.MESSAGES}"])
        .fetchall()
    )
    out: dict[str, list[int]] = {}
    for stream, seq in rows:
        out.setdefault(stream, []).append(seq)
    return out


def log_dir(root: StoreRoot) -> str:
    return f"{root.uri}/{sch.MESSAGES}/_delta_log"


@pytest.fixture
def root(tmp_path: Path) -> StoreRoot:
    return StoreRoot(str(tmp_path / "root"))


def test_appends_never_replay_the_log(root: StoreRoot) -> None:
    """delta-rs #3410: ``write_deltalake`` replays the whole log on every call. The hot path reads
    no log at all: with an old commit file made unreadable, appends still commit."""
    table = MessageTable(root)
    table.commit([message("S", 1)], 1)
    table.commit([message("S", 2)], 2)
    first = commit_path(log_dir(root), 1)
    original = Path(first).read_bytes()
    Path(first).write_bytes(b"{not json")
    for seq in range(3, 6):
        table.commit([message("S", seq)], seq)
    Path(first).write_bytes(original)
    table.close()
    assert seqs_in_table(root) == {"S": [1, 2, 3, 4, 5]}


def test_append_after_a_removal_in_another_partition(root: StoreRoot) -> None:
    """delta-rs #3890: an append conflicts with a concurrent ``remove`` even in another partition.
    Here a sealing of stream B (removes + add through delta-rs) lands between two appends of stream
    A through a writer that has not seen it: the append goes to the next version, stored once."""
    table = MessageTable(root)
    for seq in range(1, 4):
        table.commit([message("A", seq), message("B", seq)], seq)
    assert seal_stream(root, "B") == 1  # another writer's commit the appender knows nothing about
    version_before = len([f for f in os.listdir(log_dir(root)) if f.endswith(".json")])
    table.commit([message("A", 4)], 4)
    table.close()
    assert seqs_in_table(root) == {"A": [1, 2, 3, 4], "B": [1, 2, 3]}
    assert len([f for f in os.listdir(log_dir(root)) if f.endswith(".json")]) == version_before + 1
    assert MessageTable(root).last_txn_version() == 4


def test_swap_wins_over_appends_it_has_not_seen(root: StoreRoot) -> None:
    """delta-rs #3890 the other way round: through delta-rs a job's swap conflicts with every append
    that landed after its snapshot, so under steady ingest it never commits. jetlake's swap checks
    only what can conflict: appends of other files landed since its snapshot, and it commits after
    them, reading no table state; the appended rows stay, the swapped ones are gone."""
    table = MessageTable(root)
    for seq in range(1, 4):
        table.commit([message("S", seq)], seq)
    snapshot = len([f for f in os.listdir(log_dir(root)) if f.endswith(".json")])
    stale = live_files(root, "S")
    for seq in range(4, 9):  # the gateway keeps appending after the job's snapshot
        table.commit([message("S", seq), message("T", seq)], seq)
    removes = [
        RemoveAction(f.log_path, True, 0, f.size, {"stream": f.stream, "block": str(f.block)})
        for f in stale
        if f.max_seq is not None and f.max_seq <= 2
    ]
    swapper = LogAppender(LocalLogEntries(f"{root.uri}/{sch.MESSAGES}"), next_version=snapshot)
    assert swapper.swap(removes, [], "DELETE") == snapshot + 5
    table.commit([message("S", 9)], 9)  # and the gateway's next append follows the swap
    table.close()
    assert seqs_in_table(root) == {"S": [3, 4, 5, 6, 7, 8, 9], "T": [4, 5, 6, 7, 8]}


def test_swap_of_files_another_job_removed_commits_nothing(root: StoreRoot) -> None:
    """Two jobs planned on the same files: the second swap finds the first one's removal among the
    commits since its snapshot and gives up, so no file is removed twice and no rows come back."""
    table = MessageTable(root)
    for seq in range(1, 5):
        table.commit([message("S", seq)], seq)
    files = sorted(live_files(root, "S"), key=lambda f: f.min_seq or 0)
    snapshot = len([f for f in os.listdir(log_dir(root)) if f.endswith(".json")])
    assert swap_files(root, files[:2], [], data_change=True)
    table.commit([message("S", 5)], 5)
    removes = [
        RemoveAction(f.log_path, True, 0, f.size, {"stream": f.stream, "block": str(f.block)})
        for f in files[1:3]
    ]
    stale = LogAppender(LocalLogEntries(f"{root.uri}/{sch.MESSAGES}"), next_version=snapshot)
    with pytest.raises(ConcurrentRemoval):
        stale.swap(removes, [], "DELETE")
    assert not swap_files(root, files[1:3], [], data_change=True)
    table.close()
    assert seqs_in_table(root) == {"S": [3, 4, 5]}


def test_retry_of_a_commit_that_landed_writes_nothing(root: StoreRoot) -> None:
    """delta-rs #2509: a commit can report an error and still land. The retry carries the same txn
    version; finding it in the log, it writes nothing more."""
    table = MessageTable(root)
    table.commit([message("S", 1)], 1)
    rows = pa.table(
        {"seq": [2], "ts": [2], "subject": ["s.x"], "hdrs": pa.array([None], pa.binary()), "data": [b"m"]},
        schema=sch.MESSAGE_FILE_SCHEMA,
    )
    add = write_data_file(root, sch.MESSAGES, {"stream": "S", "block": "0"}, rows)
    appender = LogAppender(LocalLogEntries(f"{root.uri}/{sch.MESSAGES}"), next_version=2)
    assert appender.append([add], (APP_ID, 2)) == 2
    files = sorted(os.listdir(log_dir(root)))
    # the retry, by a writer that did not learn that version 2 landed
    stale = LogAppender(LocalLogEntries(f"{root.uri}/{sch.MESSAGES}"), next_version=2)
    assert stale.append([add], (APP_ID, 2)) == 2
    assert sorted(os.listdir(log_dir(root))) == files
    table.close()
    assert seqs_in_table(root) == {"S": [1, 2]}


class FailsAfterLanding(MessageTable):
    """A real table whose commit raises once after the commit has landed (an error on the way back)."""

    failed = False

    def commit(self, batch: list[StoredMessage], version: int) -> frozenset[str]:
        fenced = super().commit(batch, version)
        if not self.failed:
            self.failed = True
            raise OSError("connection reset after the commit was written")
        return fenced


async def test_writer_treats_a_landed_commit_as_committed(root: StoreRoot) -> None:
    """The group-commit writer asks the log before failing a batch: the publisher whose commit
    landed gets its PubAck, nothing is rolled back, and the next commit follows it."""
    failed_streams: list[set[str]] = []
    with ThreadPoolExecutor(1) as pool:
        writer = GroupCommitWriter(FailsAfterLanding(root), pool, 1 << 20, failed_streams.append)
        await writer.start()
        first, second = writer.submit([message("S", 1)]), writer.submit([message("S", 2)])
        await asyncio.wait([first, second])
        assert first.exception() is None  # the commit that raised after landing counts as committed
        assert second.exception() is None
        await writer.submit([message("S", 3)])  # and the next commit follows it
        await writer.close()
    assert failed_streams == []
    assert seqs_in_table(root) == {"S": [1, 2, 3]}


def test_vacuum_keeps_files_a_writer_has_not_committed(root: StoreRoot) -> None:
    """delta-rs #3645: a ``full`` vacuum deletes unreferenced files, including one a writer has
    written and is about to commit. jetlake's vacuum keeps a retention margin, so the file of a
    commit in flight survives and the commit that follows finds it."""
    table = MessageTable(root)
    for seq in range(1, 4):
        table.commit([message("S", seq)], seq)
    seal_stream(root, "S")  # tombstones for the three commit files
    rows = pa.table(
        {"seq": [4], "ts": [4], "subject": ["s.x"], "hdrs": pa.array([None], pa.binary()), "data": [b"m"]},
        schema=sch.MESSAGE_FILE_SCHEMA,
    )
    in_flight = write_data_file(root, sch.MESSAGES, {"stream": "S", "block": "0"}, rows)
    with pytest.raises(ValueError, match="safety margin"):
        vacuum(root, retention_hours=0, dry_run=False)
    assert vacuum(root, retention_hours=1, dry_run=False) == []
    assert os.path.exists(f"{root.uri}/{sch.MESSAGES}/{in_flight.path}")
    next_version = len([f for f in os.listdir(log_dir(root)) if f.endswith(".json")])
    LogAppender(LocalLogEntries(f"{root.uri}/{sch.MESSAGES}"), next_version).append([in_flight], (APP_ID, 4))
    table.close()
    assert seqs_in_table(root) == {"S": [1, 2, 3, 4]}


def checkpoint_actions(root: StoreRoot) -> tuple[int, int]:
    """Adds and removes (tombstones) in the newest checkpoint of ``messages``."""
    cps = sorted(f for f in os.listdir(log_dir(root)) if f.endswith(".checkpoint.parquet"))
    actions = pq.read_table(f"{log_dir(root)}/{cps[-1]}", columns=["add", "remove"])
    return (
        actions.num_rows - actions["add"].null_count,
        actions.num_rows - actions["remove"].null_count,
    )


@pytest.mark.parametrize(("retention", "tombstones"), [("interval 1 hours", 6), ("interval 1 seconds", 0)])
def test_checkpoints_keep_tombstones_only_for_the_tables_retention(
    root: StoreRoot, monkeypatch: pytest.MonkeyPatch, retention: str, tombstones: int
) -> None:
    """delta-rs keeps a removed file's tombstone in every checkpoint for the table's
    ``deletedFileRetentionDuration`` (a week unless set): with the jobs removing files all day, the
    checkpoints and every handle that loads them would grow with a week of tombstones. jetlake's
    tables keep them an hour (``TABLE_PROPERTIES``; a second here, so the test need not wait an
    hour); what the table holds is unchanged."""
    if retention != tables.TABLE_PROPERTIES["delta.deletedFileRetentionDuration"]:
        monkeypatch.setitem(tables.TABLE_PROPERTIES, "delta.deletedFileRetentionDuration", retention)
    table = MessageTable(root, checkpoint_every=10**9)
    for seq in range(1, 8):
        table.commit([message("S", seq)], seq)
    table.close()
    assert swap_files(root, [f for f in live_files(root, "S") if (f.max_seq or 0) <= 6], [], True)
    time.sleep(1.5)
    dt = tables.open_existing(root, sch.MESSAGES)
    assert dt is not None
    assert dt.metadata().configuration["delta.deletedFileRetentionDuration"] == retention
    dt.create_checkpoint()
    assert checkpoint_actions(root) == (1, tombstones)
    assert seqs_in_table(root) == {"S": [7]}


def test_loads_need_only_the_commits_that_existed_when_they_began(root: StoreRoot) -> None:
    """A listing of ``_delta_log`` made while commits are created may return a newer commit file
    and miss an older one, and delta-rs refuses the log it lists as having a gap: under a sync
    publisher the writer's checkpoints and the compaction's rounds kept failing so (#22). Shown
    here as what such a listing sees, commit 7 without 6: a plain load refuses it, while jetlake's
    loads and catch-ups take the newest version whose commits all exist, found by name."""
    table = MessageTable(root)
    for seq in range(1, 6):
        table.commit([message("S", seq)], seq)
    table.close()
    handle = tables.open_existing(root, sch.MESSAGES)
    assert handle is not None
    assert handle.version() == 5
    log_dir = f"{root.uri}/{sch.MESSAGES}/_delta_log"
    stray = commit_path(log_dir, 7)
    os.link(commit_path(log_dir, 5), stray)
    try:
        with pytest.raises(DeltaError, match="contiguous"):
            DeltaTable(f"{root.uri}/{sch.MESSAGES}")
        opened = tables.open_existing(root, sch.MESSAGES)
        assert opened is not None
        assert opened.version() == 5
        handle.load_as_version(3)
        tables.catch_up(handle)
        assert handle.version() == 5
    finally:
        os.unlink(stray)
    for known in (-1, 0, 2, 5):
        assert tables.newest_version(log_dir, known) == 5


def test_the_start_checks_the_log_a_load_reads_and_repair_all_of_it(root: StoreRoot) -> None:
    """The gateway's start checks the newest whole checkpoint and the entries after it, which is
    what a load reads (a restart must not cost every commit the table ever had); ``jetlake
    repair`` checks every entry. A changed byte in an entry's add line breaks its digest."""
    table = MessageTable(root, checkpoint_every=10**9)
    for seq in range(1, 26):
        table.commit([message("S", seq)], seq)
        if seq % 10 == 0:  # the writer's checkpoint, here in line: commits no longer wait for one
            table._appender.hygiene()
    table.close()
    table_path = f"{root.uri}/{sch.MESSAGES}"
    log_dir = f"{table_path}/_delta_log"
    assert os.path.exists(f"{log_dir}/{20:020d}.checkpoint.parquet")
    for version in (5, 22):
        entry = Path(commit_path(log_dir, version))
        entry.write_bytes(entry.read_bytes().replace(b'"size":', b'"size": '))
    assert [d.version for d in scan_log(table_path)] == [5, 22]
    assert [d.version for d in scan_log(table_path, newest_only=True)] == [22]
