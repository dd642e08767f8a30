"""Moving removals into the durable removal log, and MaxAge and TTL expiry when they are due.

Explicit removals (MSG.DELETE, PURGE) are answered only after ``flush`` made them durable. Removals
the limits cause (MaxMsgs, MaxBytes, MaxAge, per subject) are made durable by the recorder's task
``FLUSH_S`` (5 s) after the first of them was queued; if the gateway dies before that, recovery
re-applies the limits from the config and the stored messages, which removes them again
(docs/storage.md).

Expiry runs per stream on a deadline timer (``gateway.runtime.timers``) armed for the stream's next
expiry (``Stream.next_expiry_ns``): set again after each run, brought forward when a commit stores
something that expires sooner (``PublishPath.expiring``), set anew when the config changes. The
delete markers an expiry asks for (ADR-43) are placed right after it, by the publish path. Nothing
wakes while nothing is due.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor

from gateway.adapters.publish import PublishPath
from gateway.adapters.registry import Registry
from gateway.api.timefmt import now_ns
from gateway.engine.stream import Stream
from gateway.runtime.timers import Timers
from storage_delta.commit.owner import LeftOutThenFailed, StreamFenced
from storage_delta.tables.removals import Removal, RemovalLog

log = logging.getLogger(__name__)

FLUSH_S = 5.0


class RemovalRecorder:
    def __init__(self, registry: Registry, removal_log: RemovalLog, executor: Executor) -> None:
        self.registry = registry
        self.log = removal_log
        self.executor = executor
        self._lock = asyncio.Lock()
        self._unwritten: list[Removal] = []  # taken from the streams, not yet durable
        self._queued = asyncio.Event()  # some stream has removals for the log
        registry.removal_queued.connect(self._queued.set)
        registry.stream_removed.connect(self._stream_removed)
        self._publish: PublishPath | None = None
        self._expiry: Timers[Stream] | None = None  # while ``run`` runs
        #: Told of the streams a removal commit found fenced (per-stream ownership).
        self.on_stream_fenced: Callable[[frozenset[str]], None] | None = None

    async def flush(self) -> None:
        """Make every removal so far durable; raises when the commit fails (they are retried)."""
        async with self._lock:
            for stream in self.registry.streams.values():
                self._unwritten.extend(
                    Removal(stream.name, stream.created_ns, first, last)
                    for first, last in stream.take_removals()
                )
            if not self._unwritten:
                return
            loop = asyncio.get_running_loop()
            try:
                left_out = await loop.run_in_executor(self.executor, self.log.append, self._unwritten)
            except LeftOutThenFailed as exc:  # the other streams' rows are retried, not these
                self._left_out(exc.streams)
                raise
            self._unwritten = []
            if left_out:
                self._left_out(left_out)
                raise StreamFenced(left_out)

    def _left_out(self, streams: frozenset[str]) -> None:
        """Per-stream ownership: a newer owner fenced ``streams`` in the removal log. Their
        removals are dropped (the new owner recovered the stream without them and applies the
        limits again), the streams leave this gateway (``on_stream_fenced``), before any index
        snapshot of them could be written without the removal it omits (docs/architecture.md,
        protocol item 2), and whoever waited for this flush hears the error."""
        self._unwritten = [r for r in self._unwritten if r.stream not in streams]
        if self.on_stream_fenced is not None:
            self.on_stream_fenced(streams)

    async def run(self, publish: PublishPath) -> None:
        """The owned task: expiry timers for every stream while it runs (they stop with it), and
        limit removals recorded ``FLUSH_S`` after they were queued."""
        self._publish = publish
        self._expiry = Timers(self._expire)
        stop_listening = publish.expiring.connect(self.stored)
        try:
            for stream in list(self.registry.streams.values()):
                self.changed(stream)  # recovery applied the limits: markers, the next expiry
            while True:
                await self._queued.wait()
                await asyncio.sleep(FLUSH_S)  # what comes meanwhile goes in the same commit
                self._queued.clear()
                try:
                    await self.flush()
                except StreamFenced:
                    pass  # those streams left this gateway; the others' removals landed
                except Exception:
                    log.exception("recording removals failed; retrying")
                    self._queued.set()
                if any(s.removals_queued for s in self.registry.streams.values()):
                    self._queued.set()  # above the durable sequence: once their commit landed
        finally:
            stop_listening()
            self._publish = None
            self._expiry.close()
            self._expiry = None

    # ---- expiry ---------------------------------------------------------------------------------

    def stored(self, stream: Stream, first_ts: int) -> None:
        """A commit stored messages from ``first_ts`` on, on a stream with MaxAge or TTLs: the
        timer comes forward to the earliest any of them (or a new TTL) can expire. O(1), for the
        commit path: a message MaxAge does not apply to (``Nats-TTL: never``) only makes it early."""
        if self._expiry is None:
            return
        when = stream.ttl.next_ns()
        max_age = stream.limits.max_age
        if max_age:
            when = first_ts + max_age if when is None else min(when, first_ts + max_age)
        if when is not None:
            self._expiry.earlier(stream, when)

    def changed(self, stream: Stream) -> None:
        """The stream's limits were applied anew (start-up, a config update): place the markers
        that asked for, and time the next expiry from scratch (MaxAge may have changed)."""
        if self._expiry is None:
            return
        self._place_markers(stream)
        when = stream.next_expiry_ns()
        if when is None:
            self._expiry.cancel(stream)
        else:
            self._expiry.set(stream, when)

    def _expire(self, stream: Stream) -> None:
        """The timer: remove what ran out, place the markers that leaves due, time the next run."""
        if self.registry.streams.get(stream.name) is not stream:
            return  # deleted (its timer was cancelled; this is a run already under way)
        stream.expire(now_ns())
        self.changed(stream)

    def _place_markers(self, stream: Stream) -> None:
        if stream.markers_due and self._publish is not None:
            self._publish.place_markers(stream, now_ns())

    def _stream_removed(self, stream: Stream) -> None:
        if self._expiry is not None:
            self._expiry.cancel(stream)
