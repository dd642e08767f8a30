"""Batch read of a whole stream: Spark reading jetlake's Delta table against draining the same
messages from the real JetStream through a pull consumer with nats-py, the way a Python batch job
without jetlake would get them."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig

from bench.consumers import fill_stored
from bench.targets import Target
from spark_jobs.session import build_spark_session
from tests.harness import Jetlake

Result = dict[str, Any]
STREAM, PREFIX = "BSPARK", "bspark"


async def drain(url: str, count: int, batch: int) -> Result:
    """An ephemeral pull consumer, explicit acks, fetches of ``batch``: every payload touched."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(
            f"{PREFIX}.>", stream=STREAM, config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT)
        )
        received = payload = 0
        t0 = time.monotonic()
        while received < count:
            for msg in await sub.fetch(min(batch, count - received), timeout=30):
                payload += len(msg.data)
                await msg.ack()
                received += 1
        await nc.flush()
        secs = time.monotonic() - t0
    finally:
        await nc.close()
    return {
        "messages": received,
        "payload_bytes": payload,
        "seconds": round(secs, 2),
        "per_s": round(received / secs),
    }


#: Timed reads after the first: their median is the figure compared with the drain.
WARM_READS = 3


def spark_read(root: str, count: int, stream: str = STREAM, warm_reads: int = WARM_READS) -> Result:
    """The messages and the sum of their payload lengths, so every row's data is read.

    The session is started and the JVM warmed by a tiny job before any clock starts. The first
    read of the stream (``cold_s``) also pays Spark's one-off costs of a Python data source in a
    new session: the Python processes that resolve, plan and read it are started and import their
    modules. The figure compared with the drain is the median of the ``WARM_READS`` reads after
    it, as a notebook or a scheduled job in a running session meets them; the drain's own set-up
    (connection, consumer creation) is likewise outside its clock.
    """
    spark = build_spark_session(quiet=True)
    spark.range(1).count()
    times = []
    payload = 0
    for _ in range(1 + warm_reads):
        t0 = time.monotonic()
        df = spark.read.format("jetlake").option("root", root).option("stream", stream).load()
        row = df.selectExpr("count(*) AS n", "sum(length(data)) AS b").collect()[0]
        times.append(time.monotonic() - t0)
        assert row["n"] == count, row
        payload = row["b"]
    secs = statistics.median(times[1:] or times)
    return {
        "messages": count,
        "payload_bytes": payload,
        "cold_s": round(times[0], 2),
        "warm_s": [round(t, 2) for t in times[1:]],
        "seconds": round(secs, 2),
        "per_s": round(count / secs),
    }


def spark_vs_drain(targets: list[Target], lake: Jetlake, count: int, batch: int) -> Result:
    """``count`` messages stored in both servers; ``ratio`` is the drain's time over Spark's median
    read, ``ratio_cold`` over Spark's first read in the new session."""
    out: Result = {"workload": "spark_vs_drain", "messages": count, "batch": batch}
    for t in targets:
        fill_s = fill_stored(t, lake, STREAM, PREFIX, count)
        res = (
            spark_read(str(lake.data_root), count)
            if t.name == "jetlake"
            else asyncio.run(drain(t.url, count, batch))
        )
        out[t.name] = res | {"fill_s": fill_s}
    drain_s = out["jetstream"]["seconds"]
    out["ratio"] = round(drain_s / out["jetlake"]["seconds"], 3)
    out["ratio_cold"] = round(drain_s / out["jetlake"]["cold_s"], 3)
    return out
