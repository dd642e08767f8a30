"""Ownership of background tasks: whoever starts a task through a :class:`TaskOwner` has it
cancelled and awaited on shutdown, and a task that dies is not silent: its exception is logged with
the task's name and kept in :attr:`TaskOwner.failures`, which ``/healthz`` reports (a gateway whose
timer or API worker died is alive but not healthy, and an orchestrator should restart it)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class TaskOwner:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Tasks that ended with an exception, by name, newest last.
        self.failures: dict[str, BaseException] = {}

    def own(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            name = task.get_name()
            log.error("background task %s died", name, exc_info=exc)
            self.failures.pop(name, None)
            self.failures[name] = exc

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
