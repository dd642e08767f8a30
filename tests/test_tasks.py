"""Background tasks have an owner that cancels and awaits them, and a task that dies is reported
(logged with its name, kept for ``/healthz``) instead of vanishing."""

from __future__ import annotations

import asyncio

import pytest

from gateway.runtime.tasks import TaskOwner


async def test_a_task_that_dies_is_kept_with_its_exception(caplog: pytest.LogCaptureFixture) -> None:
    owner = TaskOwner()

    async def broken() -> None:
        raise ValueError("a bug in a timer")

    task = owner.own(broken(), "consumer-timer")
    await asyncio.wait([task])
    await asyncio.sleep(0)  # done-callbacks run on the next turn
    assert list(owner.failures) == ["consumer-timer"]
    assert isinstance(owner.failures["consumer-timer"], ValueError)
    assert "background task consumer-timer died" in caplog.text
    await owner.close()


async def test_close_cancels_and_awaits_without_counting_a_failure() -> None:
    owner = TaskOwner()
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    task = owner.own(forever(), "api-worker")
    await started.wait()
    await owner.close()
    assert task.cancelled()
    assert owner.failures == {}
