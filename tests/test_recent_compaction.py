"""Continuous compaction of recent commits (``storage_delta/maintenance/recent.py``) on real tables:
what it merges, that no reader's answer changes, and that it races neither appends nor a job."""

from __future__ import annotations

import os
import threading
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from storage_delta.commit.store import ACTIVE_MERGE_PARQUET, SEALED_PARQUET, StoreRoot, encode_parquet
from storage_delta.commit.writer import MessageTable, StoredMessage
from storage_delta.format import schema as sch
from storage_delta.maintenance import recent
from storage_delta.maintenance.files import LiveFile, live_files
from storage_delta.maintenance.recent import Compaction, RoundFailed, plan_recent, tier
from storage_delta.maintenance.seal import merge_runs, seal_stream
from storage_delta.read.reader import MessageReader
from tests.test_storage_hazards import seqs_in_table

TS0 = 1_700_000_000_000_000_000


def message(seq: int, block_size: int = 1000, ts0: int = TS0) -> StoredMessage:
    hdrs = b"NATS/1.0\r\nK: %d\r\n\r\n" % seq if seq % 7 == 0 else None
    return StoredMessage("S", block_size, seq, ts0 + seq, f"s.{seq % 3}", hdrs, b"payload %d" % seq)


@pytest.fixture
def root(tmp_path: Path) -> StoreRoot:
    return StoreRoot(str(tmp_path / "root"))


def ordered(root: StoreRoot) -> list[LiveFile]:
    return sorted(live_files(root, "S"), key=lambda f: f.min_seq or 0)


def assert_no_overlap(files: list[LiveFile]) -> None:
    """A stream's files never overlap in sequences: what lets a reader's search stop early."""
    for a, b in pairwise(files):
        assert (a.max_seq or 0) < (b.min_seq or 0), (a, b)


def test_tier_is_the_power_of_the_fanout_below_the_row_count() -> None:
    assert [tier(n, 4) for n in (1, 3, 4, 15, 16, 63, 64)] == [0, 0, 1, 1, 2, 2, 3]


def test_one_message_commits_merge_log_structured_and_no_answer_changes(root: StoreRoot) -> None:
    """A sync publisher's stream: a round after every four one-message commits. The block ends up
    with fewer than ``fanout`` files per tier, and every read answers as before."""
    table = MessageTable(root)
    reader = MessageReader(root)
    compaction = Compaction(root)  # one handle, caught up round by round, as in the gateway
    removed = 0
    for seq in range(1, 201):
        table.commit([message(seq)], seq)
        if seq % 4 == 0:
            removed += compaction.round({"S": TS0}, 4, 1 << 30)[0]
    table.close()
    files = ordered(root)
    assert removed > 150
    assert len(files) < 12, [f.rows for f in files]
    tiers = [tier(f.rows or 0, 4) for f in files]
    assert all(tiers.count(t) < 4 for t in set(tiers)), tiers
    assert tiers == sorted(tiers, reverse=True)  # the oldest files are the largest
    assert_no_overlap(files)
    fresh = StoreRoot(f"{root.uri}-fresh")  # the same rows in one commit: what every read must give
    written = MessageTable(fresh)
    written.commit([message(seq) for seq in range(1, 201)], 1)
    written.close()
    assert reader.read_range("S", 1, 200, 1000).equals(MessageReader(fresh).read_range("S", 1, 200, 1000))
    index = reader.stored_index("S", headers_since=0)
    fresh_index = MessageReader(fresh).stored_index("S", headers_since=0)
    assert index.seq.tolist() == fresh_index.seq.tolist()
    assert index.headers == fresh_index.headers
    assert index.size.tolist() == fresh_index.size.tolist()
    assert seqs_in_table(root) == {"S": list(range(1, 201))}  # DuckDB's delta extension reads it


def test_full_blocks_merge_whole_and_other_incarnations_stay(root: StoreRoot) -> None:
    """Blocks below the stream's highest get one file each; the active block waits for a run of
    ``fanout``; files of an earlier stream of the same name are never merged with the new one's."""
    table = MessageTable(root)
    version = 0
    for seq in range(21, 26):  # an earlier incarnation's rows in what is now the active block
        version += 1
        table.commit([message(seq, 10, TS0 - 10_000)], version)
    for seq in range(1, 26):
        version += 1
        table.commit([message(seq, 10)], version)
    table.close()
    assert Compaction(root).round({"S": TS0}, 16, 1 << 30) == (19, False)  # blocks 0 (1-9) and 1 (10-19)
    by_block: dict[int, list[LiveFile]] = {}
    for f in live_files(root, "S"):
        by_block.setdefault(f.block, []).append(f)
    assert [len(by_block[b]) for b in (0, 1, 2)] == [1, 1, 11]
    assert Compaction(root).round({"S": TS0}, 2, 1 << 30) == (6, False)  # the new incarnation's 20-25 only
    assert sorted(f.min_ts or 0 for f in live_files(root, "S") if f.block == 2)[:5] == [
        TS0 - 10_000 + s for s in range(21, 26)
    ]
    assert Compaction(root).round({}, 2, 1 << 30) == (0, False)  # streams not named are left alone


def test_files_at_the_size_cap_are_left_to_the_seal_job(root: StoreRoot) -> None:
    table = MessageTable(root)
    for seq in range(1, 9):
        table.commit([message(seq)], seq)
    table.close()
    size = max(f.size for f in live_files(root, "S"))
    assert Compaction(root).round({"S": TS0}, 2, size) == (0, False)  # every file is at the cap
    assert Compaction(root).round({"S": TS0}, 2, 3 * size) == (8, False)  # merged in pieces below the cap
    assert len(live_files(root, "S")) == 3  # three, three and two files


def test_a_job_that_swapped_the_same_files_first_wins_and_the_merge_leaves_nothing(root: StoreRoot) -> None:
    """The compactor and a sealing job planned on the same files; the job commits first. The
    compactor's swap finds its files gone, commits nothing and deletes the file it wrote."""
    table = MessageTable(root)
    for seq in range(1, 31):
        table.commit([message(seq, 10)], seq)
    table.close()
    runs = plan_recent(live_files(root), {"S": TS0}, 2, 1 << 30)
    assert seal_stream(root, "S") == 3
    parquet = _parquet_files(root)
    assert merge_runs(root, runs) == 0
    assert _parquet_files(root) == parquet  # its merged files are deleted again
    assert seqs_in_table(root) == {"S": list(range(1, 31))}


def _parquet_files(root: StoreRoot) -> set[str]:
    base = f"{root.uri}/{sch.MESSAGES}"
    return {os.path.join(d, f) for d, _, fs in os.walk(base) for f in fs if f.endswith(".parquet")}


def test_appends_compaction_and_sealing_race_without_losing_or_doubling_a_row(root: StoreRoot) -> None:
    """An appender (the gateway's writer), the compactor and a sealing job (the Spark job's swap on
    the driver) on three threads at once: every committed row is there exactly once and the files
    still never overlap."""
    table = MessageTable(root)
    table.commit([message(1, 50)], 1)
    done = threading.Event()
    errors: list[BaseException] = []

    def keep(step: str) -> None:
        compaction = Compaction(root)
        try:
            while not done.is_set():
                if step == "compact":
                    compaction.round({"S": TS0}, 3, 1 << 30)
                else:
                    seal_stream(root, "S")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=keep, args=(s,)) for s in ("compact", "seal")]
    for t in threads:
        t.start()
    try:
        for seq in range(2, 301):
            table.commit([message(seq, 50)], seq)
    finally:
        done.set()
        for t in threads:
            t.join()
        table.close()
    assert not errors
    assert seqs_in_table(root) == {"S": list(range(1, 301))}
    assert_no_overlap(ordered(root))
    assert len(live_files(root, "S")) < 300


def test_a_round_the_store_fails_raises_round_failed_and_changes_nothing(root: StoreRoot) -> None:
    """A file the round must read is gone from the store: the round fails as the gateway's task
    expects (it logs and tries again later) and the table stays as it was."""
    table = MessageTable(root)
    for seq in range(1, 5):
        table.commit([message(seq)], seq)
    table.close()
    before = ordered(root)
    os.remove(f"{root.uri}/{sch.MESSAGES}/{before[1].path}")
    with pytest.raises(RoundFailed):
        Compaction(root).round({"S": TS0}, 2, 1 << 30)
    assert ordered(root) == before


def test_a_round_merges_at_most_round_files_and_says_when_more_is_left(
    root: StoreRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream left with many small files is worked down in rounds that each commit, so a kill or
    a failure in the middle loses one round's work, not all of it."""
    monkeypatch.setattr(recent, "ROUND_FILES", 4)
    table = MessageTable(root)
    for seq in range(1, 11):
        table.commit([message(seq)], seq)
    table.close()
    assert Compaction(root).round({"S": TS0}, 2, 1 << 30) == (4, True)  # 1-4; 5-8 and 9-10 wait
    assert [f.rows for f in ordered(root)] == [4, 1, 1, 1, 1, 1, 1]
    assert Compaction(root).round({"S": TS0}, 2, 1 << 30) == (4, True)  # 5-8
    assert Compaction(root).round({"S": TS0}, 2, 1 << 30) == (4, False)  # the two 4s, and 9-10
    assert [f.rows for f in ordered(root)] == [8, 2]
    assert seqs_in_table(root) == {"S": list(range(1, 11))}


def test_an_idle_streams_active_block_is_merged_down_to_one_file_per_tier(root: StoreRoot) -> None:
    """200 one-message commits with the rounds of a busy stream leave up to ``fanout`` - 1 files of
    each tier; idle rounds (runs from two files of a tier), repeated while they merge, leave at
    most one file per tier, and every read answers as before."""
    table = MessageTable(root)
    reader = MessageReader(root)
    compaction = Compaction(root)
    for seq in range(1, 201):
        table.commit([message(seq)], seq)
        if seq % 4 == 0:
            compaction.round({"S": TS0}, 4, 1 << 30)
    table.close()
    before = reader.read_range("S", 1, 200, 1000)
    busy = ordered(root)
    assert max(Counter(tier(f.rows or 0, 4) for f in busy).values()) > 1
    rounds = 0
    while compaction.round({"S": TS0}, 4, 1 << 30, idle=True)[0]:
        rounds += 1
    settled = ordered(root)
    assert rounds >= 1
    assert len(settled) < len(busy)
    assert max(Counter(tier(f.rows or 0, 4) for f in settled).values()) == 1
    assert_no_overlap(settled)
    assert MessageReader(root).read_range("S", 1, 200, 1000).equals(before)
    assert seqs_in_table(root) == {"S": list(range(1, 201))}
    assert plan_recent(live_files(root), {"S": TS0}, 4, 1 << 30, idle=True) == []


def test_a_trickle_into_an_idle_stream_grows_its_largest_file_by_a_share_at_a_time(root: StoreRoot) -> None:
    """A file of 160 messages, then 80 one-message commits with idle rounds after each (a publisher
    that pauses after every message): the small files merge among themselves, and the large file
    is rewritten only once they hold a quarter (1/fanout) of its rows, once in all, not at every
    pause; the block stays at a few files and every message reads back."""
    table = MessageTable(root)
    compaction = Compaction(root)
    table.commit([message(seq) for seq in range(1, 161)], 1)
    largest = ordered(root)[0].log_path
    rewrites = 0
    for seq in range(161, 241):
        table.commit([message(seq)], seq - 159)
        while compaction.round({"S": TS0}, 4, 1 << 30, idle=True)[0]:
            pass
        first = ordered(root)[0]
        if first.log_path != largest:
            rewrites += 1
            largest = first.log_path
            assert first.rows == 200  # at the 40th message: a quarter of 160
    table.close()
    files = ordered(root)
    assert rewrites == 1
    assert len(files) <= 4, [f.rows for f in files]
    assert_no_overlap(files)
    assert seqs_in_table(root) == {"S": list(range(1, 241))}


def test_merges_in_the_active_block_are_encoded_fast_and_full_blocks_sealed(root: StoreRoot) -> None:
    """A merged file of the active block will be merged again, so it is written with zstd's
    fastest level; a full block's file is its final form, written with the sealed encoding. Each
    merged file's bytes are what its rows give with one encoding and not with the other."""
    table = MessageTable(root)
    for seq in range(1, 151):  # blocks of 100: block 0 full, block 1 active
        body = b'{"order": %d, "customer": "c-%d", "amount": %d.%02d, "status": "pending"}' % (
            seq,
            seq % 17,
            seq * 7,
            seq % 100,
        )
        table.commit([StoredMessage("S", 100, seq, TS0 + seq, f"s.{seq % 3}", None, body)], seq)
    table.close()
    assert Compaction(root).round({"S": TS0}, 16, 1 << 30)[0] == 150  # block 0 whole, block 1's tier-0 run
    merged = live_files(root, "S")
    assert sorted((f.block, f.rows) for f in merged) == [(0, 99), (1, 51)]
    for f in merged:
        rows = pq.read_table(os.path.join(root.uri, sch.MESSAGES, f.path))
        fast, sealed = (encode_parquet(rows, e).size for e in (ACTIVE_MERGE_PARQUET, SEALED_PARQUET))
        assert fast != sealed  # the two encodings tell apart on these rows
        assert f.size == (fast if f.block == 1 else sealed), (f.block, f.size, fast, sealed)
