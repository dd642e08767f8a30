"""``many_streams`` (#23): ``streams`` streams created, each updated once, one message published to
each (each PubAck awaited), a durable consumer created on each, the server that stores them
restarted (jetlake: the gateway), each consumer updated and deleted, then every stream deleted,
on the real JetStream and on jetlake in one run; seconds per phase and jetlake's time
over JetStream's. Requests go one at a time (each answer awaited), as a script or an application
that sets up its streams does; ``--parallel`` keeps more requests in flight at once (jetlake
answers the requests of different streams at once, so that their catalog changes share commits).

Memory per idle stream and per idle consumer: the resident set (``VmRSS``) of each server process
after the streams (with their one message) and again after the consumers, less what it held before,
divided by their number. For jetlake the gateway and its hub nats-server are reported apart (the hub
holds one subscription per stream subject, the leaf link's interest).

    python -m bench.many_streams [--streams 1000] [--parallel 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client

from tests.differential import api
from tests.harness import Jetlake, ReferenceJetStream, serving

Result = dict[str, Any]
SERVERS = ("jetstream", "jetlake")
PHASES = (
    "create",
    "update",
    "publish",
    "consumer_create",
    "consumer_update",
    "consumer_delete",
    "delete",
)


def rss_bytes(pid: int) -> int:
    """The resident set of process ``pid`` (``VmRSS`` in ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def answered(reply: dict[str, Any]) -> None:
    assert "error" not in reply, reply


async def timed(
    out: Result, phase: str, streams: int, parallel: int, one: Callable[[int], Awaitable[None]]
) -> None:
    """Run ``one(i)`` for every stream, ``parallel`` at a time: ``<phase>_s``, the seconds, and
    ``<phase>_tenths_s``, those of the first and the last tenth of the streams (what grows with
    the number of streams shows as a last tenth slower than the first)."""
    marks = [time.perf_counter()]
    for start in range(0, streams, parallel):
        await asyncio.gather(*(one(i) for i in range(start, min(start + parallel, streams))))
        marks.append(time.perf_counter())
    tenth = max(1, len(marks) // 10)
    out[f"{phase}_s"] = round(marks[-1] - marks[0], 2)
    out[f"{phase}_tenths_s"] = [round(marks[tenth] - marks[0], 3), round(marks[-1] - marks[-1 - tenth], 3)]
    print(f"{phase}: {out[f'{phase}_s']} s", file=sys.stderr, flush=True)


async def phases(
    url: str,
    streams: int,
    parallel: int,
    pids: dict[str, int],
    restart: Callable[[], None],
    consumers: bool = True,
) -> Result:
    """Seconds per phase, and bytes of resident memory per idle stream and consumer per process.
    ``restart`` stops and starts the server that stores the streams once they have their
    consumers; ``restart_s`` is until it answers for the last stream again. Without
    ``consumers`` the phases end after the publishes (the streams are left to the server's stop)."""
    out: Result = {}
    rss = {name: [rss_bytes(pid)] for name, pid in pids.items()}

    async def create(nc: Client, i: int) -> None:
        answered(await api(nc, f"STREAM.CREATE.M{i}", {"name": f"M{i}", "subjects": [f"m{i}.>"]}))

    async def update(nc: Client, i: int) -> None:
        config = {"name": f"M{i}", "subjects": [f"m{i}.>"], "max_msgs": 1000}
        answered(await api(nc, f"STREAM.UPDATE.M{i}", config))

    async def consumer(nc: Client, i: int, ack_wait_s: int) -> None:
        config = {"durable_name": "C", "ack_policy": "explicit", "ack_wait": ack_wait_s * 1_000_000_000}
        answered(await api(nc, f"CONSUMER.CREATE.M{i}.C", {"stream_name": f"M{i}", "config": config}))

    async def consumer_delete(nc: Client, i: int) -> None:
        answered(await api(nc, f"CONSUMER.DELETE.M{i}.C"))

    async def delete(nc: Client, i: int) -> None:
        gone = await api(nc, f"STREAM.DELETE.M{i}")
        assert gone.get("success"), gone

    async with await nats.connect(url) as nc:
        js = nc.jetstream()

        async def publish(i: int) -> None:
            await js.publish(f"m{i}.x", b"x")

        await timed(out, "create", streams, parallel, lambda i: create(nc, i))
        await timed(out, "update", streams, parallel, lambda i: update(nc, i))
        await timed(out, "publish", streams, parallel, publish)
        for name, pid in pids.items():
            rss[name].append(rss_bytes(pid))
        if not consumers:
            return with_memory(out, rss, streams)
        await timed(out, "consumer_create", streams, parallel, lambda i: consumer(nc, i, 30))
        for name, pid in pids.items():
            rss[name].append(rss_bytes(pid))
    # A fresh connection after the restart: a client's reconnect back-off is not the server's time.
    t0 = time.perf_counter()
    await asyncio.to_thread(restart)
    async with await nats.connect(url) as nc:
        info = await api(nc, f"STREAM.INFO.M{streams - 1}")
        out["restart_s"] = round(time.perf_counter() - t0, 2)
        assert info["state"]["messages"] == 1, info
        await timed(out, "consumer_update", streams, parallel, lambda i: consumer(nc, i, 60))
        await timed(out, "consumer_delete", streams, parallel, lambda i: consumer_delete(nc, i))
        await timed(out, "delete", streams, parallel, lambda i: delete(nc, i))
    return with_memory(out, rss, streams)


def with_memory(out: Result, rss: dict[str, list[int]], streams: int) -> Result:
    """``out`` with each process's resident set at the start and its growth per stream (and per
    consumer, when they were made) from the readings ``rss``."""
    for name, (before, with_streams, *with_consumers) in rss.items():
        out[f"{name}_rss_mb"] = round(before / 2**20, 1)
        out[f"{name}_bytes_per_stream"] = round((with_streams - before) / streams)
        for after in with_consumers:
            out[f"{name}_bytes_per_consumer"] = round((after - with_streams) / streams)
    return out


def run(
    work: Path, streams: int, parallel: int, servers: tuple[str, ...] = SERVERS, consumers: bool = True
) -> Result:
    out: Result = {"workload": "many_streams", "streams": streams, "parallel": parallel}
    reference = ReferenceJetStream(work / "js")

    def reference_pids() -> dict[str, int]:
        assert reference.proc is not None
        return {"server": reference.proc.pid}

    def reference_restart() -> None:
        reference.stop()
        reference.start()

    for _ in serving(reference) if "jetstream" in servers else ():
        out["jetstream"] = asyncio.run(
            phases(reference.url, streams, parallel, reference_pids(), reference_restart, consumers)
        )
    lake = Jetlake(work / "jl")

    def lake_pids() -> dict[str, int]:
        assert lake.gateway is not None
        assert lake.server is not None
        return {"gateway": lake.gateway.pid, "hub": lake.server.pid}

    def lake_restart() -> None:
        lake.stop_gateway()
        lake.start_gateway()

    for _ in serving(lake) if "jetlake" in servers else ():
        out["jetlake"] = asyncio.run(
            phases(lake.url, streams, parallel, lake_pids(), lake_restart, consumers)
        )
    for phase in (*PHASES, "restart"):
        if all(f"{phase}_s" in out.get(server, {}) for server in SERVERS):
            out[f"ratio_{phase}"] = round(out["jetlake"][f"{phase}_s"] / out["jetstream"][f"{phase}_s"], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--parallel", type=int, default=1, help="requests in flight at once")
    ap.add_argument("--servers", default=",".join(SERVERS), help="which of them, comma-separated")
    ap.add_argument(
        "--consumers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the consumer phases, the restart and the deletes (without: streams and publishes only)",
    )
    args = ap.parse_args()
    servers = tuple(s for s in args.servers.split(",") if s)
    with tempfile.TemporaryDirectory(prefix="bench-many-streams-") as tmp:
        result = run(Path(tmp), args.streams, args.parallel, servers, args.consumers)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
