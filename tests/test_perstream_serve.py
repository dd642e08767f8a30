"""Per-stream ownership end to end (#19, docs/perstream-status.md, step 5): two ``jetlake serve``
processes on one store root and one hub, in per-stream mode (the internal switch
``JETLAKE_PER_STREAM=1`` while it is incomplete). Two streams are placed one on each gateway;
``kill -9`` of one stream's owner hands that stream to the other gateway within 2 s while the other
stream keeps being served; nothing acknowledged is lost and nothing is stored twice. Real
processes; what is checked is what clients see and what the Delta tables hold."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from storage_delta.commit.store import StoreRoot
from storage_delta.format import schema as sch
from tests.harness import Jetlake, Peer, wait_log
from tests.test_several_gateways import Publisher, stored_payloads
from tests.test_stream_fence import check_epochs_in_log

#: ``alone``: the handover bound (2 s) is a wall-clock bound.
pytestmark = [pytest.mark.slow, pytest.mark.alone]

PER_STREAM = {"JETLAKE_PER_STREAM": "1"}


async def leaders(nc: Client, streams: list[str]) -> dict[str, str]:
    """Each stream's owner as its info's ``cluster.leader`` says (streams not answered left out)."""
    found = {}
    for stream in streams:
        try:
            reply = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=0.5)
        except (NatsTimeout, NoRespondersError):
            continue
        leader = json.loads(reply.data).get("cluster", {}).get("leader")
        if leader:
            found[stream] = leader
    return found


def test_kill_9_of_one_streams_owner_moves_only_that_stream_within_2_s(tmp_path: Path) -> None:
    gw = Jetlake(tmp_path)
    gw.gateway_env = dict(PER_STREAM)
    gw.start()
    peer = Peer(gw, "gateway2", PER_STREAM)
    try:
        wait_log(peer.log, "per stream")
        result = asyncio.run(_two_streams_one_killed(gw, peer, StoreRoot(str(gw.data_root))))
    finally:
        peer.stop()
        gw.stop()
    moved_in, other_gap = result
    print(
        f"kill -9 to the moved stream's next PubAck: {moved_in:.2f} s; other stream's gap {other_gap:.2f} s"
    )
    assert moved_in < 2.0
    # the other stream's owner was not touched: no pause near a lease (1 s, what a takeover waits)
    assert other_gap < 0.5
    store = StoreRoot(str(gw.data_root))
    for table in (sch.MESSAGES, sch.CATALOG, sch.REMOVALS, sch.ACKS):
        if (gw.data_root / table).exists():
            check_epochs_in_log(store, table, partitioned=table == sch.MESSAGES)


async def _two_streams_one_killed(gw: Jetlake, peer: Peer, root: StoreRoot) -> tuple[float, float]:
    nc = await nats.connect(gw.url)
    js = nc.jetstream()
    try:
        for stream in ("S", "T"):
            await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"], duplicate_window=120)
        # the meta owner created both; placement spreads them, one per gateway
        deadline = time.monotonic() + 30
        while len(set((placed := await leaders(nc, ["S", "T"])).values())) < 2 or len(placed) < 2:
            assert time.monotonic() < deadline, f"never placed one per gateway: {placed}"
            await asyncio.sleep(0.1)
        assert gw.gateway is not None
        by_pid = {gw.gateway.pid: gw.kill_gateway, peer.proc.pid: lambda: peer.proc.kill()}
        killed_stream = "S"
        kill = next(k for pid, k in by_pid.items() if placed[killed_stream].endswith(f"-{pid}"))
        other = "T"

        pub = Publisher(js)
        acked: dict[str, list[float]] = {"S": [], "T": []}
        killed_at: list[float] = []
        per_stream = 120

        async def publisher(stream: str) -> None:
            for i in range(per_stream):
                await pub.publish(f"{stream.lower()}.x", f"{stream}-{i}")
                acked[stream].append(time.monotonic())
                if stream == killed_stream and i == per_stream // 3:
                    await asyncio.to_thread(kill)
                    killed_at.append(time.monotonic())

        await asyncio.wait_for(asyncio.gather(publisher("S"), publisher("T")), timeout=120)
        assert pub.errors == []
        for stream in ("S", "T"):
            payloads = stored_payloads(root, stream)
            assert sorted(payloads) == sorted(f"{stream}-{i}" for i in range(per_stream)), stream
        after = await leaders(nc, ["S", "T"])
        assert after["S"] == after["T"] == placed[other]  # the survivor serves both
        moved_in = min(t for t in acked[killed_stream] if t > killed_at[0]) - killed_at[0]
        around = [t for t in acked[other] if killed_at[0] - 1 < t < killed_at[0] + 3]
        other_gap = max((b - a for a, b in itertools.pairwise(around)), default=0.0)
        return moved_in, other_gap
    finally:
        await nc.close()
