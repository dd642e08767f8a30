"""Sealing a block: its many small commit files replaced by one sequence-sorted file, in one commit.

What a reader sees does not change (the same rows, the same sequences); what it costs to store and
to scan does. The commit removes exactly the files it read and adds the new one, so a concurrent
append to another block only meets delta-rs's conflict check, and the caller retries (#3890).
"""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable
from deltalake.transaction import RemoveAction

from storage_delta import schema as sch
from storage_delta.tables import StoreRoot, commit_adds, open_existing, write_data_file


def stream_bytes(root: StoreRoot, stream: str) -> int:
    """Bytes of the parquet files the table's current version holds for a stream."""
    dt = open_existing(root, sch.MESSAGES)
    if dt is None:
        return 0
    adds = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
    return sum(
        size
        for size, part in zip(adds["size_bytes"], adds["partition.stream"], strict=True)
        if part == stream
    )


def stream_blocks(dt: DeltaTable, stream: str) -> dict[int, list[tuple[str, int]]]:
    """(path, size) of every live file of a stream, by block."""
    adds = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
    out: dict[int, list[tuple[str, int]]] = {}
    for path, size, part, block in zip(
        adds["path"], adds["size_bytes"], adds["partition.stream"], adds["partition.block"], strict=True
    ):
        if part == stream:
            out.setdefault(int(block), []).append((path, size))
    return out


def seal_block(
    root: StoreRoot, dt: DeltaTable, stream: str, block: int, files: list[tuple[str, int]]
) -> None:
    """Rewrite one block's files as one sorted file, with the sealed (heavier) encoding."""
    fs, base = root.filesystem()
    dset = ds.dataset(
        [f"{base}/{sch.MESSAGES}/{p}" for p, _ in files],
        schema=sch.MESSAGE_FILE_SCHEMA,
        format="parquet",
        filesystem=fs,
    )
    table = dset.to_table(columns=sch.MESSAGE_FILE_SCHEMA.names).sort_by("seq")
    add = write_data_file(root, sch.MESSAGES, {"stream": stream, "block": str(block)}, table, sealed=True)
    now = int(time.time() * 1000)
    removes = [
        RemoveAction(
            path=p,
            data_change=False,
            deletion_timestamp=now,
            size=size,
            partition_values={"stream": stream, "block": str(block)},
        )
        for p, size in files
    ]
    add.data_change = False
    commit_adds(dt, [add, *removes], sch.MESSAGE_TABLE_SCHEMA, sch.MESSAGE_PARTITIONS)


def seal_stream(root: StoreRoot, stream: str, min_files: int = 2) -> int:
    """Seal every block of a stream that has at least ``min_files`` files; returns how many."""
    dt = open_existing(root, sch.MESSAGES)
    if dt is None:
        return 0
    sealed = 0
    for block, files in sorted(stream_blocks(dt, stream).items()):
        if len(files) >= min_files:
            seal_block(root, dt, stream, block, files)
            sealed += 1
    return sealed
