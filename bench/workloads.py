"""The workloads: each runs against both servers in the same run and returns one result line."""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

from bench.profile import go_sampled, go_summarize, sampled, summarize
from bench.targets import Target, add_stream, barrier, loadgen, stream_state, timed_restart, tree_bytes
from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import MessageTable, StoredMessage
from storage_delta.maintenance import seal
from storage_delta.read import index_snapshot

Result = dict[str, Any]


def _ratio(lake: float | None, ref: float | None) -> float | None:
    return round(lake / ref, 3) if lake is not None and ref else None


def sync_publish(targets: list[Target], count: int) -> Result:
    """One publisher, one message in flight: the PubAck latency a request/reply client sees."""
    out: Result = {"workload": "sync_publish", "messages": count}
    for t in targets:
        asyncio.run(add_stream(t.url, "BSYNC", ["bsync.>"]))
        loadgen("sync", t.url, "bsync", min(count, 50), "json")  # warm-up: connections, caches
        out[t.name] = loadgen("sync", t.url, "bsync", count, "json")
    out["ratio_p50"] = _ratio(out["jetlake"]["p50_ms"], out["jetstream"]["p50_ms"])
    out["ratio_p99"] = _ratio(out["jetlake"]["p99_ms"], out["jetstream"]["p99_ms"])
    return out


def profiled(t: Target, profile: Path | None, run: Callable[[], Result]) -> Result:
    """Run a workload step: with the CPU time each of the server's processes spent in it, in µs
    per message (``cpu_us_per_msg``: a cost that a busy machine disturbs far less than a rate), the
    client's too (``client_cpu_us_per_msg``: the load generator, or this process for nats-py), and
    with py-spy on jetlake's gateway when ``profile`` names a directory."""
    pids = t.processes()
    before = {role: cpu_seconds(pid) for role, pid in pids.items()}
    client_before = client_cpu_seconds()
    threads_before = thread_cpu_seconds(t.pid()) if t.name == "jetlake" else {}
    if profile is None:
        res = run()
    else:
        raw = profile / f"{time.monotonic_ns()}.raw"
        go = profile / f"{time.monotonic_ns()}-go"
        with go_sampled(t.pprof_port, go), sampled(t.pid(), raw) if t.name == "jetlake" else nullcontext():
            res = run()
        if t.name == "jetlake":
            res["profile"] = summarize(raw)
        res["server_profile" if t.name == "jetstream" else "hub_profile"] = go_summarize(go)
    client = client_cpu_seconds() - client_before
    messages = res.get("messages") or res.get("acked") or res.get("sent")
    if messages:
        res["cpu_us_per_msg"] = {
            role: round((cpu_seconds(pid) - before[role]) * 1e6 / messages, 1) for role, pid in pids.items()
        }
        res["client_cpu_us_per_msg"] = round(client * 1e6 / messages, 1)
        if threads_before:
            res["gateway_threads_us_per_msg"] = per_thread_kind(
                threads_before, thread_cpu_seconds(t.pid()), res["cpu_us_per_msg"]["gateway"], messages
            )
    return res


def thread_cpu_seconds(pid: int) -> dict[tuple[int, str], float]:
    """CPU time of each live thread of ``pid`` by (thread id, kind): ``loop`` (the main thread,
    which runs the event loop), ``workers`` (Python's other threads: the commits, compaction,
    checkpoints, syncs, reads), else the kernel's name of the thread (``tokio-rt-worker``:
    delta-rs's runtime)."""
    out: dict[tuple[int, str], float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rpartition(")")[2].split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        kind = "loop" if int(tid) == pid else "workers" if name.startswith("python") else name
        out[(int(tid), kind)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def per_thread_kind(
    before: dict[tuple[int, str], float], after: dict[tuple[int, str], float], total_us: float, messages: int
) -> dict[str, float]:
    """µs per message by kind of thread; ``ended``: what threads that ended during the step used
    (the process's total less the live threads')."""
    kinds: dict[str, float] = {}
    for (tid, kind), secs in after.items():
        kinds[kind] = kinds.get(kind, 0.0) + secs - before.get((tid, kind), 0.0)
    out = {kind: round(secs * 1e6 / messages, 1) for kind, secs in sorted(kinds.items()) if secs > 0}
    out["ended"] = round(max(0.0, total_us - sum(out.values())), 1)
    return out


def client_cpu_seconds() -> float:
    """CPU time of the clients a workload runs: this process (nats-py runs in it) and the children
    that ended (the nats.js load generator, its start of about 0.1 s included: at ``--quick``
    sizes that start outweighs the messages; the servers, also children, are still running)."""
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ended.ru_utime + ended.ru_stime


def ratio_cores_allow(out: Result, rate: str) -> float | None:
    """The highest ratio to JetStream's measured ``rate`` that this machine's cores allow jetlake at
    the CPU one message cost every process of its step (the client, the hub, the gateway): a bound
    no scheduling can pass. When it is below a goal, the goal is out of reach on this machine
    unless those costs fall (#23). Each target's ``cores_allow_per_s`` is the rate itself."""
    for t in ("jetstream", "jetlake"):
        res = out[t]
        per_msg = res.get("client_cpu_us_per_msg", 0.0) + sum(res.get("cpu_us_per_msg", {}).values())
        res["cores_allow_per_s"] = round((os.cpu_count() or 1) * 1e6 / per_msg) if per_msg else None
    allowed, ref = out["jetlake"]["cores_allow_per_s"], out["jetstream"][rate]
    return round(allowed / ref, 3) if allowed and ref else None


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process (all its threads) has used, from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pipelined_publish(targets: list[Target], count: int, window: int, profile: Path | None = None) -> Result:
    """Acked publishes with ``window`` in flight: throughput when every message is confirmed."""
    out: Result = {"workload": "pipelined_publish", "messages": count, "window": window}
    for t in targets:
        asyncio.run(add_stream(t.url, "BPIPE", ["bpipe.>"]))
        out[t.name] = profiled(
            t, profile, partial(loadgen, "pipelined", t.url, "bpipe", count, "json", window)
        )
    out["ratio"] = _ratio(out["jetlake"]["acked_per_s"], out["jetstream"]["acked_per_s"])
    out["ratio_cores_allow"] = ratio_cores_allow(out, "acked_per_s")
    return out


def _core_load(t: Target, count: int) -> Result:
    """Core publishes, then an acked barrier: what was stored, and by when."""
    sent = loadgen("core", t.url, "bcore", count, "json")
    seq, t_stored = asyncio.run(barrier(t.url, "bcore.barrier"))
    stored = seq - 1
    secs = t_stored - sent["t0_ms"] / 1000
    return {
        "sent": count,
        "sent_per_s": round(sent["sent_per_s"]),
        "stored": stored,
        "dropped": count - stored,
        "seconds": round(secs, 3),
        "stored_per_s": round(stored / secs),
    }


def core_publish(targets: list[Target], count: int, profile: Path | None = None) -> Result:
    """Fire-and-forget publishes into a stream: how many the server stores per second, and how many
    it drops (JetStream drops past its ingest queue limit; jetlake must count what it refuses)."""
    out: Result = {"workload": "core_publish", "messages": count}
    for t in targets:
        asyncio.run(add_stream(t.url, "BCORE", ["bcore.>"]))
        out[t.name] = profiled(t, profile, partial(_core_load, t, count))
    out["ratio"] = _ratio(out["jetlake"]["stored_per_s"], out["jetstream"]["stored_per_s"])
    return out


def _drop_snapshots(root: StoreRoot) -> None:
    local = root.local_path()
    assert local is not None
    shutil.rmtree(Path(local) / index_snapshot.DIR, ignore_errors=True)


def bytes_per_message(targets: list[Target], count: int, payload: str, lake_root: StoreRoot) -> Result:
    """Bytes on disk per stored message: JetStream's file store directory against the stream's
    parquet files in the Delta table, as written and after sealing its blocks; and the time a
    restart takes until the stream answers with all its messages again (jetlake also without its
    index snapshots, as after a ``kill -9`` at worst)."""
    stream = f"BBYTES_{payload.upper()}"
    prefix = f"bbytes{payload}"
    out: Result = {"workload": f"bytes_per_message_{payload}", "messages": count}
    for t in targets:
        asyncio.run(add_stream(t.url, stream, [f"{prefix}.>"]))
        loadgen("pipelined", t.url, prefix, count, payload, 512)
        state = asyncio.run(stream_state(t.url, stream))
        res: Result = {"stored": state["messages"], "state_bytes_per_msg": round(state["bytes"] / count, 1)}
        res["restart_s"] = timed_restart(t, stream, count)
        if t.name == "jetlake":
            # the same without the index snapshots the clean stop wrote: what a restart after
            # kill -9 costs at worst (it reads the files above the last snapshot)
            res["restart_no_snapshot_s"] = timed_restart(
                t, stream, count, partial(_drop_snapshots, lake_root)
            )
        if t.name == "jetstream":
            res["disk_bytes_per_msg"] = round(tree_bytes(t.stream_dir(stream)) / count, 1)
        else:
            res["unsealed_bytes_per_msg"] = round(seal.stream_bytes(lake_root, stream) / count, 1)
            t0 = time.monotonic()
            seal.seal_stream(lake_root, stream)
            res["seal_seconds"] = round(time.monotonic() - t0, 2)
            res["disk_bytes_per_msg"] = round(seal.stream_bytes(lake_root, stream) / count, 1)
            res["restart_sealed_s"] = timed_restart(t, stream, count)
            drop = partial(_drop_snapshots, lake_root)
            res["restart_sealed_no_snapshot_s"] = timed_restart(t, stream, count, drop)
        out[t.name] = res
    out["ratio"] = _ratio(out["jetlake"]["disk_bytes_per_msg"], out["jetstream"]["disk_bytes_per_msg"])
    return out


def commit_latency(versions: list[int], sample: int) -> Result:
    """One-message commits through the gateway's own table writer: p50 near each table version in
    ``versions`` (Delta only, JetStream has no counterpart; the ratio is last over first)."""
    out: Result = {"workload": "delta_commit_latency", "sample": sample}
    with tempfile.TemporaryDirectory(prefix="jetlake-bench-commit-") as tmp:
        table = MessageTable(StoreRoot(str(Path(tmp) / "root")))
        p50s: dict[int, float] = {}
        try:
            _commit_until(table, versions, sample, p50s, out)
        finally:
            table.close()
    out["ratio"] = _ratio(p50s[versions[-1]], p50s[versions[0]])
    return out


def _commit_until(
    table: MessageTable, versions: list[int], sample: int, p50s: dict[int, float], out: Result
) -> None:
    version = table.last_txn_version()
    for target in versions:
        lat: list[float] = []
        while version < target:
            version += 1
            msg = StoredMessage("BCOMMIT", 100_000, version, time.time_ns(), "bcommit.x", None, b"m" * 64)
            t0 = time.perf_counter()
            table.commit([msg], version)
            if target - version < sample:
                lat.append((time.perf_counter() - t0) * 1000)
        p50s[target] = round(statistics.median(lat), 2)
        out[f"p50_ms_at_{target}"] = p50s[target]
        out[f"p99_ms_at_{target}"] = round(statistics.quantiles(lat, n=100)[98], 2)
