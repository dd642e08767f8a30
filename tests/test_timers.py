"""The deadline timers (gateway/runtime/timers.py) and sequence waiters (gateway/runtime/seqwait.py)
on their own: the heap without a loop or clock, the loop driver with a fake loop and clock (what it
arms, when, and that a failing callback stops nothing), and one short run on a real loop. Also the
stream's side of them: when its next expiry is due, the durable-sequence signal a removal waits on
instead of polling; and expiry on the timers, with the delete markers it asks for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from types import SimpleNamespace
from typing import Any, cast

import pytest

from gateway.adapters.archives import Archives
from gateway.adapters.loader import MessageLoader
from gateway.adapters.publish import PublishPath
from gateway.adapters.registry import Registry
from gateway.adapters.removals import RemovalRecorder
from gateway.api.configs import StreamConfig
from gateway.engine.stream import Stream
from gateway.handlers.streams import StreamApi
from gateway.runtime.seqwait import SeqWaiters
from gateway.runtime.signals import Signal
from gateway.runtime.timers import DeadlineHeap, Timers
from storage_delta.commit.writer import WriterClosed
from storage_delta.tables.removals import RemovalLog

S = 1_000_000_000


# ---- the heap ---------------------------------------------------------------------------------


def test_heap_orders_keys_by_deadline_and_pops_what_is_due() -> None:
    heap: DeadlineHeap[str] = DeadlineHeap()
    heap.set("b", 20)
    heap.set("a", 10)
    heap.set("c", 30)
    assert heap.next_ns() == 10
    assert heap.pop_due(9) == []
    assert heap.pop_due(20) == ["a", "b"]  # earliest first, both taken off
    assert "a" not in heap
    assert len(heap) == 1
    assert heap.next_ns() == 30


def test_heap_keeps_one_deadline_per_key() -> None:
    heap: DeadlineHeap[str] = DeadlineHeap()
    heap.set("a", 10)
    heap.set("a", 50)  # replaced, not added: the old entry is skipped when it surfaces
    assert heap.get("a") == 50
    assert heap.next_ns() == 50
    assert heap.pop_due(100) == ["a"]
    assert heap.pop_due(100) == []


def test_heap_earlier_only_moves_forward() -> None:
    heap: DeadlineHeap[str] = DeadlineHeap()
    assert heap.earlier("a", 50)  # no deadline yet: set
    assert not heap.earlier("a", 60)  # later: ignored
    assert not heap.earlier("a", 50)  # the same: nothing changes
    assert heap.earlier("a", 40)
    assert heap.get("a") == 40


def test_heap_cancel_and_sweep_of_stale_entries() -> None:
    heap: DeadlineHeap[int] = DeadlineHeap()
    heap.set(1, 5)
    heap.cancel(1)
    assert heap.next_ns() is None
    assert heap.pop_due(10) == []
    for when in range(1000):  # a key moved often leaves stale entries, swept now and then
        heap.set(2, 1000 - when)
    assert len(heap._heap) <= 2 * len(heap) + 64 + 1
    assert heap.pop_due(10**9) == [2]


# ---- the loop driver, with a fake loop and clock -----------------------------------------------


class FakeLoop:
    """``time`` and ``call_at`` as the driver uses them; ``run_until`` moves both clocks and runs
    what fell due, as the event loop would."""

    def __init__(self, clock: list[int]) -> None:
        self.clock = clock
        self.armed: list[tuple[float, Callable[[], object], asyncio.TimerHandle]] = []
        self.arms = 0

    def time(self) -> float:
        return self.clock[0] / S

    def call_at(self, when: float, callback: Callable[[], object]) -> asyncio.TimerHandle:
        self.arms += 1
        handle = asyncio.TimerHandle(when, callback, (), cast(asyncio.AbstractEventLoop, _NoLoop()))
        self.armed.append((when, callback, handle))
        return handle

    def live(self) -> list[float]:
        return sorted(w for w, _, h in self.armed if not h.cancelled())

    def run_until(self, ns: int) -> None:
        while True:
            due = [(w, cb, h) for w, cb, h in self.armed if not h.cancelled() and w <= ns / S]
            if not due:
                break
            w, cb, h = min(due, key=lambda d: d[0])
            self.armed.remove((w, cb, h))
            self.clock[0] = max(self.clock[0], round(w * S))
            cb()
        self.clock[0] = ns


class _NoLoop:
    """A TimerHandle asks its loop only when cancelled (``_timer_handle_cancelled``)."""

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        pass

    def get_debug(self) -> bool:
        return False


def fake_timers(fired: list[Any], clock: list[int]) -> tuple[Timers[Any], FakeLoop]:
    loop = FakeLoop(clock)
    return Timers(fired.append, loop, lambda: clock[0]), loop


def test_driver_arms_the_loop_for_the_earliest_deadline_only() -> None:
    clock = [0]
    fired: list[str] = []
    timers, loop = fake_timers(fired, clock)
    timers.set("late", 5 * S)
    timers.set("later", 9 * S)
    assert loop.live() == [5.0]  # one loop timer, for the earliest
    timers.earlier("soon", 2 * S)
    assert loop.live() == [2.0]  # re-armed for the new earliest
    timers.earlier("late", 7 * S)  # later than its deadline: nothing moves
    assert loop.live() == [2.0]
    loop.run_until(6 * S)
    assert fired == ["soon", "late"]
    assert loop.live() == [9.0]
    loop.run_until(20 * S)
    assert fired == ["soon", "late", "later"]
    assert loop.live() == []  # nothing due: nothing armed, nothing wakes


def test_driver_sleeps_while_nothing_is_due() -> None:
    """The point of it: a key due in an hour costs one arming, not a wake-up per tick."""
    clock = [0]
    fired: list[str] = []
    timers, loop = fake_timers(fired, clock)
    timers.set("hour", 3600 * S)
    for _ in range(100):
        timers.earlier("hour", 3600 * S)  # what a hot path does per event: no re-arming
    assert loop.arms == 1
    loop.run_until(3599 * S)
    assert fired == []
    assert timers.fired == 0
    loop.run_until(3600 * S)
    assert fired == ["hour"]
    assert timers.fired == 1


def test_driver_rearms_when_the_loop_runs_it_early() -> None:
    """The loop's clock and the wall clock differ: a run before the deadline finds nothing due
    and arms again for what is left."""
    clock = [0]
    fired: list[str] = []
    timers, loop = fake_timers(fired, clock)
    timers.set("a", 10 * S)
    (_when, callback, _handle) = loop.armed.pop()
    clock[0] = 9 * S  # the loop thought it was time; the wall clock says 1 s early
    callback()
    assert fired == []
    assert loop.live() == [10.0]
    loop.run_until(10 * S)
    assert fired == ["a"]


def test_callbacks_may_set_deadlines_and_one_failing_stops_nothing() -> None:
    clock = [0]
    seen: list[str] = []
    loop = FakeLoop(clock)

    def callback(key: str) -> None:
        seen.append(key)
        if key == "bad":
            raise RuntimeError("boom")
        if key == "again" and len(seen) < 5:
            timers.set("again", clock[0] + S)  # what an expiry does: time its next run

    timers: Timers[str] = Timers(callback, loop, lambda: clock[0])
    timers.set("bad", S)
    timers.set("again", S)
    loop.run_until(10 * S)
    assert seen[:2] == ["bad", "again"]  # the failure was logged, the next key still ran
    assert seen.count("again") == 4
    assert loop.live() == []


def test_cancel_and_close() -> None:
    clock = [0]
    fired: list[str] = []
    timers, loop = fake_timers(fired, clock)
    timers.set("a", S)
    timers.set("b", 2 * S)
    timers.cancel("a")
    loop.run_until(3 * S)
    assert fired == ["b"]
    timers.set("c", 4 * S)
    timers.close()
    assert loop.live() == []  # the armed loop timer is cancelled
    timers.set("d", 5 * S)  # after close nothing is armed or run
    loop.run_until(10 * S)
    assert fired == ["b"]


async def test_on_a_real_loop_a_deadline_fires_once_when_due() -> None:
    fired: list[tuple[str, int]] = []
    done = asyncio.Event()

    def callback(key: str) -> None:
        fired.append((key, time.time_ns()))
        done.set()

    timers: Timers[str] = Timers(callback)
    try:
        due = time.time_ns() + 30_000_000
        timers.set("a", due)
        timers.set("b", due + 10 * S)
        await asyncio.wait_for(done.wait(), 5)
        assert [k for k, _ in fired] == ["a"]
        assert fired[0][1] >= due
        assert timers.fired == 1
    finally:
        timers.close()


# ---- sequence waiters -------------------------------------------------------------------------


async def test_seq_waiters_resolve_by_sequence() -> None:
    waiters = SeqWaiters()
    w5, w3, w9 = waiters.wait(5), waiters.wait(3), waiters.wait(9)
    waiters.reached(4)
    assert w3.done()
    assert not w5.done()
    assert not w9.done()
    waiters.reached(5)
    assert w5.done()
    assert len(waiters) == 1
    waiters.release()
    assert w9.done()
    assert w9.exception() is None
    assert len(waiters) == 0
    w1 = waiters.wait(1)
    waiters.fail(WriterClosed("gone"))
    with pytest.raises(WriterClosed):
        await w1


# ---- the stream's side ------------------------------------------------------------------------


def make(**cfg: Any) -> Stream:
    return Stream(StreamConfig("S", subjects=("s.>",), **cfg), 1, 1 << 20)


def test_next_expiry_is_the_earliest_of_max_age_and_ttls() -> None:
    stream = make(max_age=10 * S, allow_msg_ttl=True)
    assert stream.next_expiry_ns() is None  # empty: nothing will expire
    stream.accept("s.a", None, b"", 100 * S)
    assert stream.next_expiry_ns() == 110 * S
    stream.accept("s.b", None, b"", 101 * S)
    stream.ttl.add(2, 101 * S, 2)
    assert stream.next_expiry_ns() == 103 * S  # the TTL runs out first
    no_age = make(allow_msg_ttl=True)
    no_age.accept("s.a", None, b"", 100 * S)
    assert no_age.next_expiry_ns() is None
    no_age.ttl.add(1, 100 * S, 5)
    assert no_age.next_expiry_ns() == 105 * S


def test_next_expiry_steps_over_messages_max_age_spares() -> None:
    """``Nats-TTL: never`` outlives MaxAge: the next expiry is that of the oldest other message,
    so a timer set to it does not fire again and again for a message that stays."""
    stream = make(max_age=10 * S, allow_msg_ttl=True)
    for i in range(3):
        stream.accept("s.a", None, b"", (100 + i) * S)
    stream.ttl.add(1, 100 * S, -1)  # never
    stream.ttl.add(2, 101 * S, -1)
    assert stream.next_expiry_ns() == 112 * S
    stream.expire(112 * S)
    assert stream.state.messages == 2
    assert stream.next_expiry_ns() is None  # only the spared ones are left


def test_durable_signal_is_told_of_commits_rollbacks_and_the_end() -> None:
    stream = make()
    told: list[tuple[int, int]] = []
    stream.durable_moved.connect(lambda: told.append((stream.durable_last_seq, stream.state.last_seq)))
    for _ in range(3):
        stream.accept("s.a", None, b"", 1)
    stream.committed(1)
    stream.rollback()  # 2 and 3 failed
    stream.end()
    assert told == [(1, 3), (1, 1), (1, 1)]
    assert stream.ended


def test_removals_queued_tells_once_until_taken() -> None:
    stream = make()
    told: list[int] = []
    stream.removal_queued.connect(lambda: told.append(1))
    for _ in range(4):
        stream.accept("s.a", None, b"", 1)
    stream.committed(4)
    stream.remove(1)
    stream.remove(3)
    assert told == [1]
    assert stream.removals_queued
    assert stream.take_removals() == [(1, 1), (3, 3)]
    stream.remove(2)
    assert told == [1, 1]


# ---- a removal waiting for its message's commit ---------------------------------------------


def stream_api(storing: Callable[[], bool] = lambda: True) -> StreamApi:
    """The handler with nothing behind it: only its commit waits are exercised."""
    return StreamApi(
        cast(Registry, None),
        cast(MessageLoader, None),
        cast(RemovalRecorder, None),
        lambda e: None,
        "",
        cast(Archives, None),
        storing,
    )


def in_flight() -> Stream:
    stream = make()
    for _ in range(3):
        stream.accept("s.a", None, b"", 1)
    stream.committed(1)
    return stream


async def test_removal_wait_ends_when_the_commit_lands() -> None:
    api, stream = stream_api(), in_flight()
    wait = api._durable(stream, 3)
    stream.committed(2)
    assert not wait.done()
    stream.committed(3)
    await wait
    assert not stream.durable_moved  # listened to only while someone waits


@pytest.mark.parametrize("how", ["rollback", "deleted"])
async def test_removal_wait_is_released_by_a_rollback_or_deletion(how: str) -> None:
    api, stream = stream_api(), in_flight()
    wait = api._durable(stream, 3)
    if how == "rollback":
        stream.rollback()
    else:
        stream.end()
    await wait
    assert not stream.durable_moved


async def test_removal_wait_fails_when_the_commit_loop_died() -> None:
    """The writer rolls its streams back when its loop dies; whether the message landed is then
    unknown, so its removal is not acknowledged."""
    api, stream = stream_api(storing=lambda: False), in_flight()
    wait = api._durable(stream, 3)
    stream.rollback()
    with pytest.raises(WriterClosed):
        await wait


# ---- expiry on the timers -------------------------------------------------------------------


class Markers:
    """The publish path as the recorder sees it: ``expiring`` and ``place_markers``."""

    def __init__(self) -> None:
        self.expiring: Signal[[Stream, int]] = Signal()
        self.placed: list[tuple[str, list[str]]] = []

    def place_markers(self, stream: Stream, now: int) -> None:
        self.placed.append((stream.name, stream.markers_due))
        stream.markers_due = []


async def test_expiry_fires_when_due_and_places_markers_at_once() -> None:
    """MaxAge runs when the oldest message's time is up (not on a tick), the subject it left
    empty gets its marker in the same step, and a commit of something expiring sooner brings the
    timer forward; with nothing left to expire nothing is armed."""
    stream = make(max_age=S, subject_delete_marker_ttl=S)
    registry = SimpleNamespace(streams={"S": stream}, removal_queued=Signal(), stream_removed=Signal())
    recorder = RemovalRecorder(cast(Registry, registry), cast(RemovalLog, None), cast(Executor, None))
    publish = Markers()
    task = asyncio.create_task(recorder.run(cast(PublishPath, publish)))
    try:
        await asyncio.sleep(0)
        assert publish.expiring  # the recorder listens while its task runs
        now = time.time_ns()
        stream.accept("s.a", None, b"", now - S + 50_000_000)  # due in 50 ms
        stream.committed(1)
        recorder.stored(stream, stream.state.first_ts)
        assert recorder._expiry is not None
        assert recorder._expiry.get(stream) == now + 50_000_000
        for _ in range(100):
            if publish.placed:
                break
            await asyncio.sleep(0.01)
        assert stream.state.messages == 0
        assert publish.placed == [("S", ["s.a"])]
        assert time.time_ns() >= now + 50_000_000
        assert stream not in recorder._expiry  # nothing left: nothing armed
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not publish.expiring  # the task's end takes its listener and timers with it
    assert recorder._expiry is None
