"""Sealing a stream on the driver, without Spark: each block's many small commit files replaced by
one sequence-sorted file, all in one commit. The bench and the storage tests use it.

The block rewrite is :func:`storage_delta.maintenance.rewrite_files`, the very function the Spark
sealing job (``spark_jobs/compaction.py``) runs on its executors, and the commit is the same
:func:`~storage_delta.maintenance.swap_files`; only the distribution differs. What a reader sees does
not change (the same rows, the same sequences); what it costs to store and to scan does.
"""

from __future__ import annotations

from itertools import groupby

from storage_delta.commit.store import StoreRoot
from storage_delta.maintenance.files import delete_unreferenced, live_files, rewrite_files, swap_files


def stream_bytes(root: StoreRoot, stream: str) -> int:
    """Bytes of the parquet files the table's current version holds for a stream."""
    return sum(f.size for f in live_files(root, stream))


def seal_stream(root: StoreRoot, stream: str, min_files: int = 2) -> int:
    """Seal every block of a stream that has at least ``min_files`` files; returns how many. The
    swap retries a lost race with an append (#3890); if another job changed the files first, the
    new files are deleted and nothing is sealed."""
    files = sorted(live_files(root, stream), key=lambda f: (f.block, f.min_seq or 0))
    blocks = [list(fs) for _, fs in groupby(files, key=lambda f: f.block)]
    blocks = [fs for fs in blocks if len(fs) >= min_files]
    adds = []
    for fs in blocks:
        _, add = rewrite_files(root, stream, fs[0].block, [f.path for f in fs])
        if add is not None:
            adds.append(add)
    if not blocks:
        return 0
    if not swap_files(root, [f for fs in blocks for f in fs], adds, data_change=False):
        delete_unreferenced(root, adds)
        return 0
    return len(blocks)
