"""``several_gateways`` (#19): aggregate ingest of several streams over one gateway and over two
gateways on one store, then the move after ``kill -9`` of a stream's gateway (another one started in
its place each time, and the next kill once the moves its start brought about are over), from the kill
to the next PubAck, a few times in a row.

Each stream is served by one gateway (per-stream ownership). A stream of ``num_replicas`` 1 goes to
its first-ranked gateway (rendezvous hashing of its name), so a few streams may well all land on
one. ``--spread`` creates the streams with ``num_replicas`` 2 and waits until they are placed half
on each gateway before the publishers start: the ingest over one gateway and over two.

    python -m bench.several_gateways [--streams 4] [--publishers 4] [--seconds 10] [--handovers 5] [--s3]
    python -m bench.several_gateways --spread [--streams 4] [--publishers 4] [--seconds 10] [--s3]

``--s3`` puts the store on S3 (a local moto server, as ``tests/test_storage_s3.py`` uses): the
lease is then a Delta table and objects, and a takeover's fences and loads are round trips.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError

from tests.harness import Jetlake, Peer, ReferenceJetStream, moto_s3, s3_options, stop, wait_log

Result = dict[str, Any]


async def ingest(url: str, streams: int, publishers: int, seconds: float, spread_over: int = 1) -> float:
    """Messages a second acknowledged while ``publishers`` per stream publish (each awaiting its
    PubAck, asking again after a time-out or "no responders", as through a stream's move) for
    ``seconds``. ``spread_over`` > 1 (per-stream ownership): the streams are created
    with that many replicas and the publishers wait until every gateway owns its share."""
    async with await nats.connect(url) as nc:
        js = nc.jetstream()
        for s in range(streams):
            await _create(js, f"I{s}", spread_over)
        if spread_over > 1:
            await _spread(nc, [f"I{s}" for s in range(streams)], spread_over)
        acked = 0
        deadline = time.monotonic() + seconds

        async def publisher(stream: int) -> None:
            nonlocal acked
            payload = b"x" * 128
            while time.monotonic() < deadline:
                try:
                    await js.publish(f"i{stream}.x", payload)
                except (NatsTimeout, NoRespondersError, NoStreamResponseError):
                    continue  # the stream is moving (a second gateway joined): asked again
                acked += 1

        started = time.monotonic()
        await asyncio.gather(*(publisher(s) for s in range(streams) for _ in range(publishers)))
        return acked / (time.monotonic() - started)


async def _create(js: JetStreamContext, name: str, replicas: int) -> None:
    """Asked again while the gateway does not yet count enough gateways live (400/10005)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            await js.add_stream(name=name, subjects=[f"{name.lower()}.>"], num_replicas=replicas)
            return
        except APIError as exc:
            if exc.err_code != 10005 or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _spread(nc: Client, names: list[str], gateways: int) -> None:
    """Until ``names`` are owned by ``gateways`` gateways, evenly (stream info ``cluster.leader``)."""
    deadline = time.monotonic() + 60
    while True:
        leaders = await _leaders(nc, names)
        counts = Counter(leaders)
        if (
            len(leaders) == len(names)
            and len(counts) == gateways
            and max(counts.values()) <= -(-len(names) // gateways)
        ):
            return
        assert time.monotonic() < deadline, f"never spread: {counts}"
        await asyncio.sleep(0.2)


async def next_ack_after(url: str, kill: Callable[[str], None]) -> float:
    """Seconds from ``kill(H's gateway)`` returning (the gateway serving stream H, as its info's
    ``cluster.leader`` names it, is dead) to the first PubAck of a publish retried with one
    ``Nats-Msg-Id``."""
    async with await nats.connect(url) as nc:
        js = nc.jetstream()
        await js.add_stream(name="H", subjects=["h.>"], duplicate_window=120)
        await js.publish("h.x", b"before")
        info = json.loads((await nc.request("$JS.API.STREAM.INFO.H", b"", timeout=5)).data)
        assert "cluster" in info, info
        await asyncio.to_thread(kill, info["cluster"]["leader"])
        killed = time.monotonic()
        while True:
            try:
                await js.publish("h.x", b"after", headers={"Nats-Msg-Id": f"h{killed}"}, timeout=0.25)
                return time.monotonic() - killed
            except (NatsTimeout, NoRespondersError, NoStreamResponseError):
                await asyncio.sleep(0.01)


def deployment(work: Path, s3: dict[str, str] | None) -> Jetlake:
    """A hub and its first gateway, on a local root or (``s3``: its storage options) on S3."""
    gw = Jetlake(work)
    if s3 is not None:
        gw.data_root = f"s3://lake/{work.name}"  # type: ignore[assignment]  # passed on as --data-root
        gw.gateway_env = {"JETLAKE_STORAGE_OPTIONS": ",".join(f"{k}={v}" for k, v in s3.items())}
    return gw


def one_gateway(
    work: Path, streams: int, publishers: int, seconds: float, s3: dict[str, str] | None
) -> float:
    gw = deployment(work, s3)
    gw.start()
    try:
        return asyncio.run(ingest(gw.url, streams, publishers, seconds))
    finally:
        gw.stop()


def two_gateways(
    work: Path, streams: int, publishers: int, seconds: float, handovers: int, s3: dict[str, str] | None
) -> Result:
    gw = deployment(work, s3)
    gw.start()
    peers = [Peer(gw, "gateway-1", gw.gateway_env)]
    try:
        wait_log(peers[0].log, "standing by: epoch 1 holds the store")
        rate = asyncio.run(ingest(gw.url, streams, publishers, seconds))
        assert gw.gateway is not None
        live = [gw.gateway, peers[0].proc]
        gaps = []

        def kill(leader: str) -> None:
            """``kill -9`` of the gateway named ``leader`` (``<leaf name>-<host>-<pid>``)."""
            proc = next(p for p in live if leader.endswith(f"-{p.pid}"))
            stop(proc, signal.SIGKILL)
            live.remove(proc)

        for n in range(2, handovers + 2):
            gaps.append(asyncio.run(next_ack_after(gw.url, kill)))
            peers.append(Peer(gw, f"gateway-{n}", gw.gateway_env))  # two gateways again
            wait_log(peers[-1].log, "jetlake serving")
            live.append(peers[-1].proc)
            asyncio.run(_drop_stream(gw.url, "H"))
            # the next kill once the planned moves to the gateway just started are over: a kill
            # during them would time both at once (#19)
            asyncio.run(_settled(gw.url, [f"I{s}" for s in range(streams)]))
        return {
            "msgs_per_s": round(rate),
            "handover_s": [round(g, 2) for g in gaps],
            "handover_median_s": round(statistics.median(gaps), 2),
        }
    finally:
        for peer in peers:
            stop(peer.proc)
        gw.stop()


def jetstream(work: Path, streams: int, publishers: int, seconds: float) -> Result:
    """The same ingest on the real JetStream (one server, a file store, ``sync_interval: always``
    as jetlake syncs every commit): what the gateways' rates are set against."""
    server = ReferenceJetStream(work, sync_interval="always")
    server.start()
    try:
        return {
            "jetstream_always_msgs_per_s": round(
                asyncio.run(ingest(server.url, streams, publishers, seconds))
            )
        }
    finally:
        server.stop()


async def _leaders(nc: Client, names: list[str]) -> list[str]:
    """The ``cluster.leader`` of each of ``names`` that answers its stream info within a second."""
    leaders: list[str] = []
    for name in names:
        with contextlib.suppress(NatsTimeout, NoRespondersError):
            reply = await nc.request(f"$JS.API.STREAM.INFO.{name}", b"", timeout=1)
            leaders.append(json.loads(reply.data).get("cluster", {}).get("leader", ""))
    return leaders


async def _settled(url: str, names: list[str]) -> None:
    """Until the moves a joining gateway brings about are over: two lease lengths for it to count
    as live and its share to be placed, then until every one of ``names`` answers with the same
    leader twice in a row (a stream of R 1 goes to its first-ranked gateway only, so how many
    move, if any, is the hashes' to say)."""
    await asyncio.sleep(2.0)
    deadline = time.monotonic() + 60
    async with await nats.connect(url) as nc:
        seen: list[str] = []
        while True:
            leaders = await _leaders(nc, names)
            if len(leaders) == len(names) and leaders == seen:
                return
            assert time.monotonic() < deadline, f"never settled: {leaders}"
            seen = leaders
            await asyncio.sleep(0.5)


def _ratios(out: Result, jetlake: dict[str, int]) -> None:
    """Each jetlake rate over the real JetStream's of the same run."""
    reference = out["jetstream_always_msgs_per_s"]
    out["ratios"] = {name: round(rate / reference, 2) for name, rate in jetlake.items()}


async def _drop_stream(url: str, name: str) -> None:
    async with await nats.connect(url) as nc:
        await nc.jetstream().delete_stream(name)


def spread(work: Path, streams: int, publishers: int, seconds: float, s3: dict[str, str] | None) -> Result:
    """The ingest over one gateway, then over two with the streams spread over both."""
    rates = []
    for gateways in (1, 2):
        gw = deployment(work / f"spread-{gateways}", s3)
        gw.start()
        peers = [Peer(gw, f"gateway-{n}", gw.gateway_env) for n in range(1, gateways)]
        try:
            for peer in peers:
                wait_log(peer.log, "jetlake serving")
            rates.append(round(asyncio.run(ingest(gw.url, streams, publishers, seconds, gateways))))
        finally:
            for peer in peers:
                stop(peer.proc)
            gw.stop()
    out: Result = {
        "workload": "several_gateways spread",
        "store": "s3 (moto)" if s3 is not None else "local",
        "streams": streams,
        "publishers_per_stream": publishers,
        "one_gateway_msgs_per_s": rates[0],
        "two_gateways_msgs_per_s": rates[1],
        **jetstream(work / "jetstream", streams, publishers, seconds),
    }
    _ratios(out, {"one_gateway": rates[0], "two_gateways": rates[1]})
    return out


def run(
    work: Path, streams: int, publishers: int, seconds: float, handovers: int, s3: dict[str, str] | None
) -> Result:
    out: Result = {
        "workload": "several_gateways",
        "store": "s3 (moto)" if s3 is not None else "local",
        "streams": streams,
        "publishers_per_stream": publishers,
    }
    out["one_gateway_msgs_per_s"] = round(one_gateway(work / "one", streams, publishers, seconds, s3))
    out["two_gateways"] = two_gateways(work / "two", streams, publishers, seconds, handovers, s3)
    out |= jetstream(work / "jetstream", streams, publishers, seconds)
    _ratios(
        out, {"one_gateway": out["one_gateway_msgs_per_s"], "two_gateways": out["two_gateways"]["msgs_per_s"]}
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--publishers", type=int, default=4, help="per stream")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--handovers", type=int, default=5)
    ap.add_argument("--s3", action="store_true", help="the store on S3 (a local moto server)")
    ap.add_argument("--spread", action="store_true", help="streams of R 2 spread: ingest over 1 and 2")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        s3 = s3_options(stack.enter_context(moto_s3())) if args.s3 else None
        if args.spread:
            result = spread(Path(tmp), args.streams, args.publishers, args.seconds, s3)
        else:
            result = run(Path(tmp), args.streams, args.publishers, args.seconds, args.handovers, s3)
        print(json.dumps(result))


if __name__ == "__main__":
    main()
