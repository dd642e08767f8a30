"""Batch read of a whole stream: Spark reading jetlake's Delta table against draining the same
messages from the real JetStream through a pull consumer with nats-py, the way a Python batch job
without jetlake would get them."""

from __future__ import annotations

import asyncio
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


def spark_read(root: str, count: int) -> Result:
    """The messages and the sum of their payload lengths, so every row's data is read; the session is
    started (and the JVM warmed by a tiny job) before the clock starts."""
    spark = build_spark_session(quiet=True)
    spark.range(1).count()
    t0 = time.monotonic()
    df = spark.read.format("jetlake").option("root", root).option("stream", STREAM).load()
    row = df.selectExpr("count(*) AS n", "sum(length(data)) AS b").collect()[0]
    secs = time.monotonic() - t0
    assert row["n"] == count, row
    return {
        "messages": row["n"],
        "payload_bytes": row["b"],
        "seconds": round(secs, 2),
        "per_s": round(count / secs),
    }


def spark_vs_drain(targets: list[Target], lake: Jetlake, count: int, batch: int) -> Result:
    """``count`` messages stored in both servers; the ratio is Spark's rate over nats-py's."""
    out: Result = {"workload": "spark_vs_drain", "messages": count, "batch": batch}
    for t in targets:
        fill_s = fill_stored(t, lake, STREAM, PREFIX, count)
        res = (
            spark_read(str(lake.data_root), count)
            if t.name == "jetlake"
            else asyncio.run(drain(t.url, count, batch))
        )
        out[t.name] = res | {"fill_s": fill_s}
    out["ratio"] = round(out["jetlake"]["per_s"] / out["jetstream"]["per_s"], 3)
    return out
