"""kill -9 of the gateway: every PubAck'd message survives, stream info comes back the same."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from tests.harness import Jetlake, duckdb_connection, scrub, stop

#: ``alone``: kill -9 trials under sync publishing; a neighbour's fsyncs would stretch their waits.
pytestmark = pytest.mark.alone


async def publish_until_killed(
    gw: Jetlake, stream: str, kill_after_s: float, publishers: int = 8
) -> dict[int, bytes]:
    """Publish as fast as PubAcks come back; kill the gateway mid-stream; return what was acked
    (sequence → payload)."""
    nc = await nats.connect(gw.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
        acked: dict[int, bytes] = {}
        stop = asyncio.Event()

        async def publisher(worker: int) -> None:
            i = 0
            while not stop.is_set():
                payload = f"{worker}-{i}".encode()
                try:
                    ack = await js.publish(f"{stream.lower()}.{worker}", payload, timeout=1)
                except Exception:
                    return
                acked[ack.seq] = payload
                i += 1

        tasks = [asyncio.create_task(publisher(w)) for w in range(publishers)]
        await asyncio.sleep(kill_after_s)
        gw.kill_gateway()
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        await nc.close()
    return acked


async def stream_info(url: str, stream: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    try:
        msg = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=5)
    finally:
        await nc.close()
    answer: dict[str, Any] = json.loads(msg.data)
    return answer


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kill_after", "publishers"),
    [
        (0.05, 8),  # at once: the first commits are in flight
        (random.Random(1).uniform(0.3, 1.5), 8),
        (random.Random(2).uniform(0.3, 1.5), 32),  # larger group commits
        (3.0, 32),  # after checkpoints may have started
    ],
)
def test_kill_9_loses_no_acked_message(tmp_path: Path, kill_after: float, publishers: int) -> None:
    gw = Jetlake(tmp_path)
    gw.start()
    try:
        stream = "CRASH"
        acked = asyncio.run(publish_until_killed(gw, stream, kill_after, publishers))
        assert acked, "the load published nothing before the kill"
        gw.start_gateway()
        info = asyncio.run(stream_info(gw.url, stream))
        con = duckdb_connection()
        rows = con.execute(
            "SELECT seq, data FROM delta_scan(?) WHERE stream = ? ORDER BY seq",
            [str(gw.data_root / "messages"), stream],
        ).fetchall()
        seqs = [r[0] for r in rows]
        stored = {seq: bytes(data) for seq, data in rows}
        # every acked message is stored exactly once, under the sequence its PubAck named, and
        # sequences are contiguous
        assert {seq: stored.get(seq) for seq in acked} == acked
        assert seqs == list(range(1, len(seqs) + 1))
        assert len(set(stored.values())) == len(seqs)
        # every table stays a valid Delta table for an independent reader
        for table in sorted(p.name for p in gw.data_root.iterdir() if (p / "_delta_log").is_dir()):
            con.execute("SELECT count(*) FROM delta_scan(?)", [str(gw.data_root / table)]).fetchall()
        assert info["state"]["messages"] == len(seqs)
        assert info["state"]["last_seq"] == len(seqs)
        # a clean restart changes nothing the API shows
        before = scrub(info)
        assert gw.stop_gateway() == 0
        gw.start_gateway()
        assert scrub(asyncio.run(stream_info(gw.url, stream))) == before
    finally:
        gw.stop()


async def account_info(url: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    try:
        msg = await nc.request("$JS.API.INFO", b"", timeout=5)
    finally:
        await nc.close()
    answer: dict[str, Any] = json.loads(msg.data)
    return answer


@pytest.mark.slow
def test_leaf_reconnects_after_server_restart(tmp_path: Path) -> None:
    """The nats-server restarts: the gateway's leaf link comes back by itself and serves again."""
    gw = Jetlake(tmp_path)
    gw.start()
    try:
        assert asyncio.run(account_info(gw.url))["streams"] == 0
        asyncio.run(publish_n(gw.url, "RECON", 5))
        stop(gw.server)
        gw.start_server()
        deadline = time.monotonic() + 30
        while True:
            try:
                info = asyncio.run(stream_info(gw.url, "RECON"))
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert info["state"]["messages"] == 5
        assert asyncio.run(publish_n(gw.url, "RECON", 1, create=False)) == [6]
    finally:
        gw.stop()


async def publish_n(url: str, stream: str, n: int, create: bool = True) -> list[int]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        if create:
            await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
        seqs = [(await js.publish(f"{stream.lower()}.x", b"m")).seq for _ in range(n)]
    finally:
        await nc.close()
    return seqs
