"""``sync_cost``: what putting every acknowledgement on stable storage costs, on both servers.

Synchronous publish (PubAck p50/p99, one message in flight) and pipelined acked publish (messages
per second) against four servers, one after the other on the same disk: JetStream with its default
(``sync_interval`` 2 min) and with ``jetstream { sync_interval: always }``, jetlake with its default
(``always``) and with ``sync_interval = "2m"``. The first and the third are the run's usual targets.

Ratios: ``ratio_*`` jetlake over JetStream, both syncing every write; ``cost_*`` each server's
``always`` over its relaxed setting (how much the sync costs it). ``sync_cpu_us_per_msg``: the CPU
time each process of a server (jetlake: its gateway and its hub) spent per synchronous publish,
a cost that a busy machine disturbs far less than a latency (#23).
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

from bench.targets import Target, add_stream, loadgen
from bench.workloads import cpu_seconds
from tests.harness import Jetlake, ReferenceJetStream

Result = dict[str, Any]
STREAM, PREFIX = "BSYNCCOST", "bsynccost"


def _publish(url: str, pids: dict[str, int], sync: int, pipelined: int, window: int) -> Result:
    """``pids``: the server's processes by role, whose CPU time the synchronous publishes are
    charged with."""
    asyncio.run(add_stream(url, STREAM, [f"{PREFIX}.>"]))
    loadgen("sync", url, PREFIX, min(sync, 50), "json")  # warm-up: connections, caches
    before = {role: cpu_seconds(pid) for role, pid in pids.items()}
    latency = loadgen("sync", url, PREFIX, sync, "json")
    cpu = {role: round((cpu_seconds(pid) - before[role]) * 1e6 / sync, 1) for role, pid in pids.items()}
    rate = loadgen("pipelined", url, PREFIX, pipelined, "json", window)
    return {
        "p50_ms": latency["p50_ms"],
        "p99_ms": latency["p99_ms"],
        "sync_cpu_us_per_msg": cpu,
        "acked_per_s": rate["acked_per_s"],
    }


def _pid(proc: subprocess.Popen[bytes] | None) -> int:
    assert proc is not None
    return proc.pid


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def sync_cost(targets: list[Target], workdir: Path, sync: int, pipelined: int, window: int) -> Result:
    out: Result = {"workload": "sync_cost", "sync_messages": sync, "pipelined_messages": pipelined}
    by_name = {t.name: t for t in targets}
    js, lake = by_name["jetstream"], by_name["jetlake"]
    out["jetstream_default"] = _publish(js.url, js.processes(), sync, pipelined, window)
    synced_js = ReferenceJetStream(workdir / "jetstream-always", sync_interval="always")
    synced_js.start()
    try:
        pids = {"server": _pid(synced_js.proc)}
        out["jetstream_always"] = _publish(synced_js.url, pids, sync, pipelined, window)
    finally:
        synced_js.stop()
    out["jetlake_always"] = _publish(lake.url, lake.processes(), sync, pipelined, window)
    relaxed = Jetlake(workdir / "jetlake-2m")
    relaxed.gateway_env = {"JETLAKE_SYNC_INTERVAL": "2m"}
    relaxed.start()
    try:
        pids = {"gateway": _pid(relaxed.gateway), "hub": _pid(relaxed.server)}
        out["jetlake_2m"] = _publish(relaxed.url, pids, sync, pipelined, window)
    finally:
        relaxed.stop()
    js, jsa, jl, jl2 = (
        out[k] for k in ("jetstream_default", "jetstream_always", "jetlake_always", "jetlake_2m")
    )
    out["ratio_p50"] = _ratio(jl["p50_ms"], jsa["p50_ms"])
    out["ratio_rate"] = _ratio(jl["acked_per_s"], jsa["acked_per_s"])
    out["cost_p50_jetlake"] = _ratio(jl["p50_ms"], jl2["p50_ms"])
    out["cost_p50_jetstream"] = _ratio(jsa["p50_ms"], js["p50_ms"])
    out["cost_rate_jetlake"] = _ratio(jl["acked_per_s"], jl2["acked_per_s"])
    out["cost_rate_jetstream"] = _ratio(jsa["acked_per_s"], js["acked_per_s"])
    return out
