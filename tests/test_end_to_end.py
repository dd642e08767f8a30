"""Issue #2's end-to-end path: 1,000 messages through nats-py into Delta, back out through a pull
consumer, and read from the table by two independent readers (DuckDB's delta extension, Spark)."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from tests.harness import Jetlake, duckdb_connection

N = 1000


def expected_rows(prefix: str) -> list[tuple[str, bytes, str]]:
    return [(f"{prefix}.{i % 4}", f"payload-{i}".encode(), str(i)) for i in range(N)]


async def publish_and_drain(url: str, stream: str, prefix: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[f"{prefix}.>"])
        rows = expected_rows(prefix)
        acks = await asyncio.gather(*[js.publish(s, d, headers={"X-Idx": i}) for s, d, i in rows])
        sub = await js.pull_subscribe(f"{prefix}.>", durable="drain")
        got: list[tuple[str, bytes, str]] = []
        while len(got) < N:
            for m in await sub.fetch(250, timeout=5):
                got.append((m.subject, m.data, (m.headers or {})["X-Idx"]))
                await m.ack()
        info = await js.stream_info(stream)
    finally:
        await nc.close()
    return {"acks": [a.seq for a in acks], "got": got, "messages": info.state.messages}


@pytest.fixture(scope="module")
def drained(jetlake: Jetlake) -> dict[str, Any]:
    return asyncio.run(publish_and_drain(jetlake.url, "E2E", "e2e"))


def test_thousand_messages_round_trip(drained: dict[str, Any]) -> None:
    assert drained["acks"] == list(range(1, N + 1))
    assert drained["got"] == expected_rows("e2e")
    assert drained["messages"] == N


def test_duckdb_reads_the_same_rows(drained: dict[str, Any], jetlake: Jetlake) -> None:
    con = duckdb_connection()
    rows = con.execute(
        "SELECT seq, subject, data, hdrs FROM delta_scan(?) WHERE stream = 'E2E' ORDER BY seq",
        [str(jetlake.data_root / "messages")],
    ).fetchall()
    assert [r[0] for r in rows] == list(range(1, N + 1))
    assert [(r[1], bytes(r[2])) for r in rows] == [(s, d) for s, d, _ in expected_rows("e2e")]
    assert all(
        bytes(r[3]).startswith(b"NATS/1.0\r\n") and f"X-Idx: {i}".encode() in bytes(r[3])
        for i, r in enumerate(rows)
    )
    # the catalog is a valid Delta table too
    assert con.execute(
        "SELECT count(*) FROM delta_scan(?) WHERE kind = 'stream' AND name = 'E2E'",
        [str(jetlake.data_root / "catalog")],
    ).fetchone() == (1,)


@pytest.mark.spark
def test_spark_reads_the_same_rows(drained: dict[str, Any], jetlake: Jetlake, spark: SparkSession) -> None:
    df = (
        spark.read.format("jetlake")
        .option("root", str(jetlake.data_root))
        .option("stream", "E2E")
        .load()
        .select("seq", "subject", "data")
    )
    expected = spark.createDataFrame(
        [(i + 1, s, bytearray(d)) for i, (s, d, _) in enumerate(expected_rows("e2e"))],
        schema=df.schema,
    )
    assert_df_equality(df, expected, ignore_row_order=True)
