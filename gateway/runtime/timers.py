"""Deadline timers: a callback runs for a key when the key's deadline is due, on one event-loop timer.

Why not a loop that wakes every few milliseconds and looks: an idle gateway would wake for nothing
dozens of times a second, and whatever falls due waits for the next tick. Here each key's deadline
sits in a heap (:class:`DeadlineHeap`, pure) and :class:`Timers` arms the event loop's own timer
(``loop.call_at``) for the earliest one only: the process sleeps until something is due, and a
deadline set earlier than the armed one re-arms it.

Deadlines are wall-clock nanoseconds (``time.time_ns``), the clock of the message times and the
consumer deadlines they come from; the loop's timer runs on the monotonic clock, so each arming
converts the distance. A callback that runs early (the wall clock was stepped back) finds nothing
due and sets its deadline again; one that runs late because the wall clock was stepped forward runs
once the monotonic distance has passed.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

NS = 1_000_000_000
#: Replaced and cancelled entries left in the heap beyond this many (and beyond twice the live
#: ones) are swept out, so keys whose deadlines move often do not grow it.
STALE_SLACK = 64


class DeadlineHeap(Generic[K]):
    """At most one deadline per key, earliest first; no I/O, no clock. A replaced or cancelled
    deadline stays in the heap until it surfaces (or a sweep), and is skipped then."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, K]] = []
        self._live: dict[K, tuple[int, int]] = {}  # key -> (deadline, serial) of its heap entry
        self._serial = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: K) -> bool:
        return key in self._live

    def get(self, key: K) -> int | None:
        """The key's deadline, None when it has none."""
        entry = self._live.get(key)
        return entry[0] if entry is not None else None

    def set(self, key: K, when_ns: int) -> None:
        """Make ``when_ns`` the key's deadline, replacing any it had."""
        entry = self._live.get(key)
        if entry is not None and entry[0] == when_ns:
            return
        self._serial += 1
        self._live[key] = (when_ns, self._serial)
        heapq.heappush(self._heap, (when_ns, self._serial, key))
        if len(self._heap) > 2 * len(self._live) + STALE_SLACK:
            self._sweep()

    def earlier(self, key: K, when_ns: int) -> bool:
        """Set the deadline only if the key has none or a later one; whether it did."""
        entry = self._live.get(key)
        if entry is not None and entry[0] <= when_ns:
            return False
        self.set(key, when_ns)
        return True

    def cancel(self, key: K) -> None:
        self._live.pop(key, None)

    def next_ns(self) -> int | None:
        """The earliest deadline, None when there is none."""
        heap, live = self._heap, self._live
        while heap:
            when, serial, key = heap[0]
            if live.get(key) == (when, serial):
                return when
            heapq.heappop(heap)
        return None

    def pop_due(self, now_ns: int) -> list[K]:
        """The keys whose deadline is at or before ``now_ns``, earliest first, their deadlines
        taken off."""
        heap, live = self._heap, self._live
        due: list[K] = []
        while heap and heap[0][0] <= now_ns:
            when, serial, key = heapq.heappop(heap)
            if live.get(key) == (when, serial):
                del live[key]
                due.append(key)
        return due

    def _sweep(self) -> None:
        self._heap = [(when, serial, key) for key, (when, serial) in self._live.items()]
        heapq.heapify(self._heap)


class TimerLoop(Protocol):
    """What :class:`Timers` needs of an event loop (tests pass a fake one)."""

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], object]) -> asyncio.TimerHandle: ...


class Timers(Generic[K]):
    """Calls ``callback(key)`` once a key's deadline is due (its deadline is taken off first; the
    callback sets a new one if the key is due again later). One loop timer is armed, for the
    earliest deadline. A callback that raises is logged and the others still run.

    The owner calls :meth:`close` when it stops (it cancels the armed timer, and nothing runs
    after it): :class:`Timers` starts no task, so there is nothing else to await.
    """

    def __init__(
        self,
        callback: Callable[[K], None],
        loop: TimerLoop | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self._callback = callback
        self._loop: TimerLoop = loop if loop is not None else asyncio.get_running_loop()
        self._clock = clock
        self._heap: DeadlineHeap[K] = DeadlineHeap()
        self._handle: asyncio.TimerHandle | None = None
        self._armed_ns: int | None = None  # the deadline the loop timer is armed for
        self._firing = False
        self._closed = False
        self.fired = 0  # loop timer callbacks run (what a test or the monitor may count)

    def __len__(self) -> int:
        return len(self._heap)

    def __contains__(self, key: K) -> bool:
        return key in self._heap

    def get(self, key: K) -> int | None:
        return self._heap.get(key)

    def set(self, key: K, when_ns: int) -> None:
        """Make ``when_ns`` the key's deadline (a deadline in the past is due at once)."""
        if self._closed:
            return
        self._heap.set(key, when_ns)
        self._arm()

    def earlier(self, key: K, when_ns: int) -> None:
        """Bring the key's deadline forward to ``when_ns`` (or give it one); a later one is ignored.
        Cheap when nothing changes, so hot paths may call it for every event."""
        if self._closed:
            return
        if self._heap.earlier(key, when_ns):
            self._arm()

    def cancel(self, key: K) -> None:
        self._heap.cancel(key)  # the loop timer stays armed; it finds nothing and re-arms

    def close(self) -> None:
        self._closed = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._heap = DeadlineHeap()

    def _arm(self) -> None:
        if self._firing or self._closed:
            return  # _fire arms once its callbacks have run
        when = self._heap.next_ns()
        if when == self._armed_ns and self._handle is not None:
            return
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._armed_ns = when
        if when is not None:
            delay = max(0, when - self._clock()) / NS
            self._handle = self._loop.call_at(self._loop.time() + delay, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._armed_ns = None
        self.fired += 1
        self._firing = True
        try:
            for key in self._heap.pop_due(self._clock()):
                if self._closed:
                    return
                try:
                    self._callback(key)
                except Exception:
                    log.exception("timer callback for %r failed", key)
        finally:
            self._firing = False
            self._arm()
