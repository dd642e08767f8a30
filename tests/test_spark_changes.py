"""The change feed (``view=changes``): a copy that applies each micro-batch's appends and then its
removals stays equal to the stream's logical view through every kind of removal (acks on a work
queue, deletes, purges, a MaxMsgs limit), while the gateway's compaction and the retention job
rewrite and remove files beneath the running query; a batch read of the feed gives the same copy."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy
from pyspark.sql import DataFrame, Row, SparkSession

from spark_jobs import compaction
from storage_delta.commit.store import StoreRoot
from storage_delta.tables.removals import load_stream_states
from tests.differential import api
from tests.harness import Jetlake

#: Limit removals reach the removal log within about five seconds (gateway/adapters/removals.py).
RECORDED_S = 6.0


def _apply(copy: dict[int, bytes], rows: Iterable[Row]) -> None:
    """A micro-batch into the copy: its appends, then its removals."""
    rows = list(rows)
    for r in rows:
        if r.op == "append":
            copy[r.seq] = bytes(r.data)
    for r in rows:
        if r.op == "remove":
            for seq in [s for s in copy if r.seq <= s <= r.last_seq]:
                del copy[seq]


def _read(spark: SparkSession, root: str, stream: str, view: str) -> DataFrame:
    return (
        spark.read.format("jetlake").option("root", root).option("stream", stream).option("view", view).load()
    )


def _logical(spark: SparkSession, root: str, stream: str) -> dict[int, bytes]:
    return {
        r.seq: bytes(r.data) for r in _read(spark, root, stream, "logical").select("seq", "data").collect()
    }


@pytest.mark.spark
@pytest.mark.slow
async def test_change_feed_keeps_a_copy_exact(
    spark: SparkSession, jetlake: Jetlake, unique: str, tmp_path: Path
) -> None:
    root = str(jetlake.data_root)
    copy: dict[int, bytes] = {}
    batches: list[Any] = []

    def on_batch(df: DataFrame, _batch: int) -> None:
        rows = df.collect()
        batches.append(rows)
        _apply(copy, rows)

    nc = await nats.connect(jetlake.url)
    try:
        js = nc.jetstream()
        subjects = [f"{unique}.a", f"{unique}.b"]
        await js.add_stream(name=unique, subjects=[f"{unique}.>"], retention=RetentionPolicy.WORK_QUEUE)
        query = (
            spark.readStream.format("jetlake")
            .option("root", root)
            .option("stream", unique)
            .option("view", "changes")
            .load()
            .writeStream.foreachBatch(on_batch)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(processingTime="100 milliseconds")
            .start()
        )
        seq = 0

        async def publish(n: int) -> None:
            nonlocal seq
            for _ in range(n):  # one commit each: small files for the gateway's compaction
                seq += 1
                await js.publish(subjects[seq % 2], b"m%d" % seq)

        async def settled() -> None:
            await asyncio.sleep(RECORDED_S)
            await asyncio.to_thread(query.processAllAvailable)
            assert copy == await asyncio.to_thread(_logical, spark, root, unique)

        try:
            await publish(60)
            await settled()
            assert len(copy) == 60
            for s in (5, 7):
                assert (await api(nc, f"STREAM.MSG.DELETE.{unique}", {"seq": s}))["success"]
            assert (await api(nc, f"STREAM.PURGE.{unique}", {"filter": subjects[1], "keep": 3}))["success"]
            await settled()
            # Acks on a work queue remove what they ack.
            sub = await js.pull_subscribe(
                subjects[0], durable="worker", config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT)
            )
            for msg in await sub.fetch(6, timeout=5):
                await msg.ack_sync()
            await publish(40)
            # The retention job rewrites and drops files beneath the running query.
            store = StoreRoot(root)
            await asyncio.to_thread(compaction.retention, spark, store, load_stream_states)
            await settled()
            # A MaxMsgs limit removes the oldest.
            info = await js.stream_info(unique)
            config = info.config
            config.max_msgs = 20
            await js.update_stream(config)
            await publish(10)
            await asyncio.to_thread(compaction.retention, spark, store, load_stream_states)
            await settled()
            assert len(copy) == 20
        finally:
            await asyncio.to_thread(query.stop)
        assert query.exception() is None
        # Removals arrived in their own rows, and the offsets name the removal log's version.
        assert any(r.op == "remove" for rows in batches for r in rows)
        progress = query.lastProgress
        assert progress is not None
        assert "removals" in json.loads(progress["sources"][0]["endOffset"])

        # A batch read of the feed, applied the same way, gives the same copy.
        again: dict[int, bytes] = {}
        _apply(again, _read(spark, root, unique, "changes").collect())
        assert again == copy
    finally:
        await nc.close()
