"""Moving removals into the durable removal log, and MaxAge on a timer.

Explicit removals (MSG.DELETE, PURGE) are answered only after ``flush`` made them durable. Removals
the limits cause (MaxMsgs, MaxBytes, MaxAge, per subject) are made durable by the same task within
``FLUSH_EVERY`` ticks (5 s); if the gateway dies before that, recovery re-applies the limits from the
config and the stored messages, which removes them again (docs/storage.md).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor

from gateway.adapters.registry import Registry
from gateway.api.timefmt import now_ns
from storage_delta.tables.removals import Removal, RemovalLog

log = logging.getLogger(__name__)

TICK_S = 0.1
FLUSH_EVERY = 50


class RemovalRecorder:
    def __init__(self, registry: Registry, removal_log: RemovalLog, executor: Executor) -> None:
        self.registry = registry
        self.log = removal_log
        self.executor = executor
        self._lock = asyncio.Lock()
        self._unwritten: list[Removal] = []  # taken from the streams, not yet durable

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
            await loop.run_in_executor(self.executor, self.log.append, self._unwritten)
            self._unwritten = []

    async def run(self) -> None:
        """Expire messages past MaxAge every tick; record limit removals every FLUSH_EVERY ticks."""
        ticks = 0
        while True:
            await asyncio.sleep(TICK_S)
            now = now_ns()
            for stream in list(self.registry.streams.values()):
                stream.expire(now)
            ticks += 1
            if ticks % FLUSH_EVERY == 0:
                try:
                    await self.flush()
                except Exception:
                    log.exception("recording removals failed; retrying")
