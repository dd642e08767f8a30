"""Checkpoints off the commit path and the trim of ``_delta_log`` (#22,
storage_delta/commit/checkpoint.py): commits go on while a checkpoint is written and synced, a crash
at any step of a checkpoint leaves the table loadable, and a table written one message per commit
keeps a bounded log while every version within the retention stays loadable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from storage_delta.commit import checkpoint as ckpt
from storage_delta.commit.deltalog import BelowTrim, LocalLogEntries, LogAppender
from storage_delta.commit.durable import fsync_path
from storage_delta.commit.store import StoreRoot, catch_up, open_existing, open_version
from storage_delta.commit.writer import MessageTable, StoredMessage
from storage_delta.format import schema as sch
from storage_delta.format.integrity import checkpoint_digest_path, scan_log
from storage_delta.maintenance.files import live_files, swap_files, vacuum
from storage_delta.maintenance.recent import Compaction
from storage_delta.tables.repair import check_at_start
from tests.test_storage_hazards import seqs_in_table

#: ``alone``: hundreds of synced one-message commits; beside another process they slow both.
pytestmark = pytest.mark.alone

STREAM = "S"


def message(seq: int) -> StoredMessage:
    return StoredMessage(STREAM, 1000, seq, 1_700_000_000_000_000_000 + seq, "s.x", None, b"m%d" % seq)


def log_dir(root: StoreRoot) -> Path:
    return Path(root.uri) / sch.MESSAGES / "_delta_log"


def commit_each(table: MessageTable, seqs: range, checkpoint_every: int = 10) -> None:
    """One commit per message, and the writer's checkpoint (with its trim) every
    ``checkpoint_every`` sequences, here on this thread: one after another."""
    for seq in seqs:
        table.commit([message(seq)], seq)
        if seq % checkpoint_every == 0:
            table._appender.hygiene()


def rows(root: StoreRoot) -> list[int]:
    dt = open_existing(root, sch.MESSAGES)
    assert dt is not None
    return sorted(dt.to_pyarrow_table(columns=["seq"]).column("seq").to_pylist())


def test_commits_go_on_while_a_checkpoint_is_written_and_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a root that syncs, the checkpoint's sync is held up; commits made meanwhile return
    (before #22 they waited on the writer's lock until the checkpoint was synced), one checkpoint
    runs at a time, and ``close`` waits for it."""
    root = StoreRoot(str(tmp_path))
    started, release = threading.Event(), threading.Event()

    def slow_fsync(path: str) -> None:
        started.set()
        assert release.wait(60)
        fsync_path(path)

    monkeypatch.setattr(ckpt, "fsync_path", slow_fsync)
    table = MessageTable(root, checkpoint_every=5)
    for seq in range(1, 6):
        table.commit([message(seq)], seq)
    assert started.wait(30), "no checkpoint started after 5 commits"

    def more() -> None:
        for seq in range(6, 31):  # passes five more checkpoint intervals: none may start or wait
            table.commit([message(seq)], seq)

    committer = threading.Thread(target=more)
    committer.start()
    committer.join(30)
    held = committer.is_alive()
    release.set()
    committer.join()
    assert not held, "commits waited for the checkpoint"
    assert not (log_dir(root) / "_last_checkpoint").exists(), "the checkpoint entered the log unsynced"
    table.close()  # waits for the checkpoint under way
    assert (log_dir(root) / f"{5:020d}.checkpoint.parquet").exists()
    assert os.path.exists(checkpoint_digest_path(str(tmp_path / sch.MESSAGES), 5))
    assert rows(root) == list(range(1, 31))


@pytest.mark.parametrize("fail_at", ["create", "move_checkpoint", "move_pointer"])
def test_a_checkpoint_that_fails_midway_leaves_the_table_loadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: str
) -> None:
    """A failure (a crash's stand-in) while the checkpoint is written in its stage, after the
    checkpoint entered the log but before ``_last_checkpoint`` did, or in between: the table loads
    at its newest version with every row, and the next checkpoint succeeds."""
    root = StoreRoot(str(tmp_path))
    table = MessageTable(root, checkpoint_every=10**9)
    for seq in range(1, 11):
        table.commit([message(seq)], seq)
    real_replace, real_create = os.replace, DeltaTable.create_checkpoint

    def failing_replace(src: str, dst: str) -> None:
        wanted = "_last_checkpoint" if fail_at == "move_pointer" else ".checkpoint.parquet"
        if dst.endswith(wanted):
            raise OSError("injected")
        real_replace(src, dst)

    def failing_create(self: DeltaTable) -> None:
        raise OSError("injected")

    monkeypatch.setattr(os, "replace", failing_replace)
    if fail_at == "create":
        monkeypatch.setattr(DeltaTable, "create_checkpoint", failing_create)
    dt = open_existing(root, sch.MESSAGES)
    assert dt is not None
    with pytest.raises(OSError, match="injected"):
        ckpt.checkpoint_table(root, dt, sch.MESSAGES)
    monkeypatch.setattr(os, "replace", real_replace)
    monkeypatch.setattr(DeltaTable, "create_checkpoint", real_create)
    assert not (log_dir(root) / "_last_checkpoint").exists()
    assert rows(root) == list(range(1, 11))
    assert list(scan_log(str(tmp_path / sch.MESSAGES))) == []
    for seq in range(11, 21):
        table.commit([message(seq)], seq)
    # The failed one's stage is left to the age rule (it may be another writer's under way).
    monkeypatch.setattr(ckpt, "STALE_STAGE_S", 0.0)
    dt = open_existing(root, sch.MESSAGES)
    assert dt is not None
    ckpt.checkpoint_table(root, dt, sch.MESSAGES)
    assert (log_dir(root) / f"{dt.version():020d}.checkpoint.parquet").exists()
    assert os.listdir(tmp_path / sch.MESSAGES / "_jetlake_checkpoints" / "stage") == []
    assert rows(root) == list(range(1, 21))


_WRITER = """
import sys
from storage_delta.commit.durable import fsync_path
from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import MessageTable, StoredMessage
root = StoreRoot(sys.argv[1], log_retention_s=0.0)
table = MessageTable(root, checkpoint_every=3, checkpoint_min_interval_s=0.0)
seq = table.last_txn_version()
while True:
    seq += 1
    table.commit([StoredMessage("S", 1000, seq, seq, "s.x", None, b"x")], seq)
    print(seq, flush=True)
"""


def test_kill_9_during_checkpoints_and_trims_leaves_the_table_loadable(tmp_path: Path) -> None:
    """A writer that checkpoints every 3 commits and trims to its newest checkpoint each time,
    killed with SIGKILL at five moments: every acknowledged commit loads, the log and its
    checkpoints are whole, and the next writer goes on from there."""
    root = StoreRoot(str(tmp_path))
    acknowledged = 0
    for kill_after in (0.5, 0.9, 1.3, 0.7, 1.1):
        with subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tmp_path)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        ) as proc:
            assert proc.stdout is not None
            first = proc.stdout.readline()  # started and committing
            assert first.strip(), "the writer did not start"
            time.sleep(kill_after)
            proc.send_signal(signal.SIGKILL)
            lines = [first, *proc.stdout.readlines()]
        acknowledged = int(lines[-1])
        assert list(scan_log(str(tmp_path / sch.MESSAGES))) == []
        assert rows(root)[:acknowledged] == list(range(1, acknowledged + 1))
    assert acknowledged > 15


def test_one_commit_per_message_keeps_a_bounded_log(tmp_path: Path) -> None:
    """300 commits of one message, a checkpoint every 10, a retention of 0: the log holds two or
    three checkpoint intervals of entries, not 300, and two checkpoints (the newest is never the
    floor); versions from the older of them on load, older ones are gone with their digests."""
    root = StoreRoot(str(tmp_path), log_retention_s=0.0)
    table = MessageTable(root, checkpoint_every=10**9)
    commit_each(table, range(1, 301))
    entries = [n for n in os.listdir(log_dir(root)) if n.endswith(".json")]
    checkpoints = sorted(n for n in os.listdir(log_dir(root)) if n.endswith(".checkpoint.parquet"))
    assert len(entries) <= 31, sorted(entries)
    assert len(checkpoints) == 2, checkpoints
    floor, newest = (int(c[:20]) for c in checkpoints)
    assert newest - floor == 10
    assert rows(root) == list(range(1, 301))
    for version in (floor, newest):
        old = open_version(root, sch.MESSAGES, version)
        assert old is not None
        assert old.to_pyarrow_table(columns=["seq"]).num_rows == version  # version 0 created the table
    with pytest.raises(Exception, match="No files in log segment"):
        open_version(root, sch.MESSAGES, floor - 5)
    digests = os.listdir(tmp_path / sch.MESSAGES / "_jetlake_checkpoints")
    assert sorted(d for d in digests if d.endswith(".crc32")) == [f"{v:020d}.crc32" for v in (floor, newest)]


def test_the_trim_keeps_what_the_retention_covers(tmp_path: Path) -> None:
    """Delta's rule: nothing goes while every checkpoint is younger than the retention; once one
    is older, everything below the newest such checkpoint goes, and nothing at or above it."""
    root = StoreRoot(str(tmp_path), log_retention_s=3600.0)
    table = MessageTable(root, checkpoint_every=10**9)
    commit_each(table, range(1, 36))
    table_path = str(tmp_path / sch.MESSAGES)
    before = sorted(os.listdir(log_dir(root)))
    assert ckpt.trim_log(table_path, 3600.0) == 0
    assert sorted(os.listdir(log_dir(root))) == before
    checkpoints = sorted(int(n[:20]) for n in before if n.endswith(".checkpoint.parquet"))
    assert len(checkpoints) == 3
    # the second checkpoint is now older than the retention, the newest is not
    old = time.time() - 7200
    second = log_dir(root) / f"{checkpoints[1]:020d}.checkpoint.parquet"
    os.utime(second, (old, old))
    assert ckpt.trim_log(table_path, 3600.0) > 0
    left = sorted(int(n[:20]) for n in os.listdir(log_dir(root)) if n[:20].isdigit())
    assert left[0] == checkpoints[1]
    for version in (checkpoints[1], checkpoints[2] - 1):
        assert open_version(root, sch.MESSAGES, version) is not None
    assert rows(root) == list(range(1, 36))
    # every checkpoint older than the retention: the newest is still not the floor
    newest = log_dir(root) / f"{checkpoints[2]:020d}.checkpoint.parquet"
    os.utime(newest, (old, old))
    assert ckpt.trim_log(table_path, 3600.0) == 0
    left = sorted(int(n[:20]) for n in os.listdir(log_dir(root)) if n[:20].isdigit())
    assert left[0] == checkpoints[1]


def test_a_damaged_newest_checkpoint_of_a_table_idle_past_the_retention_is_replayed(tmp_path: Path) -> None:
    """A table idle for longer than the retention, trimmed, then its newest checkpoint cut: the
    start's check sets it aside and every row loads from the whole checkpoint below it and the
    entries since (a trim to the newest checkpoint would have left nothing to replay: #16)."""
    root = StoreRoot(str(tmp_path), log_retention_s=3600.0)
    table = MessageTable(root, checkpoint_every=10**9)
    commit_each(table, range(1, 26))
    table.close()
    table_path = str(tmp_path / sch.MESSAGES)
    old = time.time() - 7200
    for name in os.listdir(log_dir(root)):
        os.utime(log_dir(root) / name, (old, old))
    assert ckpt.trim_log(table_path, 3600.0) > 0
    assert sorted(n for n in os.listdir(log_dir(root)) if n.endswith(".checkpoint.parquet")) == [
        f"{10:020d}.checkpoint.parquet",
        f"{20:020d}.checkpoint.parquet",
    ]
    newest = log_dir(root) / f"{20:020d}.checkpoint.parquet"
    newest.write_bytes(newest.read_bytes()[:200])
    check = check_at_start(root)
    assert check.problems == [], check.problems
    assert not newest.exists()
    assert rows(root) == list(range(1, 26))


def test_the_start_check_reads_from_the_last_checkpoint_without_listing_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log of a retention's worth of entries (hundreds of thousands under a sync publisher)
    is not listed at start: the check reads from the checkpoint ``_last_checkpoint`` names. It
    still finds a damaged entry after that checkpoint, and a damaged newer checkpoint that
    ``_last_checkpoint`` does not name yet; damage below a newer whole checkpoint no longer counts."""
    root = StoreRoot(str(tmp_path))
    table = MessageTable(root, checkpoint_every=10**9)
    for seq in range(1, 26):
        table.commit([message(seq)], seq)
        if seq == 10:
            table._appender.hygiene()
    table_path = str(tmp_path / sch.MESSAGES)
    logs = log_dir(root)
    entry = logs / f"{15:020d}.json"
    entry.write_bytes(entry.read_bytes().replace(b'"size":', b'"size": '))
    listed: list[str] = []
    real_listdir = os.listdir

    def listdir(path: str) -> list[str]:
        listed.append(path)
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    assert [d.version for d in scan_log(table_path, newest_only=True)] == [15]
    assert listed == []
    # a newer checkpoint that _last_checkpoint does not name yet: cut, it is reported (and the
    # entry still is); whole, a load starts there, so the damage at 15 no longer counts
    newer = logs / f"{20:020d}.checkpoint.parquet"
    newer.write_bytes((logs / f"{10:020d}.checkpoint.parquet").read_bytes()[:100])
    found = list(scan_log(table_path, newest_only=True))
    assert [(d.kind, d.version) for d in found] == [("log entry", 15), ("checkpoint", 20)]
    newer.unlink()
    pointer = (logs / "_last_checkpoint").read_bytes()
    table._appender.hygiene()  # a whole checkpoint at 25, then _last_checkpoint as it was before
    (logs / "_last_checkpoint").write_bytes(pointer)
    assert (logs / f"{25:020d}.checkpoint.parquet").exists()
    assert list(scan_log(table_path, newest_only=True)) == []
    assert listed == []


def test_a_handle_that_lagged_behind_a_trim_catches_up(tmp_path: Path) -> None:
    """A warm handle (a follower's, a reader's) left at version 5 while the log moved on and was
    trimmed past it: catching up finds the newest version through the newest checkpoint instead of
    stopping where its next entry is gone (it used to stay at 5, silently)."""
    root = StoreRoot(str(tmp_path), fsync=False, log_retention_s=0.0)
    table = MessageTable(root, checkpoint_every=10**9)
    for seq in range(1, 6):
        table.commit([message(seq)], seq)
    lagging = open_existing(root, sch.MESSAGES)
    assert lagging is not None
    assert lagging.version() == 5
    commit_each(table, range(6, 40))
    assert not (log_dir(root) / f"{6:020d}.json").exists()
    catch_up(lagging)
    assert lagging.version() == 39
    assert lagging.to_pyarrow_table(columns=["seq"]).num_rows == 39


def merged_table(root: StoreRoot, count: int) -> MessageTable:
    """``count`` one-message commits, merged by the gateway's compaction every four, then one
    file removed by a retention rewrite (``dataChange`` true), then a checkpoint."""
    table = MessageTable(root, checkpoint_every=10**9)
    compaction = Compaction(root)
    for seq in range(1, count + 1):
        table.commit([message(seq)], seq)
        if seq % 4 == 0:
            compaction.round({STREAM: 0}, 4, 1 << 30)
    last = max(live_files(root, STREAM), key=lambda f: f.min_seq or 0)
    assert swap_files(root, [last], [], data_change=True)
    table._appender.hygiene()
    return table


def checkpoint_removes(root: StoreRoot) -> list[dict[str, object]]:
    newest = sorted(n for n in os.listdir(log_dir(root)) if n.endswith(".checkpoint.parquet"))[-1]
    actions = pq.read_table(log_dir(root) / newest)
    return [r for r in actions.column("remove").to_pylist() if r is not None]


def test_a_checkpoint_carries_no_tombstone_of_a_merge_and_readers_read_the_same_rows(tmp_path: Path) -> None:
    """The compaction's removes (``dataChange`` false) stay in the log entries but not in the
    checkpoint; the retention rewrite's remove stays in both. deltalake, DuckDB and a load of a
    version before the merges read the rows they read before; ``_last_checkpoint`` counts what
    the checkpoint holds."""
    root = StoreRoot(str(tmp_path))
    merged_table(root, 200).close()
    in_log = [
        json.loads(line)["remove"]
        for entry in log_dir(root).glob("*.json")
        for line in entry.read_text().splitlines()
        if '"remove"' in line
    ]
    assert sum(not r["dataChange"] for r in in_log) > 150  # what the checkpoint leaves out
    assert [r["dataChange"] for r in checkpoint_removes(root)] == [True]
    last = sorted(n for n in os.listdir(log_dir(root)) if n.endswith(".checkpoint.parquet"))[-1]
    pointer = json.loads((log_dir(root) / "_last_checkpoint").read_text())
    assert pointer["size"] == pq.read_metadata(log_dir(root) / last).num_rows
    assert pointer["sizeInBytes"] == (log_dir(root) / last).stat().st_size
    kept = [s for s in range(1, 201) if s < 197]  # the last merged file held 197..200
    assert rows(root) == kept
    assert seqs_in_table(root) == {STREAM: kept}
    assert check_at_start(root).problems == []
    early = open_version(root, sch.MESSAGES, 8)  # before the second merge: its files are still read
    assert early is not None
    assert sorted(early.to_pyarrow_table(columns=["seq"]).column("seq").to_pylist()) == list(range(1, 8))


def test_the_full_vacuum_keeps_a_merged_file_for_its_margin_from_the_merge(tmp_path: Path) -> None:
    """Files written three hours ago and merged now lose their tombstones at the checkpoint; the
    vacuum (margin one hour) still keeps them, as a reader that planned before the merge may read
    them, and deletes them once the margin has passed since the merge: none is left for ever."""
    root = StoreRoot(str(tmp_path))
    table = MessageTable(root, checkpoint_every=10**9)
    for seq in range(1, 9):
        table.commit([message(seq)], seq)
    hours_ago = time.time() - 3 * 3600
    small = [tmp_path / sch.MESSAGES / f.path for f in live_files(root, STREAM)]
    for path in small:
        os.utime(path, (hours_ago, hours_ago))
    assert Compaction(root).round({STREAM: 0}, 4, 1 << 30)[0] == 8
    table._appender.hygiene()
    table.close()
    assert checkpoint_removes(root) == []
    assert vacuum(root, margin_hours=1, dry_run=True) == []
    merged_ago = time.time() - 2 * 3600  # two hours after the merge
    for path in small:
        os.utime(path, (merged_ago, merged_ago))
    assert sorted(vacuum(root, margin_hours=1, dry_run=True)) == sorted(
        str(p.relative_to(tmp_path / sch.MESSAGES)) for p in small
    )
    assert rows(root) == list(range(1, 9))


def test_a_table_opened_a_whole_interval_past_its_newest_checkpoint_is_checkpointed(tmp_path: Path) -> None:
    """Versions the appender did not make itself (here the compaction's swaps; or a writer killed
    while its checkpoints lagged) start no checkpoint, so every load would replay them until the
    appender made an interval of commits: the gateway asks for one once it serves."""
    root = StoreRoot(str(tmp_path))
    table = MessageTable(root, checkpoint_every=10)
    for seq in range(1, 10):  # nine commits: below the interval
        table.commit([message(seq)], seq)
    assert Compaction(root).round({STREAM: 0}, 4, 1 << 30)[0] == 9  # version 10
    table.close()
    assert ckpt._last_checkpoint(str(log_dir(root))) is None
    reopened = MessageTable(root, checkpoint_every=10)
    assert reopened.checkpoint_if_behind()
    reopened.close()
    pointer = ckpt._last_checkpoint(str(log_dir(root)))
    assert pointer is not None
    assert pointer["version"] == reopened._appender.dt.version()
    again = MessageTable(root, checkpoint_every=10)
    assert not again.checkpoint_if_behind()
    again.close()
    assert rows(root) == list(range(1, 10))


def test_the_messages_log_is_bounded_by_entries_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An hour's retention keeps every entry of 300 one-message commits; the bound by entries of
    ``messages`` (30 here) trims below the newest checkpoint that many versions back, keeping a
    whole checkpoint below the newest. Every row stays; versions within the bound load."""
    monkeypatch.setattr(MessageTable, "LOG_KEEP_ENTRIES", 30)
    root = StoreRoot(str(tmp_path), log_retention_s=3600.0)
    table = MessageTable(root, checkpoint_every=10**9)
    commit_each(table, range(1, 301))
    entries = [n for n in os.listdir(log_dir(root)) if n.endswith(".json")]
    assert len(entries) <= 50, len(entries)
    assert rows(root) == list(range(1, 301))
    old = open_version(root, sch.MESSAGES, 270)
    assert old is not None
    assert old.to_pyarrow_table(columns=["seq"]).num_rows == 270
    unbounded = StoreRoot(str(tmp_path / "unbounded"), log_retention_s=3600.0)
    monkeypatch.setattr(MessageTable, "LOG_KEEP_ENTRIES", None)
    commit_each(MessageTable(unbounded, checkpoint_every=10**9), range(1, 101))
    assert len([n for n in os.listdir(log_dir(unbounded)) if n.endswith(".json")]) == 101


def test_a_swap_planned_below_a_trim_is_abandoned_not_linked_at_a_trimmed_version(tmp_path: Path) -> None:
    """A version below the newest checkpoint may have been trimmed: its free name is not a free
    version. A swap whose writer is that far behind is refused (``BelowTrim``) and leaves the log
    as it was; before the guard it was linked there, under a version the table had long passed."""
    root = StoreRoot(str(tmp_path), log_retention_s=0.0)
    table = MessageTable(root, checkpoint_every=10**9)
    commit_each(table, range(1, 101))
    table.close()
    gone = min(int(n[:20]) for n in os.listdir(log_dir(root)) if n.endswith(".json")) - 1
    assert gone > 0  # trimmed below
    stale = LogAppender(LocalLogEntries(str(tmp_path / sch.MESSAGES)), gone)
    before = sorted(os.listdir(log_dir(root)))
    with pytest.raises(BelowTrim):
        stale.swap([], [], "OPTIMIZE")
    assert sorted(os.listdir(log_dir(root))) == before
    assert rows(root) == list(range(1, 101))


def test_a_writer_behind_a_checkpoint_passes_the_versions_still_there(tmp_path: Path) -> None:
    """The gateway's writer, then the compaction's swaps and a checkpoint at their version (the
    hygiene's, or a start's): the writer's next version is below the checkpoint, its entries all
    there. It passes them one by one, as any version another writer took, and commits after them;
    with the guard refusing every version at or below a checkpoint, each later publish of the
    gateway failed (503/10077 "version … is at or below the newest checkpoint")."""
    root = StoreRoot(str(tmp_path))
    table = MessageTable(root, checkpoint_every=10**9)
    for seq in range(1, 9):
        table.commit([message(seq)], seq)
    assert Compaction(root).round({STREAM: 0}, 4, 1 << 30)[0] > 0
    newest = open_existing(root, sch.MESSAGES)
    assert newest is not None
    assert newest.version() > 8
    ckpt.checkpoint_table(root, newest, sch.MESSAGES)
    table.commit([message(9)], 9)
    table.close()
    assert rows(root) == list(range(1, 10))


def test_an_append_behind_a_trim_catches_up_from_the_checkpoint(tmp_path: Path) -> None:
    """A writer whose next version was trimmed below a checkpoint (another writer of the table
    went on meanwhile) cannot look at the commits in between: it catches up from the checkpoint
    (the owner's fence and its own txn are in the snapshot) and commits past it."""
    root = StoreRoot(str(tmp_path), log_retention_s=0.0)
    behind = MessageTable(root, checkpoint_every=10**9)
    behind.commit([message(1)], 1)
    ahead = MessageTable(root, checkpoint_every=10**9)
    commit_each(ahead, range(2, 101))
    ahead.close()
    assert not (log_dir(root) / f"{3:020d}.json").exists()  # trimmed past the writer's next
    behind.commit([message(101)], 101)
    behind.close()
    assert rows(root) == list(range(1, 102))


def test_a_long_log_left_from_before_the_bound_is_trimmed_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = StoreRoot(str(tmp_path), log_retention_s=3600.0)
    monkeypatch.setattr(MessageTable, "LOG_KEEP_ENTRIES", None)
    commit_each(MessageTable(root, checkpoint_every=10**9), range(1, 201))
    assert len([n for n in os.listdir(log_dir(root)) if n.endswith(".json")]) == 201
    monkeypatch.setattr(MessageTable, "LOG_KEEP_ENTRIES", 30)
    reopened = MessageTable(root, checkpoint_every=10**9)
    assert not reopened.checkpoint_if_behind()  # not behind: only the trim runs
    reopened.close()
    assert len([n for n in os.listdir(log_dir(root)) if n.endswith(".json")]) <= 50
    assert rows(root) == list(range(1, 201))


def test_a_writer_checkpoints_at_most_once_per_interval_but_within_ten_intervals_of_commits(
    tmp_path: Path,
) -> None:
    """With a shortest time between checkpoints (the ``messages`` writer's second), an interval
    of commits starts a round only once that time has passed, and ten intervals start one
    whatever the time: what a load replays stays bounded."""
    table = MessageTable(StoreRoot(str(tmp_path)), checkpoint_every=5, checkpoint_min_interval_s=3600.0)
    rounds: list[int] = []
    table._appender.hygiene = lambda: rounds.append(table._appender._commits)  # type: ignore[method-assign]
    for seq in range(1, 61):
        table.commit([message(seq)], seq)
    table.close()
    assert rounds == [5, 55]  # the first at once (no round before it), the next 50 commits on
    table = MessageTable(
        StoreRoot(str(tmp_path / "quick")), checkpoint_every=5, checkpoint_min_interval_s=0.0
    )
    rounds = []
    table._appender.hygiene = lambda: rounds.append(table._appender._commits)  # type: ignore[method-assign]
    for seq in range(1, 21):
        table.commit([message(seq)], seq)
    table.close()
    assert rounds == [5, 10, 15, 20]


def test_a_starts_trim_alone_does_not_put_the_first_checkpoint_off(tmp_path: Path) -> None:
    """A start runs the log's trim alone on a table that is not behind (``checkpoint_if_behind``);
    the first interval of commits after it still checkpoints at once. It used to count as a round
    and put the checkpoint off by the shortest time between two: a gateway whose first hundred
    publishes took less than a second left ``messages`` with no checkpoint at all."""
    table = MessageTable(StoreRoot(str(tmp_path)), checkpoint_every=5, checkpoint_min_interval_s=3600.0)
    assert not table.checkpoint_if_behind()  # the trim alone
    running = table._appender._hygiene_running
    assert running is not None
    running.result()
    rounds: list[int] = []
    table._appender.hygiene = lambda: rounds.append(table._appender._commits)  # type: ignore[method-assign]
    for seq in range(1, 11):
        table.commit([message(seq)], seq)
    table.close()
    assert rounds == [5]
