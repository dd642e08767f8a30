"""Consumer workloads: how fast each server hands a stream's messages to a consumer that acks each
one, with the same nats.js client in the same run."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench import pyconsume
from bench.stored import write_messages
from bench.targets import Target, add_stream, barrier, loadgen, wait_stream_messages
from bench.workloads import profiled, ratio_cores_allow
from storage_delta.commit.store import StoreRoot
from tests.harness import Jetlake

Result = dict[str, Any]


def _ratio(out: Result) -> float | None:
    lake, ref = out["jetlake"]["consumed_per_s"], out["jetstream"]["consumed_per_s"]
    return round(lake / ref, 3) if ref else None


def consume(
    targets: list[Target],
    mode: str,
    count: int,
    window: int,
    profile: Path | None = None,
    client: str = "js",
) -> Result:
    """A stream filled by acked publishes (its tail still warm in jetlake), then drained by one
    consumer: ``pull`` fetches batches of ``window``, ``push`` has ``window`` acks pending at most.
    ``client``: ``js`` (nats.js, the load generator) or ``py`` (nats-py)."""
    stream = f"BCONS_{mode.upper()}_{client.upper()}"
    prefix = f"bcons{mode}{client}"
    suffix = "" if client == "js" else f"_{client}"
    out: Result = {"workload": f"{mode}_consume{suffix}", "messages": count, "window": window}
    for t in targets:
        asyncio.run(add_stream(t.url, stream, [f"{prefix}.>"]))
        loadgen("pipelined", t.url, prefix, count, "json", 512)
        run = (
            partial(loadgen, mode, t.url, stream, count, "json", window)
            if client == "js"
            else partial(pyconsume.consume, mode, t.url, stream, count, window)
        )
        out[t.name] = profiled(t, profile, run)
    out["ratio"] = _ratio(out)
    out["ratio_cores_allow"] = ratio_cores_allow(out, "consumed_per_s")
    return out


def _fill_by_publishing(t: Target, prefix: str, count: int) -> None:
    """Core publishes (fast, but the server may drop some), an acked barrier that tells how many
    are stored (itself included), then acked publishes for what is missing."""
    loadgen("core", t.url, prefix, count - 1, "seq")
    stored, _ = asyncio.run(barrier(t.url, f"{prefix}.barrier"))
    if stored < count:
        loadgen("pipelined", t.url, prefix, count - stored, "seq", 1024)


def _fill_in_delta(lake: Jetlake, stream: str, prefix: str, count: int) -> None:
    """The messages written into the Delta table while the gateway is down: after the restart every
    one of them is read back from parquet, none is in the gateway's memory."""
    assert lake.stop_gateway() == 0
    ts0 = time.time_ns()  # after the stream's creation: recovery ignores rows older than that
    write_messages(StoreRoot(str(lake.data_root)), stream, f"{prefix}.x", count, ts0)
    lake.start_gateway(ready_s=3600)


def fill_stored(t: Target, lake: Jetlake, stream: str, prefix: str, count: int) -> float:
    """A new stream holding ``count`` messages, stored the fastest way each server allows; returns
    the seconds it took."""
    asyncio.run(add_stream(t.url, stream, [f"{prefix}.>"]))
    t0 = time.monotonic()
    if t.name == "jetlake":
        _fill_in_delta(lake, stream, prefix, count)
    else:
        _fill_by_publishing(t, prefix, count)
    asyncio.run(wait_stream_messages(t.url, stream, count))
    return round(time.monotonic() - t0, 1)


def catch_up(targets: list[Target], lake: Jetlake, count: int, window: int) -> Result:
    """A new pull consumer catching up on ``count`` stored messages: JetStream's from its file store,
    jetlake's from the Delta table (written there directly, then the gateway restarted)."""
    stream, prefix = "BCATCHUP", "bcatchup"
    out: Result = {"workload": "catch_up", "messages": count, "window": window}
    for t in targets:
        fill_s = fill_stored(t, lake, stream, prefix, count)
        out[t.name] = loadgen("pull", t.url, stream, count, "seq", window) | {"fill_s": fill_s}
    out["ratio"] = _ratio(out)
    return out
