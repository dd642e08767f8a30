"""Continuous compaction of recent commits: the small files of a stream's unsealed blocks merged into
few sequence-sorted ones while the gateway runs, so that restarts, cold reads and any other Delta
reader cost about the same however the messages were written.

Under sync publishing (each PubAck awaited) a commit holds one message, so the active block of a
stream gains one parquet file per message, and the Spark ``seal`` job merges only full blocks. Here
the files of a block are merged log-structured, as an LSM tree's size-tiered compaction or Lucene's
log merge policy do: a file's *tier* is how many times ``fanout`` divides its row count, and a run
of at least ``fanout`` files of one tier that lie side by side (in sequence order) becomes one file
of a higher tier. So each message is rewritten about log(block size) / log(fanout) times and a
block holds fewer than ``fanout`` files per tier. A full block (one below the stream's highest:
nothing more arrives there) is merged whole as soon as it has two small files, as sealing would, and
written with the sealed encoding; a merge in the active block, whose file will be merged again, is
written with zstd's fastest level (``ACTIVE_MERGE_PARQUET``).
Once a stream is idle (the gateway's ``compact_idle_ms`` without a commit), its active block is
merged further, round after round until nothing is left to do: a stretch of files side by side
becomes one file once the files besides its largest hold at least 1/``fanout`` of the largest's
rows, else two files of one tier side by side are a run. A publisher that paused then leaves about
as few files as large commits do (a sync publisher's 59,081 messages: 34 files left by the tiers,
small ones stranded between larger ones, against 2 after large commits), and a trickle of messages
grows the active block's largest file by 1/``fanout`` at a time, not with a rewrite per pause.

Only files of the stream's current incarnation (stored at or after its ``created`` time) and smaller
than ``max_file_bytes`` are merged (an earlier incarnation's files, which every read skips by their
``ts`` statistics, are the retention job's); a run never skips a file, so a merged file overlaps no other
file of its stream (what lets a reader's search stop at the first file that answers). The merge and
the commit are the jobs' own (:func:`storage_delta.maintenance.seal.merge_runs`: ``rewrite_files``,
then ``swap_files`` with ``dataChange`` false), so the compaction races neither the gateway's
appends nor a Spark job: the swap conflicts only with a commit that removed one of its files first,
and then its new files are deleted. Removed files stay on disk for the vacuum's margin, as the
jobs' do, so a reader that planned on an older version still finds them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from storage_delta.commit.store import (
    CommitConflict,
    StoreRoot,
    catch_up,
    open_existing,
)
from storage_delta.format import schema as sch
from storage_delta.format.integrity import DamagedFile
from storage_delta.maintenance.files import LiveFile, live_files_of
from storage_delta.maintenance.seal import merge_runs

#: Files one round reads at most (a merge at most as many): a round then commits within about a
#: second even on a loaded machine, so a ``kill -9`` or a failed round loses little work, and a
#: stream left with many thousand small files is worked down round by round.
ROUND_FILES = 1024


def tier(rows: int, fanout: int) -> int:
    """How many times ``fanout`` divides ``rows``: files of one tier have about the same size."""
    level = 0
    while rows >= fanout:
        rows //= fanout
        level += 1
    return level


def plan_recent(
    files: Sequence[LiveFile],
    created: Mapping[str, int],
    fanout: int,
    max_file_bytes: int,
    idle: bool = False,
) -> list[list[LiveFile]]:
    """The runs to merge among ``files``, for the streams in ``created`` (name → incarnation);
    ``idle``: those streams are idle, their active blocks are planned by :func:`_idle_runs`."""
    by_block: dict[tuple[str, int], list[LiveFile]] = defaultdict(list)
    for f in files:
        if f.stream in created:
            by_block[(f.stream, f.block)].append(f)
    active = active_blocks(files, created)
    runs: list[list[LiveFile]] = []
    for (stream, block), block_files in sorted(by_block.items()):
        block_files.sort(key=lambda f: (f.min_seq or 0, f.log_path))
        full = (stream, block) not in active
        if idle and not full:
            runs.extend(_idle_runs(block_files, created[stream], fanout, max_file_bytes))
            continue
        for run in _runs(block_files, created[stream], fanout, max_file_bytes, full):
            runs.extend(_within(run, max_file_bytes, 2 if full else fanout))
    return runs


def active_blocks(files: Iterable[LiveFile], streams: Collection[str]) -> set[tuple[str, int]]:
    """(stream, block) of each of ``streams``' highest block among ``files``: where its messages
    still arrive, so what is merged there will be merged again; every block below it is full."""
    top: dict[str, int] = {}
    for f in files:
        if f.stream in streams:
            top[f.stream] = max(top.get(f.stream, f.block), f.block)
    return set(top.items())


def _idle_runs(
    files: list[LiveFile], created: int, fanout: int, max_file_bytes: int
) -> Iterator[list[LiveFile]]:
    """An idle stream's active block: a stretch of mergeable files becomes one file once its files
    besides the largest hold at least 1/``fanout`` of the largest's rows (the tiers' leftovers
    stranded between larger files go, and a trickle of messages grows the largest file by
    1/``fanout`` at a time, not a rewrite per pause); else its neighbours of one tier merge from two files."""
    for stretch in _runs(files, created, fanout, max_file_bytes, True):
        rows = [f.rows or 0 for f in stretch]
        if len(stretch) >= 2 and (sum(rows) - max(rows)) * fanout >= max(rows):
            yield from _within(stretch, max_file_bytes, 2)
            continue
        for run in _runs(stretch, created, fanout, max_file_bytes, False):
            yield from _within(run, max_file_bytes, 2)


def _runs(
    files: list[LiveFile], created: int, fanout: int, max_file_bytes: int, full: bool
) -> Iterator[list[LiveFile]]:
    """Maximal runs of neighbouring files that may merge: small, of this incarnation, with
    statistics, and (in the active block) of one tier. A file with rows of an earlier incarnation
    too (a commit made while the name was deleted and reused) ends a run."""
    run: list[LiveFile] = []
    key: int | None = None
    for f in files:
        if f.max_ts is not None and f.max_ts < created:
            continue  # an earlier stream of the same name: invisible to every read, left to retention
        ok = (
            f.rows is not None
            and f.min_seq is not None
            and f.min_ts is not None
            and f.min_ts >= created
            and f.size < max_file_bytes
        )
        level = (0 if full else tier(f.rows or 0, fanout)) if ok else None
        if level is None or level != key:
            if run:
                yield run
            run, key = [], level
        if level is not None:
            run.append(f)
    if run:
        yield run


def _within(run: list[LiveFile], max_file_bytes: int, least: int) -> Iterator[list[LiveFile]]:
    """``run`` cut into pieces of at most ``ROUND_FILES`` files whose merged file stays below
    ``max_file_bytes``; the pieces of at least ``least`` files."""
    piece: list[LiveFile] = []
    size = 0
    for f in run:
        if piece and (size + f.size > max_file_bytes or len(piece) == ROUND_FILES):
            if len(piece) >= least:
                yield piece
            piece, size = [], 0
        piece.append(f)
        size += f.size
    if len(piece) >= least:
        yield piece


class RoundFailed(Exception):
    """The store failed a round (full, unreachable, a log listing that kept racing commits): the
    files stay as they were, which is correct, and a later round tries again."""


class Compaction:
    """Rounds over one long-lived handle of the ``messages`` table, caught up incrementally: a fresh
    load replays the log from its last checkpoint (up to 100 commits and an hour of tombstones), a
    catch-up only the commits since the last round. One round at a time: a handle is not shared
    between threads."""

    def __init__(self, root: StoreRoot) -> None:
        self.root = root
        self._dt: DeltaTable | None = None

    def round(
        self, created: Mapping[str, int], fanout: int, max_file_bytes: int, idle: bool = False
    ) -> tuple[int, bool]:
        """One round for the streams in ``created`` (``idle``: :func:`plan_recent`'s): plan from the table's
        current version, merge at most ``ROUND_FILES`` files, swap. Returns how many files the round removed
        (0 when there was nothing to do or another job got there first) and whether the plan had more than one
        round takes; :class:`RoundFailed` when the store failed it. The next round goes on with the same
        handle: a fresh load would list more of ``_delta_log`` and lose the listing race more often, and a
        handle behind is safe (the swap checks every commit since its version). Blocks: belongs on a worker
        thread."""
        try:
            if self._dt is None:
                self._dt = open_existing(self.root, sch.MESSAGES)
            else:
                catch_up(self._dt)
            if self._dt is None:
                return 0, False
            live = live_files_of(self._dt)
            planned = plan_recent(live, created, fanout, max_file_bytes, idle)
            runs: list[list[LiveFile]] = []
            for run in planned:
                if sum(map(len, runs)) + len(run) > ROUND_FILES:
                    break
                runs.append(run)
            merged = merge_runs(self.root, runs, self._dt, active_blocks(live, created))
        # a damaged file (reported by the reader, dropped by `jetlake repair`) holds its run back
        except (OSError, pa.ArrowException, DeltaError, CommitConflict, DamagedFile) as exc:
            raise RoundFailed(str(exc)) from exc
        return (sum(map(len, runs)) if merged else 0), len(runs) < len(planned)
