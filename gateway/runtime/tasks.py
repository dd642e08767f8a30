"""Ownership of background tasks: whoever starts a task through a :class:`TaskOwner` has it
cancelled and awaited on shutdown, so no task outlives the gateway or dies unnoticed."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class TaskOwner:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def own(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
