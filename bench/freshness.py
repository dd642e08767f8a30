"""``freshness`` (#18): how soon a published message can be seen, from the PubAck's request to
the reader holding it, under a steady publish rate.

Each message carries its send time (``time.time_ns()``, 8 bytes); every reader runs in this process
and subtracts it from the time it holds the row, so all figures share one clock. One phase per
reader, one after the other (a reader never competes with another for the two cores):

* ``consumer``: a push consumer of the stream, on the real JetStream and on jetlake: what a NATS
  client sees, the reference.
* ``duckdb``: DuckDB's delta extension, ``delta_scan`` of the ``messages`` table polled for rows
  above the last seen (an independent Delta reader; each query reads the log anew).
* ``polars``: Polars' ``scan_delta`` (delta-rs) polled the same way.
* ``spark_batch``: a batch read of the jetlake source in a loop, from the last seen sequence on.
* ``spark_stream``: a structured streaming query on the jetlake source with the default trigger
  (micro-batches back to back), the figure taken in ``foreachBatch``.

Pollers sleep :data:`POLL_S` between queries. Percentiles are over every message of a phase; a
message a reader never saw counts in ``missing``. The Spark session uses jetlake's settings
(conf/spark.toml). ``spark_stream`` also reports where a micro-batch's time goes: the median of each
part of Spark's ``durationMs`` over the micro-batches that read rows (``latestOffset``, ``walCommit``:
the offset log, ``queryPlanning``, ``addBatch``: the ``foreachBatch`` call with its job,
``commitOffsets``: the commit log, ``triggerExecution``: the whole), and ``collect_ms``, the
``collect`` in ``foreachBatch`` alone.

``--compare-prefetch N`` then runs the streaming phase N times without and N times with the
planner's prefetch of small micro-batches (the source's ``prefetch_bytes`` 0 and its default), taking
turns in one session.

``--compare-conf N`` with ``--variant NAME:KEY=VALUE`` (repeated; a name's entries add up) runs the
streaming phase N rounds, each round once with jetlake's Spark settings as they are (``main``) and
once per variant with its properties on top, taking turns. Each run is a process of its own, so JVM
options (``spark.driver.extraJavaOptions``: the collector, the heap) and Hadoop settings take effect;
each reports the load average at its start and end and the driver's GC pauses during its measured
phase (from ``-Xlog:gc``, which every run gets).

    python -m bench.freshness [--rate 20] [--seconds 20] [--readers spark_stream,duckdb]
        [--compare-prefetch N] [--compare-conf N --variant NAME:KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import statistics
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import nats
import polars as pl
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from bench.targets import Target, start_targets
from bench.workloads import cpu_seconds
from spark_jobs.session import build_spark_session
from spark_jobs.settings import SPARK_LOADER
from tests.harness import duckdb_connection

Result = dict[str, Any]
STREAM, SUBJECT = "BFRESH", "bfresh.x"
#: A poller's pause between two queries.
POLL_S = 0.01
#: How long a reader may still take after the last publish of a phase.
GRACE_S = 5.0
#: Messages a streaming query reads before a phase's own (its start-up is not what is measured).
WARMUP = 20
#: How long the warm-up may take at most.
WARMUP_S = 300.0

#: A reader's answer to "which rows above sequence n are there now": (sequence, payload) pairs.
Fetch = Callable[[int], Iterable[tuple[int, bytes]]]


class Seen:
    """The latency of each message of a phase, in ms, taken once per message."""

    def __init__(self, since_seq: int) -> None:
        self.since_seq = since_seq
        self.latency: dict[int, float] = {}
        self.lock = threading.Lock()
        #: Set once every message up to :attr:`until` was seen.
        self.done = threading.Event()
        self.until: int | None = None

    def record(self, rows: Iterable[tuple[int, bytes]]) -> None:
        now = time.time_ns()
        with self.lock:
            for seq, data in rows:
                if seq > self.since_seq and seq not in self.latency:
                    self.latency[seq] = (now - struct.unpack(">q", data)[0]) / 1e6
            self._check()

    def _check(self) -> None:
        if self.until is not None and len(self.latency) >= self.until - self.since_seq:
            self.done.set()

    def wait(self, last: int, failed: threading.Event | None = None) -> None:
        """Until every message up to ``last`` was seen, ``GRACE_S`` at most (or ``failed`` is set)."""
        with self.lock:
            self.until = last
            self._check()
        deadline = time.monotonic() + GRACE_S
        while not self.done.wait(0.1) and time.monotonic() < deadline:
            if failed is not None and failed.is_set():
                return

    def restart(self, since_seq: int) -> None:
        """Forget what was seen: from now on only messages after ``since_seq`` count."""
        with self.lock:
            self.since_seq = since_seq
            self.latency = {}

    def highest(self) -> int:
        with self.lock:
            return max(self.latency, default=self.since_seq)

    def summary(self, published: int) -> Result:
        got = sorted(self.latency.values())
        if not got:
            return {"n": 0, "missing": published}

        def pct(p: float) -> float:
            return round(got[min(len(got) - 1, int(p * len(got)))], 1)

        return {
            "n": len(got),
            "missing": published - len(got),
            "p50_ms": round(statistics.median(got), 1),
            "p95_ms": pct(0.95),
            "p99_ms": pct(0.99),
        }


async def publish_steady(url: str, rate: float, seconds: float, acks: dict[int, float] | None = None) -> int:
    """``rate`` messages a second for ``seconds``, each PubAck awaited; the stream's last sequence.
    ``acks``: gets each message's PubAck time (ms after its send time, when its commit is durable)."""
    async with await nats.connect(url) as nc:
        js = nc.jetstream()
        start = time.monotonic()
        last = 0
        for i in range(round(rate * seconds)):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = time.time_ns()
            last = (await js.publish(SUBJECT, struct.pack(">q", sent))).seq
            if acks is not None:
                acks[last] = (time.time_ns() - sent) / 1e6
        return last


async def last_seq(url: str) -> int:
    async with await nats.connect(url) as nc:
        return (await nc.jetstream().stream_info(STREAM)).state.last_seq


async def consumer_phase(url: str, rate: float, seconds: float) -> Result:
    since = await last_seq(url)
    seen = Seen(since)
    async with await nats.connect(url) as nc:
        js = nc.jetstream()

        async def on_msg(msg: Any) -> None:
            seen.record([(msg.metadata.sequence.stream, msg.data)])

        sub = await js.subscribe(
            SUBJECT,
            stream=STREAM,
            cb=on_msg,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.NONE),
        )
        last = await publish_steady(url, rate, seconds)
        await asyncio.to_thread(seen.wait, last)
        await sub.unsubscribe()
    return seen.summary(last - since)


def polling_phase(url: str, fetch: Fetch, rate: float, seconds: float) -> Result:
    """``fetch`` called in a loop on a thread of its own while the phase publishes."""
    since = asyncio.run(last_seq(url))
    seen = Seen(since)
    stop = threading.Event()
    failed = threading.Event()
    failure: list[BaseException] = []

    def poll() -> None:
        try:
            while not stop.is_set():
                seen.record(fetch(seen.highest()))
                stop.wait(POLL_S)
        except BaseException as exc:  # handed to the phase, which fails with it
            failure.append(exc)
            failed.set()

    poller = threading.Thread(target=poll, name="freshness-poller")
    poller.start()
    try:
        last = asyncio.run(publish_steady(url, rate, seconds))
        seen.wait(last, failed)
    finally:
        stop.set()
        poller.join()
    if failure:
        raise failure[0]
    return seen.summary(last - since)


def spark_stream_phase(
    url: str,
    root: str,
    work: Path,
    rate: float,
    seconds: float,
    options: dict[str, str] | None = None,
    conf: Mapping[str, str] | None = None,
    gc_log: Path | None = None,
    settle_s: float = 0.0,
) -> Result:
    """``options``: more options of the jetlake source (``prefetch_bytes`` for the comparison);
    ``conf``: Spark properties over jetlake's; ``gc_log``: the driver's ``-Xlog:gc`` file, whose
    pauses during the measured phase are reported; ``settle_s``: seconds of the steady rate after
    the warm-up before measuring (the driver's JIT compiles for minutes after start)."""
    # Every micro-batch's progress kept (Spark keeps the last 100), so the parts cover the phase.
    spark = build_spark_session(
        quiet=True, conf={"spark.sql.streaming.numRecentProgressUpdates": "100000", **(conf or {})}
    )
    since = asyncio.run(last_seq(url))
    # Warm-up messages first: the query's first micro-batches start its Python processes and a cold
    # JVM, which is not part of any message's way and on a loaded machine takes tens of seconds.
    seen = Seen(since + WARMUP)
    warm = threading.Event()
    collects: list[float] = []

    def on_batch(df: Any, _batch: int) -> None:
        began = time.perf_counter()
        rows = df.select("seq", "data").collect()
        seen.record((r["seq"], bytes(r["data"])) for r in rows)
        if rows and warm.is_set():
            collects.append((time.perf_counter() - began) * 1000)
        if any(r["seq"] == since + WARMUP for r in rows):
            warm.set()

    query = (
        spark.readStream.format("jetlake")
        .option("root", root)
        .option("stream", STREAM)
        .option("start_seq", since + 1)
        .options(**(options or {}))
        .load()
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(work / f"freshness-checkpoint-{since}"))
        .start()
    )
    try:
        assert asyncio.run(publish_steady(url, rate, WARMUP / rate)) == since + WARMUP
        deadline = time.monotonic() + WARMUP_S
        while not warm.wait(1):
            if query.exception() is not None or not query.isActive or time.monotonic() > deadline:
                raise RuntimeError(f"the streaming query never read the warm-up: {query.exception()}")
        if settle_s > 0:
            seen.restart(asyncio.run(publish_steady(url, rate, settle_s)))
        first = query.lastProgress["batchId"] if query.lastProgress else 0
        began, cpu_before = jvm_uptime_s(spark), process_cpu()
        acks: dict[int, float] = {}
        last = asyncio.run(publish_steady(url, rate, seconds, acks))
        seen.wait(last)
        window, cpu_after = (began, jvm_uptime_s(spark)), process_cpu()
        progress = [p for p in query.recentProgress if p["batchId"] > first]
    finally:
        query.stop()
    if query.exception() is not None:
        raise RuntimeError(f"the streaming query failed: {query.exception()}")
    out = seen.summary(last - seen.since_seq)
    out["puback_ms"] = {
        "p50": percentile(list(acks.values()), 0.5),
        "p95": percentile(list(acks.values()), 0.95),
    }
    out["micro_batches"] = len(progress)
    progress = [p for p in progress if p["numInputRows"]]
    parts = sorted({k for p in progress for k in p["durationMs"]})
    out["micro_batch_p50_ms"] = {
        k: statistics.median(p["durationMs"].get(k, 0) for p in progress) for k in parts
    }
    out["micro_batch_p50_ms"]["collect_ms"] = round(statistics.median(collects or [0.0]), 1)
    out["micro_batch_p95_ms"] = {
        k: percentile([p["durationMs"].get(k, 0) for p in progress], 0.95) for k in parts
    }
    out["micro_batch_p95_ms"]["collect_ms"] = percentile(collects, 0.95)
    out["micro_batches_with_rows"] = len(progress)
    out["cpu_ms_per_message"] = {
        role: round((cpu_after[role] - cpu_before.get(role, 0.0)) * 1000 / max(1, len(acks)), 1)
        for role in cpu_after
    }
    if gc_log is not None:
        out["gc"] = gc_pauses(gc_log, *window)
    return out


def percentile(values: list[float], p: float) -> float:
    got = sorted(values) or [0.0]
    return round(got[min(len(got) - 1, int(p * len(got)))], 1)


def process_cpu() -> dict[str, float]:
    """CPU seconds used so far by this process (the publisher, ``foreachBatch``) and, by command
    name, by the processes below it (the driver's ``java``, the source's ``python`` workers)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out = {"bench": cpu_seconds(os.getpid())}
    todo = list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            role = Path(f"/proc/{pid}/comm").read_text().strip()
            out[role] = out.get(role, 0.0) + cpu_seconds(pid)
        except OSError:
            continue
    return out


def jvm_uptime_s(spark: Any) -> float:
    """The driver JVM's uptime, the clock of its GC log's ``uptime`` decoration."""
    return float(spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getUptime()) / 1000


#: A stop-the-world pause in ``-Xlog:gc:file=...:uptime``: its time since JVM start and its length.
_GC_PAUSE = re.compile(r"^\[(\d+\.\d+)s\].*\bPause\b.* (\d+\.\d+)ms$")


def gc_pauses(log: Path, start_s: float, end_s: float) -> Result:
    """Count, sum and longest of the pauses logged between ``start_s`` and ``end_s`` of JVM uptime."""
    pauses = []
    for line in log.read_text().splitlines():
        m = _GC_PAUSE.match(line)
        if m and start_s <= float(m.group(1)) <= end_s:
            pauses.append(float(m.group(2)))
    return {"n": len(pauses), "sum_ms": round(sum(pauses)), "max_ms": round(max(pauses, default=0.0))}


def isolated_stream_phase(
    url: str,
    root: str,
    work: Path,
    rate: float,
    seconds: float,
    conf: dict[str, str],
    gc_log: Path,
    settle_s: float,
) -> Result:
    """:func:`spark_stream_phase` as the whole life of a process (its own JVM), with the load average
    at its start and end."""
    load_before = os.getloadavg()[0]
    out = spark_stream_phase(url, root, work, rate, seconds, conf=conf, gc_log=gc_log, settle_s=settle_s)
    out["load"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return out


def compare_conf(
    url: str,
    root: str,
    work: Path,
    rate: float,
    seconds: float,
    variants: Mapping[str, Mapping[str, str]],
    rounds: int,
    settle_s: float = 0.0,
) -> list[Result]:
    """``rounds`` rounds of the streaming phase with jetlake's settings (``main``) and with each
    variant's properties over them, taking turns, each run in a process (and JVM) of its own."""
    base = SPARK_LOADER.load().conf
    out = []
    for r in range(rounds):
        round_out: Result = {}
        for name, extra in {"main": {}, **variants}.items():
            conf = {**base, **extra}
            gc_log = work / f"gc-{name}-{r}.log"
            java = conf.get("spark.driver.extraJavaOptions", "")
            conf["spark.driver.extraJavaOptions"] = f"{java} -Xlog:gc:file={gc_log}:uptime".strip()
            spawn = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
                job = pool.submit(
                    isolated_stream_phase, url, root, work, rate, seconds, conf, gc_log, settle_s
                )
                round_out[name] = job.result()
            print(json.dumps({"round": r, "variant": name, **round_out[name]}), flush=True)
        out.append(round_out)
    return out


def lake_readers(root: str) -> dict[str, Fetch]:
    """The pollers' queries, each made once here (a connection, a session) and run per poll."""
    table = f"{root}/messages"
    duck = duckdb_connection()
    spark = build_spark_session(quiet=True)

    def duckdb(after: int) -> list[tuple[int, bytes]]:
        query = f"SELECT seq, data FROM delta_scan('{table}') WHERE stream = ? AND seq > ?"
        return [(seq, data) for seq, data in duck.execute(query, [STREAM, after]).fetchall()]

    def polars(after: int) -> list[tuple[int, bytes]]:
        frame = (
            pl.scan_delta(table)
            .filter((pl.col("stream") == STREAM) & (pl.col("seq") > after))
            .select("seq", "data")
            .collect()
        )
        return list(frame.iter_rows())

    def spark_batch(after: int) -> list[tuple[int, bytes]]:
        df = spark.read.format("jetlake").option("root", root).option("stream", STREAM)
        rows = df.option("start_seq", after + 1).load().select("seq", "data").collect()
        return [(r["seq"], bytes(r["data"])) for r in rows]

    return {"duckdb": duckdb, "polars": polars, "spark_batch": spark_batch}


async def create_stream(url: str) -> None:
    async with await nats.connect(url) as nc:
        await nc.jetstream().add_stream(name=STREAM, subjects=[SUBJECT])


READERS = ("consumer", "duckdb", "polars", "spark_batch", "spark_stream")


def freshness(
    targets: list[Target],
    root: str,
    work: Path,
    rate: float,
    seconds: float,
    readers: Iterable[str] = READERS,
    compare_prefetch: int = 0,
    compare_rounds: int = 0,
    variants: Mapping[str, Mapping[str, str]] | None = None,
    settle_s: float = 0.0,
) -> Result:
    wanted = set(readers)
    out: Result = {"workload": "freshness", "rate_per_s": rate, "seconds": seconds, "poll_s": POLL_S}
    for t in targets:
        asyncio.run(create_stream(t.url))
        out[t.name] = {}
        if "consumer" in wanted:
            out[t.name]["consumer"] = asyncio.run(consumer_phase(t.url, rate, seconds))
    lake = next(t for t in targets if t.name == "jetlake")
    if wanted & {"duckdb", "polars", "spark_batch"}:
        for name, fetch in lake_readers(root).items():
            if name in wanted:
                out["jetlake"][name] = polling_phase(lake.url, fetch, rate, seconds)
    if "spark_stream" in wanted:
        out["jetlake"]["spark_stream"] = spark_stream_phase(
            lake.url, root, work, rate, seconds, settle_s=settle_s
        )
    # Before and after the planner's prefetch, taking turns in one session (the same warm JVM and
    # the same load on the machine for both).
    out["jetlake"]["spark_stream_prefetch_rounds"] = [
        {
            variant: spark_stream_phase(lake.url, root, work, rate, seconds, options)
            for variant, options in (("prefetch_off", {"prefetch_bytes": "0"}), ("prefetch_on", {}))
        }
        for _ in range(compare_prefetch)
    ]
    if compare_rounds:
        out["jetlake"]["spark_stream_conf_rounds"] = compare_conf(
            lake.url, root, work, rate, seconds, variants or {}, compare_rounds, settle_s
        )
    if "consumer" in wanted:
        js, jl = out["jetstream"]["consumer"], out["jetlake"]["consumer"]
        out["ratio_consumer_p50"] = round(jl["p50_ms"] / js["p50_ms"], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=20.0, help="messages published a second")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each reader's phase")
    ap.add_argument("--readers", default=",".join(READERS), help="comma-separated, of: " + ", ".join(READERS))
    ap.add_argument(
        "--compare-prefetch",
        type=int,
        default=0,
        metavar="N",
        help="then N rounds of the streaming phase without and with the planner's prefetch",
    )
    ap.add_argument(
        "--compare-conf",
        type=int,
        default=0,
        metavar="N",
        help="then N rounds of the streaming phase with jetlake's Spark settings and with each --variant",
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE",
        help="a Spark property of the variant NAME for --compare-conf (repeat for more)",
    )
    ap.add_argument(
        "--settle",
        type=float,
        default=0.0,
        metavar="S",
        help="streaming phases: S seconds of the steady rate after the warm-up before measuring",
    )
    args = ap.parse_args()
    variants: dict[str, dict[str, str]] = {}
    for v in args.variant:
        name, sep, prop = v.partition(":")
        key, eq, value = prop.partition("=")
        if not (sep and eq and name and key) or name == "main":
            ap.error(f"--variant wants NAME:KEY=VALUE (NAME not main), got {v!r}")
        variants.setdefault(name, {})[key] = value
    readers = args.readers.split(",") if args.readers else []
    if unknown := set(readers) - set(READERS):
        ap.error(f"unknown readers: {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory(prefix="bench-freshness-") as tmp:
        ref, lake, targets = start_targets(Path(tmp))
        try:
            root, rounds = str(lake.data_root), args.compare_prefetch
            res = freshness(
                targets,
                root,
                Path(tmp),
                args.rate,
                args.seconds,
                readers,
                rounds,
                args.compare_conf,
                variants,
                args.settle,
            )
        finally:
            lake.stop()
            ref.stop()
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
