"""Retention and sealing race a live gateway: publishes keep committing while the jobs swap files
(through delta-rs, whichever commits second would fail its conflict check, #3890; jetlake's own log
commits conflict only where files really collide). Every acknowledged message that is still visible
stays readable; nothing removed comes back."""

from __future__ import annotations

import asyncio
import json
import time

import nats
import pytest
from pyspark.sql import SparkSession

from spark_jobs import compaction
from storage_delta.commit.store import StoreRoot
from storage_delta.tables.removals import load_stream_states
from tests.harness import Jetlake
from tests.streams_script import full_state, run_step

KEEP = 300


async def _publish(url: str, name: str, enough: asyncio.Event, acked: list[int]) -> None:
    """Rounds of 25 acknowledged publishes until told to stop; ``acked`` gets the sequences."""
    nc = await nats.connect(url)
    try:
        i = 0
        while not enough.is_set():
            replies = await asyncio.gather(
                *[nc.request(f"{name.lower()}.s{j % 3}", b"m-%d" % j, timeout=10) for j in range(i, i + 25)]
            )
            for r in replies:
                body = json.loads(r.data)
                assert "error" not in body, body
                acked.append(body["seq"])
            i += 25
            await asyncio.sleep(0.01)
    finally:
        await nc.close()


def _seqs(spark: SparkSession, root: str, stream: str, view: str) -> list[int]:
    df = spark.read.format("jetlake").option("root", root).option("stream", stream).option("view", view)
    return [r.seq for r in df.load().select("seq").orderBy("seq").collect()]


@pytest.mark.spark
@pytest.mark.slow
async def test_jobs_race_live_ingest(spark: SparkSession, jetlake: Jetlake, unique: str) -> None:
    nc = await nats.connect(jetlake.url)
    try:
        await nc.jetstream().add_stream(name=unique, subjects=[f"{unique.lower()}.>"], max_msgs=KEEP)
        root = StoreRoot(str(jetlake.data_root))
        enough = asyncio.Event()
        acked: list[int] = []
        publisher = asyncio.create_task(_publish(jetlake.url, unique, enough, acked))
        runs: list[compaction.Outcome] = []
        try:
            # Until the jobs have removed rows twice while publishes were committing. Limit removals
            # reach the removal log every five seconds, so rounds are paced and bounded by time.
            deadline = time.monotonic() + 120
            while sum(1 for r in runs if r.rows_removed) < 2:
                runs.append(await asyncio.to_thread(compaction.retention, spark, root, load_stream_states))
                runs.append(await asyncio.to_thread(compaction.seal, spark, root))
                assert not publisher.done(), publisher
                assert time.monotonic() < deadline, (len(acked), runs[-2:])
                await asyncio.sleep(0.5)
        finally:
            enough.set()
        await publisher
        assert acked == list(range(1, len(acked) + 1))
        await asyncio.sleep(6)  # limit removals are recorded within about five seconds
        await asyncio.to_thread(compaction.retention, spark, root, load_stream_states)

        last = acked[-1]
        expected = list(range(last - KEEP + 1, last + 1))
        state = await full_state(nc, unique)
        assert (state["messages"], state["first_seq"], state["last_seq"]) == (KEEP, expected[0], last)
        # Nothing acknowledged and visible is lost, nothing removed comes back: the raw table holds
        # exactly what the API shows.
        assert await asyncio.to_thread(_seqs, spark, root.uri, unique, "logical") == expected
        assert await asyncio.to_thread(_seqs, spark, root.uri, unique, "raw") == expected
        for seq in (expected[0], expected[len(expected) // 2], last):
            got = await run_step(nc, unique, ("get", {"seq": seq}))
            assert got["message"]["seq"] == seq
    finally:
        await nc.close()
