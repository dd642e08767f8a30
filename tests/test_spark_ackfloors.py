"""The ack-floor job on a store a real gateway wrote: its figures equal what the consumer API says
(ack floor, pending, redelivered) and its lag is the stream's last sequence minus the floor. Two
runs leave two rows per consumer (history), read back by Spark (chispa) and DuckDB."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from spark_jobs.cli import run_job
from spark_jobs.settings import JobSettings
from storage_delta.commit.store import StoreRoot
from storage_delta.tables.ackfloors import latest_run
from storage_delta.tables.jobruns import job_figures
from tests.harness import Jetlake, duckdb_connection
from tests.jsapi import api, consumer, publish, pull, stream

pytestmark = pytest.mark.spark

COLUMNS = ["stream", "consumer", "floor_seq", "floor_cseq", "num_ack_pending", "num_redelivered", "lag"]
WAIT = {"batch": 6, "expires": 1_000_000_000}


async def _live(nc: Any, name: str) -> list[tuple[Any, ...]]:
    """What the API says of each consumer, in the job's columns; lag from the stream's last seq."""
    last = (await api(nc, f"STREAM.INFO.{name}"))["state"]["last_seq"]
    out = []
    for durable in ("k", "w"):
        info = await api(nc, f"CONSUMER.INFO.{name}.{durable}")
        floor = info["ack_floor"]
        out.append(
            (
                name,
                durable,
                floor["stream_seq"],
                floor["consumer_seq"],
                info["num_ack_pending"],
                info["num_redelivered"],
                last - floor["stream_seq"],
            )
        )
    return out


def _job(spark: SparkSession, root: StoreRoot, name: str) -> list[tuple[Any, ...]]:
    """``jetlake jobs run ackfloors``, as the CLI runs it (and records it in ``jobruns``)."""
    runs = job_figures(root).get("ackfloors")
    run_job(spark, "ackfloors", JobSettings(data_root=root.uri))
    run = latest_run(root)
    assert run is not None
    assert job_figures(root)["ackfloors"].runs == (runs.runs if runs else 0) + 1
    return [tuple(r[c] for c in COLUMNS) for r in run.rows if r["stream"] == name]


async def test_ackfloors_equal_consumer_info(spark: SparkSession, jetlake: Jetlake, unique: str) -> None:
    root = StoreRoot(str(jetlake.data_root))
    nc = await nats.connect(jetlake.url)
    try:
        await stream(nc, unique)
        await publish(nc, unique, 10)
        await consumer(nc, unique, "k", ack_policy="explicit")
        await consumer(nc, unique, "w", ack_policy="explicit")
        got = await pull(nc, unique, "k", WAIT, 6)
        assert len([g for g in got if g[0] == "msg"]) == 6
        for seq in (1, 2, 3):
            await nc.request(f"$JS.ACK.{unique}.k.1.{seq}.{seq}.0.0", b"+ACK", timeout=2)
        await nc.request(f"$JS.ACK.{unique}.k.1.5.5.0.0", b"-NAK", timeout=2)
        again = await pull(nc, unique, "k", {"batch": 1, "expires": 1_000_000_000}, 1)
        assert again[0][4] == "5"  # the nak'ed message came back (its second delivery)
        await asyncio.sleep(1.0)  # unsynced rows (the redelivery) commit within 100 ms
        first_live = await _live(nc, unique)
        assert first_live[0][2:6] == (3, 3, 3, 1)  # the case is what it means to be
        first = _job(spark, root, unique)

        for seq in (4, 5, 6):
            await nc.request(f"$JS.ACK.{unique}.k.1.{seq}.{seq}.0.0", b"+ACK", timeout=2)
        second_live = await _live(nc, unique)
        second = _job(spark, root, unique)
    finally:
        await nc.close()

    schema = ", ".join(f"{c} {'string' if c in ('stream', 'consumer') else 'long'}" for c in COLUMNS)
    for job, live in ((first, first_live), (second, second_live)):
        assert_df_equality(spark.createDataFrame(job, schema), spark.createDataFrame(live, schema))
    # History: each run appended its rows with its own time; DuckDB reads the table too.
    con = duckdb_connection()
    runs = con.execute(
        f"SELECT run_ts, consumer, lag FROM delta_scan('{root.uri}/ackfloors') "
        "WHERE stream = ? ORDER BY run_ts, consumer",
        [unique],
    ).fetchall()
    assert [(c, lag) for _, c, lag in runs] == [("k", 7), ("w", 10), ("k", 4), ("w", 10)]
    assert runs[0][0] == runs[1][0] < runs[2][0] == runs[3][0]
