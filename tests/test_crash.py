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


async def publish_until_killed(gw: Jetlake, stream: str, kill_after_s: float) -> list[int]:
    """Publish as fast as PubAcks come back; kill the gateway mid-stream; return the acked seqs."""
    nc = await nats.connect(gw.url)
    js = nc.jetstream()
    await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
    acked: list[int] = []
    stop = asyncio.Event()

    async def publisher(worker: int) -> None:
        i = 0
        while not stop.is_set():
            try:
                ack = await js.publish(f"{stream.lower()}.{worker}", f"{worker}-{i}".encode(), timeout=1)
                acked.append(ack.seq)
            except Exception:
                return
            i += 1

    tasks = [asyncio.create_task(publisher(w)) for w in range(8)]
    await asyncio.sleep(kill_after_s)
    gw.kill_gateway()
    stop.set()
    await asyncio.gather(*tasks)
    await nc.close()
    return acked


async def stream_info(url: str, stream: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    msg = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=5)
    await nc.close()
    return json.loads(msg.data)


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(3))
def test_kill_9_loses_no_acked_message(tmp_path: Path, trial: int) -> None:
    gw = Jetlake(tmp_path)
    gw.start()
    try:
        stream = f"CRASH{trial}"
        kill_after = random.Random(trial).uniform(0.3, 1.5)
        acked = asyncio.run(publish_until_killed(gw, stream, kill_after))
        assert acked, "the load published nothing before the kill"
        gw.start_gateway()
        info = asyncio.run(stream_info(gw.url, stream))
        rows = (
            duckdb_connection()
            .execute(
                "SELECT seq FROM delta_scan(?) WHERE stream = ? ORDER BY seq",
                [str(gw.data_root / "messages"), stream],
            )
            .fetchall()
        )
        seqs = [r[0] for r in rows]
        # every acked message is stored exactly once, and sequences are contiguous
        assert set(acked) <= set(seqs)
        assert seqs == list(range(1, len(seqs) + 1))
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
    msg = await nc.request("$JS.API.INFO", b"", timeout=5)
    await nc.close()
    return json.loads(msg.data)


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
    js = nc.jetstream()
    if create:
        await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
    seqs = [(await js.publish(f"{stream.lower()}.x", b"m")).seq for _ in range(n)]
    await nc.close()
    return seqs
