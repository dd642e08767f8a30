"""Futures that wait until a sequence is reached, keyed by sequence.

Why: an answer that must wait for a commit (a removal of a message whose own commit is in flight)
should be woken by the commit itself, not find out by polling. Whoever moves the sequence calls
:meth:`SeqWaiters.reached`; whoever makes the wait pointless (a rollback took the sequences back, the
stream was deleted) calls :meth:`release`, and whoever knows it can never end calls :meth:`fail`.
"""

from __future__ import annotations

import asyncio
import heapq


class SeqWaiters:
    def __init__(self) -> None:
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._serial = 0  # ties broken by arrival, never by comparing futures

    def __len__(self) -> int:
        return len(self._heap)

    def wait(self, seq: int) -> asyncio.Future[None]:
        """A future resolved once ``seq`` is reached (or the wait is released, or failed)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._serial += 1
        heapq.heappush(self._heap, (seq, self._serial, fut))
        return fut

    def reached(self, seq: int) -> None:
        """Resolve every waiter for ``seq`` or below."""
        heap = self._heap
        while heap and heap[0][0] <= seq:
            _, _, fut = heapq.heappop(heap)
            if not fut.done():
                fut.set_result(None)

    def release(self) -> None:
        """Resolve every waiter: what they waited for will not come, and need not."""
        heap, self._heap = self._heap, []
        for _, _, fut in heap:
            if not fut.done():
                fut.set_result(None)

    def fail(self, exc: BaseException) -> None:
        """Fail every waiter with ``exc``."""
        heap, self._heap = self._heap, []
        for _, _, fut in heap:
            if not fut.done():
                fut.set_exception(exc)
