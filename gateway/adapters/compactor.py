"""Continuous compaction in the gateway: a stream's recent commit files merged in the background
(``storage_delta/maintenance/recent.py``), so a stream written one message per commit does not leave a
parquet file per message for restarts and readers to open.

The task sleeps until the publish path has told it of ``min_files`` committed runs of some stream
(``PublishPath.files_added``: each adds a file to the stream's partition), then runs one round for the
streams that are due, on the executor, and waits at least ``interval_s`` before the next, so that under
a steady sync publisher a round merges many files rather than a few. A round reads at most
``ROUND_FILES`` files; when there is more to do the next round follows at once (a wait would cap the
compaction at ``ROUND_FILES`` a round plus an interval, below a sync publisher's rate on a loaded
machine, and the small files then pile up for every restart and cold read to open). At start it runs one
round for every stream: a crash, or a process with compaction off, may have left small files. A stream
that gained files and then none for ``idle_s`` (and every stream at start) gets idle rounds
(``recent.py``: a block's small files merged further), one after another while they merge something, on
a timer set for the stream that went quiet first; once none is left unsettled, ``settled`` checkpoints
the table if it has versions past its checkpoint, so that readers of the quiet table read one file. A
round that fails on the store (full, unreachable, a log listing that kept racing commits) is logged and
tried again after the interval; the files stay as they were, which is correct, only slower to read.
Anything else the task raises ends it, and ``/healthz`` reports it (``TaskOwner``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass

from gateway.adapters.publish import PublishPath
from gateway.adapters.registry import Registry
from gateway.engine.stream import Stream
from storage_delta.commit.store import StoreRoot
from storage_delta.maintenance.recent import Compaction, RoundFailed

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """How a stream's latest compaction round went, for the monitor."""

    ended_ns: int  # Unix ns
    seconds: float
    files_merged: int  # files the round removed (over all the streams it took)
    error: str  # empty when the round succeeded


class Compactor:
    def __init__(
        self,
        registry: Registry,
        root: StoreRoot,
        executor: Executor,
        min_files: int,
        max_file_bytes: int,
        interval_s: float,
        idle_s: float,
        settled: Callable[[], object],
    ) -> None:
        if min_files < 2:
            raise ValueError(f"compact_min_files is {min_files}: 0 (off) or at least 2")
        self.registry = registry
        self.root = root
        self.executor = executor
        self.min_files = min_files
        self.max_file_bytes = max_file_bytes
        self.interval_s = interval_s
        self.idle_s = idle_s
        #: called on the executor once idle rounds are done (the ``messages`` checkpoint)
        self._settled = settled
        self._compaction = Compaction(root)
        #: stream name -> when (monotonic) its commits last added a file, until its idle rounds ran
        self._settling: dict[str, float] = {}
        #: stream name -> files its commits added since its last round
        self._added: dict[str, int] = {}
        self._due = asyncio.Event()
        #: stream name -> its latest round; and rounds run, failed, files merged in all (the
        #: monitor reads these)
        self.last: dict[str, RoundRecord] = {}
        self.rounds = 0
        self.failed_rounds = 0
        self.files_merged = 0

    def added(self, stream: Stream) -> None:
        """A commit added a file to ``stream``'s partition. O(1): called for every committed run."""
        count = self._added.get(stream.name, 0) + 1
        self._added[stream.name] = count
        if count == self.min_files or not self._settling:
            self._due.set()  # a round, or (nothing settling) the idle timer's wait starts now
        self._settling[stream.name] = time.monotonic()

    def recovered(self, names: Iterable[str]) -> None:
        """Streams recovered after the start (claimed): a round for them, as a start has."""
        now = time.monotonic()
        for name in names:
            self._added[name] = max(self._added.get(name, 0), self.min_files)
            self._settling[name] = now
        self._due.set()

    def _stream_removed(self, stream: Stream) -> None:
        self._added.pop(stream.name, None)
        self._settling.pop(stream.name, None)
        self.last.pop(stream.name, None)

    async def run(self, publish: PublishPath) -> None:
        """The owned task: one round for every stream, then a round whenever streams are due."""
        listening = (
            publish.files_added.connect(self.added),
            self.registry.stream_removed.connect(self._stream_removed),
        )
        try:
            names = set(self.registry.streams)  # none per stream: claimed ones come by recovered()
            self._settling.update(dict.fromkeys(names, time.monotonic()))
            while True:
                if names and not (await self.compact(names))[1]:  # caught up: the rest, next round
                    await asyncio.sleep(self.interval_s)
                names = await self._next_due()
        finally:
            for disconnect in listening:
                disconnect()

    async def _next_due(self) -> set[str]:
        """The streams of the next round, once some have ``min_files`` new files; meanwhile the idle
        rounds of the streams whose last file is ``idle_s`` old, at most one pass an ``interval_s``
        (streams that go quiet one after another are settled together), and the checkpoint once no
        stream is left unsettled (a table that keeps a trickle somewhere is checkpointed by its
        commits' interval only)."""
        next_pass = 0.0
        while True:
            wait = None
            if self._settling:
                due = max(min(self._settling.values()) + self.idle_s, next_pass)
                wait = max(0.0, due - time.monotonic())
            try:
                async with asyncio.timeout(wait):
                    await self._due.wait()
            except TimeoutError:
                quiet = time.monotonic() - self.idle_s
                idle = {name for name, last in self._settling.items() if last <= quiet}
                for name in idle:
                    del self._settling[name]
                while idle and (await self.compact(idle, idle=True))[0]:  # each merge may make a new run
                    if self._due.is_set():  # busy streams' rounds first; these settle at the next pass
                        self._settling.update(dict.fromkeys(idle, quiet))
                        break
                if not self._settling:
                    await asyncio.get_running_loop().run_in_executor(self.executor, self._settled)
                next_pass = time.monotonic() + self.interval_s
                continue
            self._due.clear()
            names = {name for name, count in self._added.items() if count >= self.min_files}
            for name in names:
                del self._added[name]
            return names

    async def compact(self, names: set[str], idle: bool = False) -> tuple[int, bool]:
        """One round for the streams ``names`` (those still live; ``idle``: an idle round): the
        files it removed, and whether the next may follow at once (it left work). A failed round
        marks the streams due again too, but after the interval: a failure that lasts (a damaged
        file until repair) must not turn the task into a busy loop."""
        created = {n: s.created_ns for n in names if (s := self.registry.streams.get(n)) is not None}
        if not created:
            return 0, False
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        try:
            removed, more = await loop.run_in_executor(
                self.executor, self._compaction.round, created, self.min_files, self.max_file_bytes, idle
            )
        except RoundFailed as exc:
            log.exception("compacting %s failed; trying again after the interval", sorted(created))
            self._record(created, t0, 0, str(exc) or type(exc).__name__)
            self._due_again(created)
            return 0, False
        self._record(created, t0, removed, "")
        if removed:
            log.info("compaction merged %d files of %s", removed, sorted(created))
        if more:
            self._due_again(created)
        return removed, more

    def _record(self, names: Iterable[str], t0: float, removed: int, error: str) -> None:
        record = RoundRecord(time.time_ns(), time.monotonic() - t0, removed, error)
        self.rounds += 1
        self.failed_rounds += bool(error)
        self.files_merged += removed
        for name in names:
            if name in self.registry.streams:
                self.last[name] = record

    def _due_again(self, names: Iterable[str]) -> None:
        for name in names:
            self._added[name] = max(self._added.get(name, 0), self.min_files)
        self._due.set()
