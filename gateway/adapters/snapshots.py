"""Writing the streams' index snapshots (``storage_delta/index_snapshot.py``), so a restart reads
one small file per stream and the message files of the last moments instead of every file.

A snapshot may show a message as removed only once its removal is in the removal log, or a crash
after the snapshot would lose a removal the tables never learn of. So the streams are copied first
(at once, on the event loop) and the removal recorder is flushed second: everything removed up to
the copy is then durable, and only then is the copy written. A stream is written again once ``min_new`` new
messages were committed since its last snapshot, however long the stream (a restart after a crash
then reads at most about ``min_new`` messages beyond the snapshot, not a share of the stream: with
a quarter, a 1M-message stream read up to 250,000 after ``kill -9``), and at every clean stop.

A damaged snapshot (``index_snapshot.DamagedSnapshot``: recovery read the message files instead)
is reported (:attr:`Snapshots.damaged`: ``/healthz``, ``/lake``) until one is written over it,
which the next round does (``interval_s`` after the start) whatever ``min_new`` says, and a clean
stop too: the report says what is wrong now, not what was wrong once.

The first round comes right after the start, for the streams recovery read ``min_new`` or more
messages of from the message files (a writer that bypassed the gateway, a gateway killed before
its rounds): a gateway killed again before its first interval would read them all once more.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor

from gateway.adapters.registry import Registry
from gateway.adapters.removals import RemovalRecorder
from gateway.engine.stream import Stream
from storage_delta.commit.store import StoreRoot
from storage_delta.read import index_snapshot
from storage_delta.read.index_snapshot import DamagedSnapshot, IndexSnapshot

log = logging.getLogger(__name__)


class Snapshots:
    def __init__(
        self,
        registry: Registry,
        recorder: RemovalRecorder,
        root: StoreRoot,
        executor: Executor,
        interval_s: float,
        min_new: int,
        prune: bool = True,
    ) -> None:
        """``prune``: whether the snapshots of streams not served here are removed (a gateway
        that owns the whole store; per-stream ownership leaves them to their owners)."""
        self.interval_s = interval_s
        self.prune = prune
        self.min_new = min_new
        self.registry = registry
        self.recorder = recorder
        self.root = root
        self.executor = executor
        #: stream name -> (incarnation, sequence) of the newest snapshot it has
        self._taken: dict[str, tuple[int, int]] = {}
        #: stream name -> why its snapshot was found damaged, until a good one is written over it
        self.damaged: dict[str, str] = {}
        self._lock = asyncio.Lock()
        #: Set when streams were recovered after the start (per stream: claimed): their round is
        #: due at once, as a start's is (what recovery read from the files is not read again).
        self._recovered = asyncio.Event()

    def restored(self, stream: Stream, through: int, damage: DamagedSnapshot | None = None) -> None:
        """Recovery read a snapshot of the stream up to ``through`` (0: none), or found it
        ``damage``d: it is reported and written again at the next round."""
        self._taken[stream.name] = (stream.created_ns, through)
        if damage is not None:
            self.damaged[stream.name] = damage.reason

    def behind(self, stream: Stream) -> int:
        """Committed messages of ``stream`` beyond its newest snapshot: what a restart after a crash
        reads from the message files (the monitor shows it)."""
        created, through = self._taken.get(stream.name, (0, 0))
        return stream.durable_last_seq - (through if created == stream.created_ns else 0)

    def _due(self, stream: Stream, damaged: bool) -> bool:
        return (damaged and stream.name in self.damaged) or self.behind(stream) >= self.min_new

    async def take(self, every_changed: bool = False, damaged: bool = True) -> int:
        """Snapshot the streams that are due (every stream with something new, at a clean stop; not
        the ones due only for a damaged snapshot without ``damaged``); how many were written."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            streams = list(self.registry.streams.values())
            # a deleted stream's damaged snapshot is deleted with it (``remove_others``)
            self.damaged = {s.name: self.damaged[s.name] for s in streams if s.name in self.damaged}
            copies = [
                (stream.name, IndexSnapshot(stream.created_ns, *stream.stored_snapshot()))
                for stream in streams
                if self._due(stream, damaged) or (every_changed and self.behind(stream) > 0)
            ]
            if not copies:
                return 0
            await self.recorder.flush()  # every removal the copies show is durable from here on
            # per stream: none of a stream another gateway took meanwhile (its last removals may
            # be in no table, docs/architecture.md, protocol item 2)
            copies = [(name, snapshot) for name, snapshot in copies if name in self.registry.streams]
            for name, snapshot in copies:
                await loop.run_in_executor(self.executor, index_snapshot.write, self.root, name, snapshot)
                self._taken[name] = (snapshot.created, snapshot.through)
                if self.damaged.pop(name, None) is not None:
                    log.warning("index snapshot of %s written again over the damaged one", name)
            live = {s.name for s in streams} | set(self.registry.quarantine.streams)  # offline: kept
            self._taken = {name: taken for name, taken in self._taken.items() if name in live}
            if self.prune:
                await loop.run_in_executor(self.executor, index_snapshot.remove_others, self.root, live)
            return len(copies)

    def recovered(self) -> None:
        """Streams were recovered after the start (claimed): a round now."""
        self._recovered.set()

    async def run(self) -> None:
        damaged = False  # a start's or a claim's round: a damaged snapshot stays reported until the next
        while True:
            try:
                await self.take(damaged=damaged)
            except Exception:
                log.exception("writing index snapshots failed; the next round tries again")
            try:
                async with asyncio.timeout(self.interval_s):
                    await self._recovered.wait()
                damaged = False
            except TimeoutError:
                damaged = True
            self._recovered.clear()
