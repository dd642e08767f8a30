"""The one commit loop's policy: order, grouping, the failure policy and that no waiter ever hangs.

The loop is driven with a commit function that records what it was given and fails on command, so
each rule can be shown on its own; the writers built on it are tested over real tables in
tests/test_storage_writer.py, tests/test_acklog.py and tests/test_storage_hazards.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from storage_delta.commit.loop import CommitLoop, CommitLoopDied


class Table:
    """What a table would hold: versions and their rows; ``fail`` makes the next commits raise."""

    def __init__(self) -> None:
        self.versions: dict[int, list[int]] = {}
        self.fail = 0
        self.land_then_fail = False

    def commit(self, rows: list[int], version: int) -> None:
        if self.land_then_fail:
            self.land_then_fail = False
            self.versions[version] = list(rows)
            raise OSError("reset after the commit landed")
        if self.fail:
            self.fail -= 1
            raise OSError("disk full")
        assert version not in self.versions, "a version committed twice"
        self.versions[version] = list(rows)

    def committed_version(self) -> int:
        return max(self.versions, default=0)

    @property
    def rows(self) -> list[int]:
        return [r for v in sorted(self.versions) for r in self.versions[v]]


def make(
    table: Table,
    pool: ThreadPoolExecutor,
    linger_s: float = 0.0,
    retry_s: float = 0.0,
    drained: Callable[[list[int]], None] | None = None,
    committed: Callable[[list[int]], None] | None = None,
) -> tuple[CommitLoop[int], list[list[int]]]:
    failed: list[list[int]] = []
    loop: CommitLoop[int] = CommitLoop(
        "test",
        pool,
        table.commit,
        table.committed_version,
        lambda rows, _e: failed.append(rows),
        linger_s=linger_s,
        retry_s=retry_s,
        drained=drained,
        committed=committed,
    )
    return loop, failed


def raises_once() -> Callable[[list[int]], None]:
    """An owner's hook with a bug that shows once: the first call raises."""
    calls: list[list[int]] = []

    def hook(rows: list[int]) -> None:
        calls.append(rows)
        if len(calls) == 1:
            raise RuntimeError("a bug")

    return hook


def put(loop: CommitLoop[int], *rows: int) -> asyncio.Future[None]:
    loop.pending.extend(rows)
    fut = loop.queued(sync=True, added=len(rows))
    assert fut is not None
    return fut


async def test_rows_land_in_order_and_group_while_a_commit_is_in_flight() -> None:
    table = Table()
    with ThreadPoolExecutor(1) as pool:
        loop, failed = make(table, pool)
        await loop.start()
        futs = [put(loop, i) for i in range(50)]
        await asyncio.gather(*futs)
        await loop.close()
    assert table.rows == list(range(50))
    assert len(table.versions) < 50  # what queued behind the first commit went out together
    assert loop.commits == len(table.versions)
    assert failed == []


async def test_a_failure_fails_the_batch_and_what_queued_behind_it() -> None:
    """retry_s 0: the first error is final; the rows behind it fail too (they could depend on it),
    the owner hears of all of them, and the loop goes on with the next rows."""
    table = Table()
    table.fail = 1
    with ThreadPoolExecutor(1) as pool:
        loop, failed = make(table, pool)
        await loop.start()
        first = put(loop, 1)
        second = put(loop, 2)
        await asyncio.wait([first, second])
        assert isinstance(first.exception(), OSError)
        assert isinstance(second.exception(), OSError)
        await put(loop, 3)
        await loop.close()
    assert sorted(r for rows in failed for r in rows) == [1, 2]
    assert table.rows == [3]
    assert loop.failures == 1


async def test_a_failed_commit_is_retried_with_the_same_version_within_retry_s() -> None:
    table = Table()
    table.fail = 2
    with ThreadPoolExecutor(1) as pool:
        loop, failed = make(table, pool, retry_s=5.0)
        await loop.start()
        await put(loop, 1)
        await loop.close()
    assert table.versions == {1: [1]}
    assert failed == []


async def test_a_commit_that_landed_despite_an_error_counts_as_committed() -> None:
    table = Table()
    table.land_then_fail = True
    with ThreadPoolExecutor(1) as pool:
        loop, failed = make(table, pool)
        await loop.start()
        await put(loop, 1)
        await put(loop, 2)
        await loop.close()
    assert table.versions == {1: [1], 2: [2]}
    assert failed == []


async def test_a_broken_loop_fails_its_waiters_and_starts_over() -> None:
    """A fault of the loop itself before the commit (here the owner's ``drained`` hook raises once)
    does not leave a waiter hanging: it fails with CommitLoopDied, the owner hears of the rows (they
    were not stored), and the loop starts over and takes new rows."""
    table = Table()
    with ThreadPoolExecutor(1) as pool:
        loop, failed = make(table, pool, drained=raises_once())
        await loop.start()
        with pytest.raises(CommitLoopDied):
            await asyncio.wait_for(put(loop, 1), 5)
        await asyncio.wait_for(put(loop, 2), 5)
        assert loop.restarts == 1
        await loop.close()
    assert table.rows == [2]
    assert failed == [[1]]


async def test_a_break_after_the_commit_landed_answers_its_waiters_as_committed() -> None:
    """What broke came after the commit (the ``committed`` hook): the table holds the version, so
    the waiter is answered and nothing is rolled back (its sequences must not be given out again)."""
    table = Table()
    with ThreadPoolExecutor(1) as pool:
        loop, failed = make(table, pool, committed=raises_once())
        await loop.start()
        await asyncio.wait_for(put(loop, 1), 5)
        await asyncio.wait_for(put(loop, 2), 5)
        assert loop.restarts == 1
        await loop.close()
    assert table.versions == {1: [1], 2: [2]}
    assert failed == []


async def test_waiters_fail_when_the_task_is_cancelled() -> None:
    """The task ending any other way than close (cancelled here) fails every waiter at once, and a
    later sync row fails at once too instead of waiting for a loop that is gone."""
    table = Table()
    table.fail = 1000  # the commit is being retried when the task goes
    with ThreadPoolExecutor(1) as pool:
        loop, _failed = make(table, pool, retry_s=60.0)
        await loop.start()
        barrier = put(loop, 1)
        await asyncio.sleep(0.2)
        assert not barrier.done()
        assert loop._task is not None
        loop._task.cancel()
        with pytest.raises(CommitLoopDied):
            await asyncio.wait_for(barrier, 5)
        with pytest.raises(CommitLoopDied):
            await asyncio.wait_for(put(loop, 2), 5)
        assert not loop.running


async def test_rows_without_a_waiter_linger_for_company() -> None:
    table = Table()
    with ThreadPoolExecutor(1) as pool:
        loop, _failed = make(table, pool, linger_s=0.2)
        await loop.start()
        for i in range(10):
            loop.pending.append(i)
            loop.queued(sync=False)
            await asyncio.sleep(0.005)
        await loop.flush()
        await loop.close()
    assert table.versions == {1: list(range(10))}
