"""Run one JetStream case against the real server and against jetlake, and compare."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import nats
from nats.aio.client import Client

from tests.harness import scrub

Case = Callable[[Client, str], Awaitable[Any]]


async def run_case(targets: dict[str, str], case: Case, name: str) -> dict[str, Any]:
    """The case's observable result on each target (same stream name, separate servers)."""
    results: dict[str, Any] = {}
    for target, url in targets.items():
        nc = await nats.connect(url)
        try:
            results[target] = scrub(await case(nc, name))
        finally:
            await nc.close()
    return results


async def assert_same(targets: dict[str, str], case: Case, name: str) -> Any:
    """Assert both servers give the same observable result, and return it for further checks."""
    results = await run_case(targets, case, name)
    assert results["jetlake"] == results["jetstream"], (
        f"jetlake:   {results['jetlake']!r}\njetstream: {results['jetstream']!r}"
    )
    return results["jetstream"]
