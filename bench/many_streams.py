"""``many_streams`` (#23): ``streams`` streams created, one message published to each (each PubAck
awaited), then every stream deleted, on the real JetStream and on jetlake in one run; seconds per
phase and jetlake's time over JetStream's.

    python -m bench.many_streams [--streams 1000]
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

from tests.differential import api
from tests.harness import Jetlake, ReferenceJetStream, serving

Result = dict[str, Any]


async def phases(url: str, streams: int) -> dict[str, float]:
    """Seconds to create, publish once to, and delete ``streams`` streams."""
    out: dict[str, float] = {}
    async with await nats.connect(url) as nc:
        t0 = time.perf_counter()
        for i in range(streams):
            made = await api(nc, f"STREAM.CREATE.M{i}", {"name": f"M{i}", "subjects": [f"m{i}.>"]})
            assert "error" not in made, made
        out["create_s"] = round(time.perf_counter() - t0, 2)
        js = nc.jetstream()
        t0 = time.perf_counter()
        for i in range(streams):
            await js.publish(f"m{i}.x", b"x")
        out["publish_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        for i in range(streams):
            gone = await api(nc, f"STREAM.DELETE.M{i}")
            assert gone.get("success"), gone
        out["delete_s"] = round(time.perf_counter() - t0, 2)
    return out


def run(work: Path, streams: int) -> Result:
    out: Result = {"workload": "many_streams", "streams": streams}
    for name, target in (("jetstream", ReferenceJetStream(work / "js")), ("jetlake", Jetlake(work / "jl"))):
        for server in serving(target):
            out[name] = asyncio.run(phases(server.url, streams))
    for phase in ("create_s", "publish_s", "delete_s"):
        out[f"ratio_{phase.removesuffix('_s')}"] = round(out["jetlake"][phase] / out["jetstream"][phase], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-many-streams-") as tmp:
        print(json.dumps(run(Path(tmp), args.streams)), flush=True)


if __name__ == "__main__":
    main()
