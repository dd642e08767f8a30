"""``mirror`` (#17): a stream on a real JetStream in domain ``core`` mirrored into the real JetStream
and into jetlake, in the same run: how long each takes to copy ``messages`` already stored (the
history), and then a live tail of ``live`` more published while both mirrors follow.

The core server is joined by leaf links to the real JetStream (a leafnode listener) and to jetlake's
hub; each mirror reaches it through ``external.api`` ``$JS.core.API``. The mirrors are made one
after the other (JetStream first), each from the same origin. Ratios: jetlake's copy rate over
JetStream's.

    python -m bench.mirror [--messages 100000] [--live 10000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client

from tests.differential import api
from tests.harness import linked_core

Result = dict[str, Any]
ORIGIN, SUBJECT = "BMIRROR", "bmirror.x"
WINDOW = 512


async def publish(nc: Client, count: int) -> None:
    js = nc.jetstream()
    for start in range(0, count, WINDOW):
        n = min(WINDOW, count - start)
        await asyncio.gather(*(js.publish(SUBJECT, b"x" * 64) for _ in range(n)))


async def caught_up(nc: Client, name: str, last_seq: int) -> float:
    """Seconds until ``name`` holds ``last_seq`` (polled every 20 ms)."""
    t0 = time.perf_counter()
    while True:
        info = await api(nc, f"STREAM.INFO.{name}")
        if info.get("state", {}).get("last_seq", 0) >= last_seq:
            return time.perf_counter() - t0
        await asyncio.sleep(0.02)


async def measure(core_url: str, targets: dict[str, str], messages: int, live: int) -> Result:
    out: Result = {"workload": "mirror", "messages": messages, "live": live}
    async with await nats.connect(core_url) as core:
        await api(core, f"STREAM.CREATE.{ORIGIN}", {"name": ORIGIN, "subjects": ["bmirror.>"]})
        t0 = time.perf_counter()
        await publish(core, messages)
        out["origin_publish_s"] = round(time.perf_counter() - t0, 2)
        conns = {name: await nats.connect(url) for name, url in targets.items()}
        try:
            for name, nc in conns.items():
                made = await api(
                    nc,
                    "STREAM.CREATE.M",
                    {"name": "M", "mirror": {"name": ORIGIN, "external": {"api": "$JS.core.API"}}},
                )
                assert "error" not in made, made
                seconds = await caught_up(nc, "M", messages)
                out[name] = {"history_s": round(seconds, 2), "history_msgs_per_s": round(messages / seconds)}
            t0 = time.perf_counter()
            await publish(core, live)
            for name, nc in conns.items():
                await caught_up(nc, "M", messages + live)
                out[name]["live_done_s"] = round(time.perf_counter() - t0, 2)
        finally:
            for nc in conns.values():
                await nc.close()
    js, jl = out["jetstream"], out["jetlake"]
    out["ratio_history_rate"] = round(jl["history_msgs_per_s"] / js["history_msgs_per_s"], 3)
    return out


def run(work: Path, messages: int, live: int) -> Result:
    with linked_core(work) as (reference, lake, core):
        return asyncio.run(
            measure(core.url, {"jetstream": reference.url, "jetlake": lake.url}, messages, live)
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--live", type=int, default=10_000)
    ap.add_argument("--keep", default="", help="work in this directory and keep it (the servers' logs)")
    args = ap.parse_args()
    if args.keep:
        print(json.dumps(run(Path(args.keep), args.messages, args.live)), flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="bench-mirror-") as tmp:
        print(json.dumps(run(Path(tmp), args.messages, args.live)), flush=True)


if __name__ == "__main__":
    main()
