"""Sealing a stream on the driver, without Spark: each block's many small commit files replaced by
one sequence-sorted file, all in one commit. The bench and the storage tests use it, and the
gateway's continuous compaction (:mod:`storage_delta.maintenance.recent`) merges through
:func:`merge_runs` too.

The block rewrite is :func:`storage_delta.maintenance.rewrite_files`, the very function the Spark
sealing job (``spark_jobs/compaction.py``) runs on its executors, and the commit is the same
:func:`~storage_delta.maintenance.swap_files`; only the distribution differs. What a reader sees does
not change (the same rows, the same sequences); what it costs to store and to scan does.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from itertools import groupby

from deltalake import DeltaTable

from storage_delta.commit.store import ACTIVE_MERGE_PARQUET, SEALED_PARQUET, StoreRoot
from storage_delta.maintenance.files import (
    LiveFile,
    delete_unreferenced,
    live_files,
    rewrite_files,
    swap_files,
)


def stream_bytes(root: StoreRoot, stream: str) -> int:
    """Bytes of the parquet files the table's current version holds for a stream."""
    return sum(f.size for f in live_files(root, stream))


def seal_stream(root: StoreRoot, stream: str, min_files: int = 2) -> int:
    """Seal every block of a stream that has at least ``min_files`` files; returns how many. The
    swap retries a lost race with an append (#3890); if another job changed the files first, the
    new files are deleted and nothing is sealed."""
    files = sorted(live_files(root, stream), key=lambda f: (f.block, f.min_seq or 0))
    blocks = [list(fs) for _, fs in groupby(files, key=lambda f: f.block)]
    return merge_runs(root, [fs for fs in blocks if len(fs) >= min_files])


def merge_runs(
    root: StoreRoot,
    runs: Sequence[Sequence[LiveFile]],
    dt: DeltaTable | None = None,
    active: Collection[tuple[str, int]] = (),
) -> int:
    """Merge each run (files of one stream and block, side by side in sequence order, so the merged
    file overlaps no other) into one sequence-sorted file, and swap all of them in one commit that
    changes no reader's answer (``dataChange`` false), through ``dt`` when given (see
    :func:`~storage_delta.maintenance.files.swap_actions`). A run in one of the ``active`` blocks
    (stream, block) is written with :data:`ACTIVE_MERGE_PARQUET` (it will be merged again), any
    other sealed. Returns how many runs were merged: 0 when another job removed one of the files
    first, and then the new files are deleted."""
    if not runs:
        return 0
    adds = []
    for run in runs:
        stream, block = run[0].stream, run[0].block
        encoding = ACTIVE_MERGE_PARQUET if (stream, block) in active else SEALED_PARQUET
        _, add = rewrite_files(root, stream, block, [f.path for f in run], encoding=encoding)
        if add is not None:
            adds.append(add)
    if not swap_files(root, [f for run in runs for f in run], adds, data_change=False, dt=dt):
        delete_unreferenced(root, adds)
        return 0
    return len(runs)
