"""The owner fence of a shared store root (storage_delta/commit/owner.py), on real tables: a writer
of an older epoch can never commit once a newer owner fenced the table, whatever the timing, and is
never fooled into taking the new owner's commits for its own."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.transaction import RemoveAction

from storage_delta.commit.lease import LocalLease
from storage_delta.commit.owner import OWNER_APP, Fenced
from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import GroupCommitWriter, MessageTable, StoredMessage
from storage_delta.format import schema as sch
from storage_delta.maintenance.files import swap_actions


def _msg(seq: int) -> StoredMessage:
    return StoredMessage("S", 1 << 20, seq, seq, "s.x", None, f"m{seq}".encode())


def _rows(root: Path) -> list[int]:
    table = DeltaTable(str(root / "messages")).to_pyarrow_table(columns=["seq"])
    return sorted(table.column("seq").to_pylist())


def test_a_stale_owner_cannot_commit_after_a_new_epoch_fenced_the_table(tmp_path: Path) -> None:
    root = StoreRoot(str(tmp_path))
    old = MessageTable(replace(root, epoch=1))
    old.commit([_msg(1)], old.last_txn_version() + 1)
    new = MessageTable(replace(root, epoch=2))  # fences, then reads what the old one committed
    assert new.last_txn_version() == 1
    with pytest.raises(Fenced):
        old.commit([_msg(2)], 2)
    new.commit([_msg(2)], 2)  # the new owner's version 2 is not the old one's
    with pytest.raises(Fenced):
        old.commit([_msg(3)], 3)
    with pytest.raises(Fenced):
        old.last_txn_version()  # nor does the old one read the new one's versions as its own
    assert _rows(tmp_path) == [1, 2]
    assert DeltaTable(str(tmp_path / "messages")).transaction_version(OWNER_APP) == 2


def test_a_stale_owners_swap_of_files_is_fenced_too(tmp_path: Path) -> None:
    """The gateway's compaction swaps files through the same log appender: fenced the same way."""
    root = StoreRoot(str(tmp_path))
    old = MessageTable(replace(root, epoch=1))
    old.commit([_msg(1)], 1)
    MessageTable(replace(root, epoch=2))
    live = pa.table(DeltaTable(str(tmp_path / "messages")).get_add_actions(flatten=True)).to_pylist()
    removes = [
        RemoveAction(
            path=f["path"],
            data_change=False,
            deletion_timestamp=0,
            size=f["size_bytes"],
            partition_values={"stream": "S", "block": "0"},
        )
        for f in live
    ]
    args: tuple[Any, ...] = ("messages", sch.MESSAGE_TABLE_SCHEMA, sch.MESSAGE_PARTITIONS, removes, [])
    with pytest.raises(Fenced):
        swap_actions(replace(root, epoch=1), *args)
    assert swap_actions(replace(root, epoch=2), *args)


def test_a_writer_outside_the_lease_is_not_fenced(tmp_path: Path) -> None:
    root = StoreRoot(str(tmp_path))
    MessageTable(replace(root, epoch=3)).commit([_msg(1)], 1)
    plain = MessageTable(root)
    plain.commit([_msg(2)], 2)
    assert _rows(tmp_path) == [1, 2]


async def test_a_fenced_commit_loop_tells_its_owner_first_and_fails_its_waiters(tmp_path: Path) -> None:
    root = StoreRoot(str(tmp_path))
    executor = ThreadPoolExecutor(2)
    old = MessageTable(replace(root, epoch=1))
    heard: list[str] = []
    writer = GroupCommitWriter(old, executor, 1 << 20, lambda streams: heard.append(f"rollback {streams}"))
    writer.loop.on_fenced = lambda exc: heard.append("fenced")
    await writer.start()
    await writer.submit([_msg(1)])
    await asyncio.get_running_loop().run_in_executor(executor, MessageTable, replace(root, epoch=2))
    with pytest.raises(Fenced):
        await writer.submit([_msg(2)])
    assert heard == ["fenced", "rollback {'S'}"]
    assert not writer.running
    await writer.close()
    executor.shutdown()
    assert _rows(tmp_path) == [1]


def test_the_lease_gives_each_epoch_to_one_claimant(tmp_path: Path) -> None:
    a, b = LocalLease(str(tmp_path)), LocalLease(str(tmp_path))
    assert a.current() == 0
    assert a.claim(1)
    assert not b.claim(1)
    assert b.current() == 1
    beat = b.read_beat(1)
    assert beat is not None
    assert beat.pid == os.getpid()
    assert not beat.released
    assert not b.holder_gone(beat)  # this very process: alive
    a.beat(1, released=True)
    assert b.holder_gone(b.read_beat(1))
