"""Compaction throughput: the same removal carried out by the real JetStream and by jetlake's
retention job, the job on a standalone Spark cluster with one and with two workers.

The workload: a stream of ``count`` messages taking turns on ``<prefix>.keep`` and
``<prefix>.drop``, then ``STREAM.PURGE`` with the filter ``<prefix>.drop``: half the messages go,
spread over every block, so no block can be dropped whole and every one is rewritten. JetStream's
figure is its purge (its file store removes the messages itself); jetlake answers the purge from its
removal log at once and the retention job removes the rows afterwards: its figure is the job's
rows removed per second, without the cluster's start (the session is up and warm before the clock
starts). ``ratio`` compares one worker with JetStream, ``scaling`` two workers with one.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import nats
from pyspark.sql import SparkSession

from bench.stored import write_messages
from bench.targets import Target, acked_publish, add_stream, wait_stream_messages
from spark_jobs import compaction
from spark_jobs.session import build_spark_session
from storage_delta.commit.store import StoreRoot
from storage_delta.tables.removals import compact_removals, load_stream_states
from tests.harness import Jetlake
from tests.standalone import standalone_cluster

Result = dict[str, Any]
FLUSH_EVERY = 1000


async def _purge(url: str, stream: str, subject: str) -> tuple[int, float]:
    nc = await nats.connect(url)
    try:
        t0 = time.monotonic()
        msg = await nc.request(
            f"$JS.API.STREAM.PURGE.{stream}", json.dumps({"filter": subject}).encode(), timeout=600
        )
        secs = time.monotonic() - t0
    finally:
        await nc.close()
    body = json.loads(msg.data)
    assert body.get("success"), body
    return int(body["purged"]), secs


def _subject(prefix: str, seq: int) -> str:
    return f"{prefix}.{'keep' if seq % 2 == 0 else 'drop'}"


async def _publish_alternating(url: str, prefix: str, count: int) -> None:
    """Core publishes flushed every ``FLUSH_EVERY`` (so the server keeps up); then acked ones, the
    first of which tells how many are stored (it is stored after all of them), up to ``count``."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for s in range(1, count):
            await nc.publish(_subject(prefix, s), b"payload-%d" % s)
            if s % FLUSH_EVERY == 0:
                await nc.flush()
        stored = 0
        while stored < count:
            stored = await acked_publish(js, _subject(prefix, stored + 1), b"payload-%d" % (stored + 1))
    finally:
        await nc.close()


def _jetstream(t: Target, count: int) -> Result:
    stream, prefix = "BCOMPACT", "bcompact"
    asyncio.run(add_stream(t.url, stream, [f"{prefix}.>"]))
    asyncio.run(_publish_alternating(t.url, prefix, count))
    asyncio.run(wait_stream_messages(t.url, stream, count))
    purged, secs = asyncio.run(_purge(t.url, stream, f"{prefix}.drop"))
    return {"removed": purged, "seconds": round(secs, 2), "removed_per_s": round(purged / secs)}


async def _delete_stream(url: str, stream: str) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().delete_stream(stream)
    finally:
        await nc.close()


def _jetlake(lake: Jetlake, count: int, workers: int, workdir: Path) -> Result:
    """A stream of its own for this run, deleted after it and its removal-log rows folded away, so
    each run's job finds the same work and the same state to load."""
    stream, prefix = f"BCOMPACT{workers}", f"bcompact{workers}"
    asyncio.run(add_stream(lake.url, stream, [f"{prefix}.>"]))
    assert lake.stop_gateway() == 0
    root = StoreRoot(str(lake.data_root))
    write_messages(root, stream, [f"{prefix}.keep", f"{prefix}.drop"], count, time.time_ns())
    lake.start_gateway(ready_s=3600)
    asyncio.run(wait_stream_messages(lake.url, stream, count))
    purged, purge_s = asyncio.run(_purge(lake.url, stream, f"{prefix}.drop"))
    with standalone_cluster(workdir / f"cluster{workers}", workers) as (url, _):
        spark = build_spark_session(master=url, app_name=f"bench-compaction-{workers}", quiet=True)
        try:
            # Executors start with the first job: warm them all, their Python workers importing what
            # the job's tasks use, before the clock starts (a lambda travels by value; this module
            # is not importable on the executors).
            warm = spark.sparkContext.parallelize(range(workers * 4), workers * 4)
            warm.map(lambda _: len(__import__("spark_jobs.compaction").__name__)).count()
            t0 = time.monotonic()
            out = compaction.retention(spark, root, load_stream_states)
            secs = time.monotonic() - t0
            # The next run must find only its own stream's work and state: this one goes, its files
            # and its removal-log rows with it.
            asyncio.run(_delete_stream(lake.url, stream))
            compaction.retention(spark, root, load_stream_states)
            compact_removals(root)
        finally:
            spark.stop()
    assert out.rows_removed == purged, (out, purged)
    return {
        "workers": workers,
        "removed": out.rows_removed,
        "purge_answer_s": round(purge_s, 2),
        "seconds": round(secs, 2),
        "removed_per_s": round(out.rows_removed / secs),
        "bytes_before": out.bytes_before,
        "bytes_after": out.bytes_after,
    }


def compaction_throughput(targets: list[Target], lake: Jetlake, count: int, workdir: Path) -> Result:
    """Both servers remove the same half of ``count`` messages; jetlake with one and two workers."""
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()  # a local session of an earlier workload would be reused instead of the cluster
    out: Result = {"workload": "compaction", "messages": count}
    reference = next(t for t in targets if t.name == "jetstream")
    out["jetstream"] = _jetstream(reference, count)
    out["jetlake_1_worker"] = _jetlake(lake, count, 1, workdir)
    out["jetlake_2_workers"] = _jetlake(lake, count, 2, workdir)
    out["ratio"] = round(out["jetlake_1_worker"]["removed_per_s"] / out["jetstream"]["removed_per_s"], 3)
    out["scaling"] = round(
        out["jetlake_2_workers"]["removed_per_s"] / out["jetlake_1_worker"]["removed_per_s"], 3
    )
    return out
