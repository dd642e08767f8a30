"""Run one JetStream case against the real server and against jetlake, and compare."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import nats
from nats.aio.client import Client

from tests.harness import Jetlake, ReferenceJetStream, scrub

Case = Callable[[Client, str], Awaitable[Any]]


async def api(nc: Client, subject: str, body: Any = b"") -> dict[str, Any]:
    """A JetStream API request (``$JS.API.`` + ``subject``) and its decoded answer."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    msg = await nc.request(f"$JS.API.{subject}", data, timeout=5)
    answer: dict[str, Any] = json.loads(msg.data)
    return answer


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


async def assert_same_across_restart(
    reference: ReferenceJetStream, jetlake: Jetlake, before: Case, after: Case, name: str, kill: bool
) -> tuple[Any, Any]:
    """Run ``before`` on both servers, restart jetlake's gateway (SIGTERM, or ``kill -9`` when
    ``kill``) while the real server keeps running, then run ``after``: both steps must give the
    same answers, as a restart must change no answer. Returns the real server's two results."""
    targets = {"jetstream": reference.url, "jetlake": jetlake.url}
    first = await run_case(targets, before, name)
    await asyncio.to_thread(jetlake.kill_gateway if kill else jetlake.stop_gateway)
    await asyncio.to_thread(jetlake.start_gateway)
    second = await run_case(targets, after, name)
    assert first["jetlake"] == first["jetstream"]
    assert second["jetlake"] == second["jetstream"]
    return first["jetstream"], second["jetstream"]
