"""Bounded soak: a steady publish and consume rate for a while; memory stays bounded, latency flat.

Publishers send ``RATE`` msgs/s in total (each waits for its PubAck, timed), one pull consumer
fetches and acks everything, and the gateway's own timers run meanwhile: ``max_age`` expiry (the
stream keeps ``MAX_AGE_S`` seconds of messages, so its index and tail are trimmed all the time)
and ack-log compaction (``acklog_compact_rows`` set low, so it compacts every few seconds), and
the maintenance jobs run beside it: ``jetlake jobs run retention seal removals`` (a Spark
application) every ``JOBS_EVERY_S`` (the retention job removes the expired files; no
100k-message block fills up in this run, so seal finds nothing to do). The gateway's RSS
(``/proc/<pid>/status``) is sampled every ``SAMPLE_S``; the run is cut into ``INTERVALS``
intervals and each one's median RSS and PubAck p50/p99 are printed. ``JETLAKE_SOAK_S`` sets the
duration (150 s by default; ``make soak`` runs 900 s).

Thresholds, and why:

- Memory: the median RSS of the last third of the intervals may be at most ``RSS_GROWTH`` (25 %)
  plus ``RSS_SLACK_MB`` (8 MB) above the median of the first third (the first interval is warm-up:
  imports, the tail cache — 2 MB here — filling, the allocator's first arenas). Measured on this
  2-core machine (other work running): ~330 MB after warm-up, then a slow climb, +4 to +15 %
  between the thirds over 90-150 s. The climb follows the messages table's file count (one file
  per group commit): without the retention job (21k files after 150 s) it was +15 %, with it
  (files of expired messages removed) +4 to +6 %. Where it comes from (measured apart from the
  gateway): the writer's checkpoint every 100 commits opens a fresh delta-rs handle, whose load
  and checkpoint allocate in proportion to the table's log state — live files *and* the
  tombstones of removed ones, which checkpoints keep for ``delta.deletedFileRetentionDuration``
  (a week by default, an hour for tables jetlake creates now) — and the allocator keeps the
  peak: 12,000 one-file commits grow a bare ``MessageTable`` by ~80 MB with that checkpoint and
  by 0 MB without it; repeating the checkpoint on a table of constant size levels off (no
  growth per round), and a long-lived handle refreshed with ``update_incremental`` instead grows
  by ~280 MB in 8,000 commits. Python's own heap
  (tracemalloc in the gateway) grows by ~8 MB while RSS grows by ~100 MB. So it is table state,
  not a leak of ours; the bound leaves room for it and catches what is clearly a leak: anything
  keeping ~3 KB or more per message (a message with its payload and futures, a task per
  message) adds ~90 MB over the ~100 s between the thirds' centres at 300 msgs/s and fails. A
  smaller per-message leak (a dict entry of ~200 bytes) is below what 150 s can tell from the
  allocator's noise; ``make soak`` (900 s) multiplies what it adds by six.
- Latency: the last interval's PubAck p50 may be at most ``LATENCY_FACTOR`` (3x) the first's plus
  ``LATENCY_SLACK_MS`` (15 ms): a group commit is tens of ms, and a busy 2-core machine varies it
  by well under 3x between intervals; a store or index that slows with its size (a scan per
  publish, a growing log replayed per commit) drifts past that.
- Throughput: the consumer keeps up (everything published is acked in the end) and the rate is
  held within 20 % (else the figures above were measured at a lower load).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from tests.differential import api
from tests.harness import Jetlake

STREAM = "SOAK"
DURATION_S = float(os.environ.get("JETLAKE_SOAK_S", "150"))
RATE = 300  # msgs/s, all publishers together
PUBLISHERS = 6
PAYLOAD = b"x" * 256
MAX_AGE_S = 10
SAMPLE_S = 1.0
JOBS_EVERY_S = 30.0
INTERVALS = 10
RSS_GROWTH = 0.25
RSS_SLACK_MB = 8.0
LATENCY_FACTOR = 3.0
LATENCY_SLACK_MS = 15.0
GATEWAY_ENV = {
    "JETLAKE_ACKLOG_COMPACT_ROWS": "2000",
    "JETLAKE_ACK_FLUSH_INTERVAL_MS": "50",
    "JETLAKE_TAIL_CACHE_BYTES": str(2 * 1024 * 1024),
}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as res:
        text = res.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


async def publisher(nc: Client, worker: int, t0: float, latencies: list[tuple[float, float]]) -> None:
    """Paced by the clock (not by the previous PubAck), so a slow gateway cannot lower the rate."""
    js = nc.jetstream()
    period = PUBLISHERS / RATE
    n = 0
    while True:
        due = t0 + worker * period / PUBLISHERS + n * period
        if due - t0 >= DURATION_S:
            return
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        sent = time.monotonic()
        await js.publish(f"soak.{worker}", PAYLOAD, timeout=10)
        latencies.append((sent - t0, (time.monotonic() - sent) * 1000))
        n += 1


async def consumer(nc: Client, done: asyncio.Event, acked: list[int]) -> None:
    sub = await nc.jetstream().pull_subscribe_bind("WORK", STREAM)
    while not done.is_set():
        try:
            msgs = await sub.fetch(100, timeout=0.5)
        # nats-py raises asyncio's TimeoutError, not its own, when the time ran out between its
        # no-wait pull and the waiting one (the built-in TimeoutError is both)
        except TimeoutError:
            continue
        for m in msgs:
            await m.ack()
        acked[0] += len(msgs)


async def sampler(pid: int, t0: float, done: asyncio.Event, rss: list[tuple[float, float]]) -> None:
    while not done.is_set():
        rss.append((time.monotonic() - t0, rss_mb(pid)))
        await asyncio.sleep(SAMPLE_S)


class Jobs:
    """``jetlake jobs run retention seal removals`` (a Spark application of its own) every ``JOBS_EVERY_S``
    beside the live gateway, one run at a time, as ``jetlake jobs schedule`` would."""

    def __init__(self, gw: Jetlake) -> None:
        self.gw = gw
        self.exit_codes: list[int] = []

    async def run(self, done: asyncio.Event) -> None:
        with open(self.gw.workdir / "jobs.log", "ab") as log:  # noqa: ASYNC230 (once, a local file)
            while not done.is_set():
                await asyncio.sleep(JOBS_EVERY_S)
                cmd = ["-m", "gateway", "jobs", "run", "retention", "seal", "removals"]
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, *cmd, "--data-root", str(self.gw.data_root), stdout=log, stderr=log
                )
                try:
                    self.exit_codes.append(await proc.wait())
                finally:  # cancelled (the soak failed elsewhere): no job outlives the test
                    if proc.returncode is None:
                        proc.kill()
                        await proc.wait()


async def soak(
    gw: Jetlake, jobs: Jobs
) -> tuple[list[tuple[float, float]], list[tuple[float, float]], int, int]:
    nc = await nats.connect(gw.url)
    try:
        cfg = {"name": STREAM, "subjects": ["soak.>"], "max_age": MAX_AGE_S * 1_000_000_000}
        await api(nc, f"STREAM.CREATE.{STREAM}", cfg)
        work = {"durable_name": "WORK", "ack_policy": "explicit"}
        await api(nc, f"CONSUMER.CREATE.{STREAM}.WORK", {"stream_name": STREAM, "config": work})
        assert gw.gateway is not None
        latencies: list[tuple[float, float]] = []
        rss: list[tuple[float, float]] = []
        acked = [0]
        done = asyncio.Event()
        t0 = time.monotonic()
        background = [
            asyncio.create_task(sampler(gw.gateway.pid, t0, done, rss)),
            asyncio.create_task(consumer(nc, done, acked)),
            asyncio.create_task(jobs.run(done)),
        ]
        await asyncio.gather(*(publisher(nc, w, t0, latencies) for w in range(PUBLISHERS)))
        deadline = time.monotonic() + 30
        # the consumer's count is polled: it has no event of its own to wait on
        while acked[0] < len(latencies) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        done.set()
        await asyncio.gather(*background)
        info = await api(nc, f"CONSUMER.INFO.{STREAM}.WORK")
        return latencies, rss, acked[0], info["ack_floor"]["stream_seq"]
    finally:
        await nc.close()


def per_interval(points: list[tuple[float, float]], pct: int) -> list[float]:
    """The ``pct`` percentile of each interval's values."""
    width = DURATION_S / INTERVALS
    buckets: list[list[float]] = [[] for _ in range(INTERVALS)]
    for t, v in points:
        buckets[min(int(t / width), INTERVALS - 1)].append(v)
    return [statistics.quantiles(b, n=100, method="inclusive")[pct - 1] for b in buckets]


@pytest.mark.slow
@pytest.mark.alone  # its latency bound compares intervals: a neighbour's load would move it
def test_soak_memory_bounded_latency_flat(tmp_path: Path) -> None:
    gw = Jetlake(tmp_path)
    gw.start_server()
    try:
        gw.start_gateway(GATEWAY_ENV)
        jobs = Jobs(gw)
        latencies, rss, acked, floor = asyncio.run(soak(gw, jobs))
        compactions = metric(gw.monitor_port, "jetlake_acklog_compactions_total")
        nc_info = asyncio.run(stream_state(gw.url))
        files = {t: len(list((gw.data_root / t).rglob("*.parquet"))) for t in ("messages", "acks")}
        commits = {t: len(list((gw.data_root / t / "_delta_log").glob("*.json"))) for t in files}
    finally:
        gw.stop()
    rss_med = per_interval(rss, 50)
    p50 = per_interval(latencies, 50)
    p99 = per_interval(latencies, 99)
    third = INTERVALS // 3
    first, last = statistics.median(rss_med[1 : 1 + third]), statistics.median(rss_med[-third:])
    rate = len(latencies) / DURATION_S
    print(f"\nsoak {DURATION_S:.0f} s at {rate:.0f} msgs/s: {len(latencies)} published, {acked} acked")
    print(f"stream state at the end: {nc_info}; ack-log compactions: {compactions:.0f}")
    print(f"data files at the end: {files}; Delta commits: {commits}")
    print(f"jobs (retention, seal, removals) runs: exit codes {jobs.exit_codes}")
    for i, (r, a, b) in enumerate(zip(rss_med, p50, p99, strict=True)):
        print(f"interval {i + 1:2}: RSS {r:6.1f} MB  PubAck p50 {a:6.1f} ms  p99 {b:7.1f} ms")
    print(f"RSS median first third (after warm-up) {first:.1f} MB, last third {last:.1f} MB")

    assert rate >= RATE * 0.8, "the rate was not held"
    assert acked >= len(latencies), "the consumer fell behind"
    assert floor == nc_info["last_seq"], "the consumer fell behind"
    assert compactions > 0, "the ack log was never compacted"
    assert jobs.exit_codes, "the jobs never ran"
    # At least one run completes. A run can still fail when it lists the log while the gateway's
    # blind appender is between two commit files ("Expected contiguous commit files, but found
    # gap"): a known race of the jobs (spark_jobs opens the table without the gateway's listing
    # retry), printed above, not hidden; the next run succeeds.
    assert 0 in jobs.exit_codes, "no jobs run succeeded (see jobs.log)"
    assert nc_info["first_seq"] > 1, "max_age never ran"
    assert nc_info["messages"] <= RATE * MAX_AGE_S * 1.5, "max_age did not keep up"
    assert last <= first * (1 + RSS_GROWTH) + RSS_SLACK_MB, (first, last)
    assert p50[-1] <= p50[0] * LATENCY_FACTOR + LATENCY_SLACK_MS, (p50[0], p50[-1])


async def stream_state(url: str) -> dict[str, int]:
    nc = await nats.connect(url)
    try:
        state: dict[str, int] = (await api(nc, f"STREAM.INFO.{STREAM}"))["state"]
        return state
    finally:
        await nc.close()
