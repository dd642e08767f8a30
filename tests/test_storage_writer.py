"""The group-commit writer on a real table: batching, answer order, bounded memory."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest

from storage_delta.commit.loop import CommitLoopDied
from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import (
    GroupCommitWriter,
    MessageTable,
    StoredMessage,
    WriterClosed,
    WriterOverloaded,
)
from tests.test_storage_hazards import message, seqs_in_table


def record_answer(answered: list[int], seq: int, fut: asyncio.Future[None]) -> None:
    if fut.exception() is None:
        answered.append(seq)


async def test_batches_answer_in_order_and_memory_is_bounded(tmp_path: Path) -> None:
    root = StoreRoot(str(tmp_path / "root"))
    answered: list[int] = []
    with ThreadPoolExecutor(1) as pool:
        # room for 100 messages waiting; the first submit goes out alone, the rest queue behind it
        writer = GroupCommitWriter(
            MessageTable(root), pool, sum(message("S", s).nbytes for s in range(1, 101)), lambda streams: None
        )
        await writer.start()
        queued: list[StoredMessage] = []
        for seq in range(1, 150):
            m = message("S", seq)
            try:
                fut = writer.submit([m])
            except WriterOverloaded:
                break
            fut.add_done_callback(partial(record_answer, answered, seq))
            queued.append(m)
        assert writer.refused == 1
        assert len(queued) == 100
        with pytest.raises(WriterOverloaded):
            writer.submit([message("S", 999)])
        assert writer.refused == 2
        await writer.close()
    assert answered == list(range(1, 101))
    assert writer.loop.commits < 100  # the queued messages went out together
    assert seqs_in_table(root) == {"S": list(range(1, 101))}


async def test_closed_writer_refuses(tmp_path: Path) -> None:
    with ThreadPoolExecutor(1) as pool:
        writer = GroupCommitWriter(
            MessageTable(StoreRoot(str(tmp_path / "r"))), pool, 1 << 20, lambda s: None
        )
        await writer.start()
        await writer.close()
        with pytest.raises(WriterClosed):
            writer.submit([message("S", 1)])
    await asyncio.sleep(0)


async def test_admitted_messages_count_once(tmp_path: Path) -> None:
    """The publish path admits a message's bytes before its stream gives it a sequence and submits
    it later in the same step: the bound applies at admission, and the submit adds nothing."""
    with ThreadPoolExecutor(1) as pool:
        m = message("S", 1)
        writer = GroupCommitWriter(
            MessageTable(StoreRoot(str(tmp_path / "r"))), pool, 2 * m.nbytes, lambda s: None
        )
        await writer.start()
        writer.admit(m.nbytes)
        writer.admit(m.nbytes)
        with pytest.raises(WriterOverloaded):
            writer.admit(1)
        assert writer.refused == 1
        writer.unadmit(m.nbytes)  # the stream refused the second one after all
        done = writer.submit([m], admitted=True)
        writer.admit(m.nbytes)  # room for exactly one more: the submit counted nothing again
        writer.unadmit(m.nbytes)
        await done
        await writer.close()
    assert writer.refused == 1


class _DyingTable(MessageTable):
    """A table whose commit fails and which then cannot even say what landed: the commit loop has
    no way on and ends."""

    def __init__(self) -> None:
        self.asked = 0

    def last_txn_version(self) -> int:
        self.asked += 1
        if self.asked > 1:
            raise OSError("store unreachable")
        return 0

    def commit(self, batch: list[StoredMessage], version: int) -> frozenset[str]:
        raise OSError("write failed")

    def close(self) -> None:
        pass


async def test_a_dead_commit_loop_fails_its_waiters_and_rolls_back() -> None:
    """Nothing waits for a commit whose outcome cannot be known: the batch in flight and what
    queued behind it fail with CommitLoopDied (publishers get 503/10077), their streams roll back,
    the loop stops loudly (``running`` False, which /healthz reports) and the writer takes nothing
    more, so no sequence is given out twice."""
    rolled_back: list[set[str]] = []
    with ThreadPoolExecutor(1) as pool:
        writer = GroupCommitWriter(_DyingTable(), pool, 1 << 20, rolled_back.append)
        await writer.start()
        first = writer.submit([message("S", 1)])
        await asyncio.sleep(0)  # the loop takes the first batch
        second = writer.submit([message("T", 1)])
        results = await asyncio.gather(first, second, return_exceptions=True)
        assert [type(r) for r in results] == [CommitLoopDied, CommitLoopDied]
        assert rolled_back == [{"S", "T"}]
        assert not writer.running
        with pytest.raises(WriterClosed):
            writer.submit([message("S", 2)])
        await writer.close()
