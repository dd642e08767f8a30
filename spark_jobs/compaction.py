"""Sealing and retention: the two jobs that rewrite the ``messages`` table without changing what any
reader of the logical stream sees.

Both are planned on the driver from the Delta log (which files, which sequences to leave out),
executed by Spark executors (each task merges one block's files into one sorted file) and finished
by one commit on the driver that swaps all rewritten files at once. Retention first drops files
that hold nothing visible with a metadata-only commit, so the common case (everything below a
stream's first sequence) costs no I/O at all.

Safety with a gateway ingesting at the same time rests on three facts: the files are listed
*before* the logical state is loaded (so every listed file's stream and removals are already in
that state); removals only grow (a sequence once removed is never visible again); and
:func:`storage_delta.maintenance.swap_files` commits only if every file it removes is still live.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from storage_delta.commit.store import StoreRoot
from storage_delta.maintenance.files import (
    LiveFile,
    delete_unreferenced,
    live_files,
    rewrite_files,
    swap_files,
)
from storage_delta.tables.jobruns import RunFigures
from storage_delta.tables.removals import StreamLogicalState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rewrite:
    """One executor task: merge ``files`` of one block, leaving out ``drop`` ranges and rows older
    than ``created``."""

    stream: str
    block: int
    files: tuple[LiveFile, ...]
    drop: tuple[tuple[int, int], ...] = ()
    created: int = 0


@dataclass
class Plan:
    """What a run will do: files removed by metadata alone, and blocks rewritten."""

    remove: list[LiveFile] = field(default_factory=list)
    rewrites: list[Rewrite] = field(default_factory=list)


@dataclass(slots=True)
class Outcome(RunFigures):
    """What a run did, for the log, the ``jobruns`` row and the tests; and how many swaps it
    abandoned to a racing writer."""

    abandoned: int = 0


def plan_seal(files: Sequence[LiveFile], min_files: int = 2) -> Plan:
    """Every full block (one below its stream's highest block: sequences are committed in order, so
    nothing more will arrive there) holding at least ``min_files`` files."""
    blocks = _by_block(files)
    top: dict[str, int] = {}
    for stream, block in blocks:
        top[stream] = max(top.get(stream, block), block)
    return Plan(
        rewrites=[
            Rewrite(stream, block, tuple(fs))
            for (stream, block), fs in sorted(blocks.items())
            if block < top[stream] and len(fs) >= min_files
        ]
    )


def plan_retention(files: Sequence[LiveFile], states: Mapping[str, StreamLogicalState]) -> Plan:
    """Files of deleted streams, of earlier incarnations, or wholly removed go by metadata; files
    that hold some removed rows are rewritten, per block. A file without statistics is kept."""
    plan = Plan()
    for (stream, block), block_files in sorted(_by_block(files).items()):
        state = states.get(stream)
        rewrite: list[LiveFile] = []
        drops: set[tuple[int, int]] = set()
        for f in block_files:
            if state is None or (f.max_ts is not None and f.max_ts < state.created):
                plan.remove.append(f)
                continue
            if f.min_seq is None or f.max_seq is None:
                continue
            overlap = [(a, b) for a, b in state.removed if a <= f.max_seq and b >= f.min_seq]
            if any(a <= f.min_seq and f.max_seq <= b for a, b in overlap):
                plan.remove.append(f)
            elif overlap:
                rewrite.append(f)
                drops.update(overlap)
        if rewrite:
            created = state.created if state else 0
            plan.rewrites.append(Rewrite(stream, block, tuple(rewrite), tuple(sorted(drops)), created))
    return plan


def _by_block(files: Sequence[LiveFile]) -> dict[tuple[str, int], list[LiveFile]]:
    out: dict[tuple[str, int], list[LiveFile]] = defaultdict(list)
    for f in files:
        out[(f.stream, f.block)].append(f)
    for fs in out.values():
        fs.sort(key=lambda f: (f.min_seq or 0, f.log_path))
    return out


def execute(spark: SparkSession, root: StoreRoot, plan: Plan, data_change: bool) -> Outcome:
    """Carry out a plan: the metadata-only removal, then the rewrites on the executors and one swap."""
    out = Outcome(bytes_before=sum(f.size for f in live_files(root)))
    if plan.remove and swap_files(root, plan.remove, [], data_change=True):
        out.files_removed += len(plan.remove)
        out.rows_removed += sum(f.rows or 0 for f in plan.remove)
        log.info("removed %d files by metadata", len(plan.remove))
    if plan.rewrites:
        _rewrite(spark, root, plan.rewrites, data_change, out)
    out.bytes_after = sum(f.size for f in live_files(root))
    return out


def _rewrite(
    spark: SparkSession, root: StoreRoot, rewrites: list[Rewrite], data_change: bool, out: Outcome
) -> None:
    """One task per block on the executors, then one swap of every changed block on the driver."""
    tasks = [
        (r.stream, r.block, tuple(f.path for f in r.files), r.drop, r.created, data_change) for r in rewrites
    ]
    log.info("rewriting %d blocks on the executors", len(tasks))
    results = (
        spark.sparkContext.parallelize(tasks, len(tasks)).map(lambda t: rewrite_files(root, *t)).collect()
    )
    # A retention rewrite that left nothing out changes nothing: its files stay.
    done = [
        (r, add) for r, (changed, add) in zip(rewrites, results, strict=True) if changed or not data_change
    ]
    adds = [add for _, add in done if add is not None]
    removed = [f for r, _ in done for f in r.files]
    if not removed:
        return
    if swap_files(root, removed, adds, data_change=data_change):
        out.files_removed += len(removed)
        out.files_added += len(adds)
        out.rows_removed += sum(f.rows or 0 for f in removed) - sum(_rows(a.stats) for a in adds)
    else:
        log.warning("files changed under the job; its %d new files are deleted", len(adds))
        delete_unreferenced(root, adds)
        out.abandoned += len(done)


def _rows(stats: str) -> int:
    return int(json.loads(stats)["numRecords"])


#: How many times a run plans again after its swap was abandoned to a racing writer.
REPLANS = 2


def seal(spark: SparkSession, root: StoreRoot, min_files: int = 2) -> Outcome:
    """Merge every full block's small files into one sorted file (the data does not change)."""
    return _replanned(lambda: execute(spark, root, plan_seal(live_files(root), min_files), data_change=False))


def retention(
    spark: SparkSession, root: StoreRoot, load_states: Callable[[StoreRoot], Mapping[str, StreamLogicalState]]
) -> Outcome:
    """Remove physically what the logical state says is gone. The states are loaded only after the
    files are listed (see the module docstring), hence a loader rather than a snapshot."""

    def attempt() -> Outcome:
        files = live_files(root)
        return execute(spark, root, plan_retention(files, load_states(root)), data_change=True)

    return _replanned(attempt)


def _replanned(attempt: Callable[[], Outcome]) -> Outcome:
    """``attempt`` again (up to :data:`REPLANS` times) while its swap is abandoned: the gateway's
    own compaction merges the same small files of a busy stream, and a job that gave up on the
    first conflict left a whole run's removals to the next run. The figures add up over the
    attempts; ``abandoned`` is the last attempt's."""
    out = attempt()
    for _ in range(REPLANS):
        if not out.abandoned:
            break
        again = attempt()
        out = Outcome(
            rows_removed=out.rows_removed + again.rows_removed,
            files_removed=out.files_removed + again.files_removed,
            files_added=out.files_added + again.files_added,
            bytes_before=out.bytes_before,
            bytes_after=again.bytes_after,
            abandoned=again.abandoned,
        )
    return out
