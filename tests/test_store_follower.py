"""The warm handles a streaming query plans with (``StoreFollower``) answer what a fresh load of the
tables answers after every kind of change, including tables that appear after it started."""

from __future__ import annotations

from pathlib import Path

from storage_delta.commit.checkpoint import checkpoint_table
from storage_delta.commit.store import StoreRoot, open_existing
from storage_delta.commit.writer import MessageTable, StoredMessage
from storage_delta.format import schema as sch
from storage_delta.maintenance.files import LiveFile, live_files
from storage_delta.maintenance.seal import merge_runs
from storage_delta.read.follower import StoreFollower
from storage_delta.tables.catalog import CatalogTable
from storage_delta.tables.removals import (
    Removal,
    RemovalLog,
    compact_removals,
    load_stream_states,
    recorded_at,
    recorded_between,
    removals_version,
)

CREATED = 1_700_000_000_000_000_000


def _messages(stream: str, first: int, last: int) -> list[StoredMessage]:
    return [
        StoredMessage(
            stream=stream, block_size=100, seq=s, ts=CREATED + s, subject="s.x", hdrs=None, data=b"m%d" % s
        )
        for s in range(first, last + 1)
    ]


def _by_path(files: list[LiveFile]) -> list[LiveFile]:
    return sorted(files, key=lambda f: f.log_path)


def _same_as_fresh(follower: StoreFollower, root: StoreRoot, stream: str) -> None:
    assert _by_path(follower.files(stream)) == _by_path(live_files(root, stream))
    assert follower.states() == load_stream_states(root)


def test_follows_new_commits_tables_and_removals(tmp_path: Path) -> None:
    root = StoreRoot(str(tmp_path))
    follower = StoreFollower(root)
    # No table yet: nothing stored, no stream.
    assert follower.files("A") == []
    assert follower.states() == {}

    table = MessageTable(root)
    table.commit(_messages("A", 1, 150), 1)
    _same_as_fresh(follower, root, "A")
    before = follower.files("A")
    assert follower.files("A") is before  # no commit since: the listing is not made again

    table.commit(_messages("A", 151, 160) + _messages("B", 1, 5), 2)
    _same_as_fresh(follower, root, "A")
    assert max(f.max_seq or 0 for f in follower.files("A")) == 160
    _same_as_fresh(follower, root, "B")  # another stream of the same handle

    catalog = CatalogTable(root)
    catalog.put("stream", "A", "A", {"created": CREATED})
    _same_as_fresh(follower, root, "A")
    assert follower.states()["A"].removed == []

    RemovalLog(root).append([Removal("A", CREATED, 1, 20), Removal("A", CREATED, 30, 30)])
    _same_as_fresh(follower, root, "A")
    assert follower.states()["A"].removed == [(1, 20), (30, 30)]

    catalog.put("stream", "A", "A", None)  # deleted: gone from the logical view
    _same_as_fresh(follower, root, "A")
    assert "A" not in follower.states()


def test_the_removal_log_feed_skips_its_fold(tmp_path: Path) -> None:
    # What a change feed reads of the removal log: each append's rows once; a fold (the removals
    # job) changes no data and adds nothing to the feed, while a snapshot after it holds every range.
    root = StoreRoot(str(tmp_path))
    CatalogTable(root).put("stream", "A", "A", {"created": CREATED})
    log = RemovalLog(root)
    log.append([Removal("A", CREATED, 1, 3)])
    first = removals_version(root)
    log.append([Removal("A", CREATED, 4, 9), Removal("A", CREATED, 20, 20)])
    appended = removals_version(root)
    got = recorded_between(root, first, appended)
    assert list(zip(got["first"].to_pylist(), got["last"].to_pylist(), strict=True)) == [(4, 9), (20, 20)]
    assert recorded_at(root, first)["first"].to_pylist() == [1]

    assert compact_removals(root).files_after == 1
    folded = removals_version(root)
    assert folded > appended
    assert recorded_between(root, appended, folded).num_rows == 0
    snapshot = recorded_at(root, folded)
    assert sorted(zip(snapshot["first"].to_pylist(), snapshot["last"].to_pylist(), strict=True)) == [
        (1, 9),
        (20, 20),
    ]


def test_the_listing_follows_the_commit_files_and_loads_again_only_when_it_must(tmp_path: Path) -> None:
    # A local root's listing is brought forward from each new commit file (appends of several
    # streams, a compaction's swap), the same as delta-rs's listing of the table, without loading
    # the table again; an entry trimmed before the follower read it makes it load the table afresh.
    root = StoreRoot(str(tmp_path))
    follower = StoreFollower(root)
    table = MessageTable(root)
    table.commit(_messages("A", 1, 5), 1)
    assert [f.max_seq for f in follower.files("A")] == [5]
    logged = follower._logged
    assert logged is not None
    version = 1
    for first in range(6, 60, 5):  # a stream name delta-rs might encode in a path: as it lists it
        version += 1
        table.commit(_messages("A", first, first + 4) + _messages("Strömung-1", first, first + 1), version)
    _same_as_fresh(follower, root, "A")
    _same_as_fresh(follower, root, "Strömung-1")
    assert follower._logged is logged  # brought forward, not loaded again

    files = follower.files("A")
    assert merge_runs(root, [files[1:6]]) == 1  # a swap: five files removed, one added
    _same_as_fresh(follower, root, "A")
    assert len(follower.files("A")) == len(files) - 4
    assert follower._logged is logged

    # Past the follower's version the log is checkpointed and trimmed: it loads the table again.
    stale = logged.version
    for _ in range(3):
        version += 1
        table.commit(_messages("A", 10 * version, 10 * version), version)
        dt = open_existing(root, sch.MESSAGES)
        assert dt is not None
        checkpoint_table(root, dt, sch.MESSAGES, keep_entries=1)
    assert not (tmp_path / sch.MESSAGES / "_delta_log" / f"{stale + 1:020d}.json").exists()
    _same_as_fresh(follower, root, "A")
    assert follower._logged is not logged
