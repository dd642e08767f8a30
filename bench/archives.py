"""``archives`` (#21): a stream of ``messages`` messages of ``size`` random bytes snapshotted over the
server's chunked protocol (128 KiB chunks, each acked), deleted, and restored from its archive
(128 KiB chunks, the closing answer awaited), on the real JetStream and on jetlake in one run:
seconds per phase, the archive's size, and jetlake's time over JetStream's.

    python -m bench.archives [--messages 100000] [--size 128]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import nats

from tests.archive_protocol import restore, snapshot
from tests.differential import api
from tests.harness import Jetlake, ReferenceJetStream, serving

Result = dict[str, Any]
CHUNK = 128 * 1024
WINDOW = 256  # publishes in flight while the stream is filled


async def phases(url: str, messages: int, size: int) -> dict[str, Any]:
    """Fill the stream, then time its snapshot and its restore."""
    out: dict[str, Any] = {}
    async with await nats.connect(url) as nc:
        await api(nc, "STREAM.CREATE.ARCH", {"name": "ARCH", "subjects": ["arch.>"]})
        js = nc.jetstream()
        for i in range(0, messages, WINDOW):
            batch = range(i, min(i + WINDOW, messages))
            await asyncio.gather(*(js.publish(f"arch.{n % 16}", os.urandom(size)) for n in batch))
        t0 = time.perf_counter()
        taken = await snapshot(nc, "ARCH", {"chunk_size": CHUNK}, wait_s=600)
        out["snapshot_s"] = round(time.perf_counter() - t0, 2)
        out["archive_mb"] = round(len(taken.archive) / 1e6, 1)
        assert taken.closing == {"Status": "204"}, taken.closing
        await api(nc, "STREAM.DELETE.ARCH")
        t0 = time.perf_counter()
        done = await restore(nc, "ARCH", taken.answer["config"], taken.archive, chunk=CHUNK, wait_s=600)
        out["restore_s"] = round(time.perf_counter() - t0, 2)
        assert done.final is not None
        assert done.final["state"]["messages"] == messages, done.final
    return out


def run(work: Path, messages: int, size: int) -> Result:
    out: Result = {"workload": "archives", "messages": messages, "size": size}
    for name, target in (("jetstream", ReferenceJetStream(work / "js")), ("jetlake", Jetlake(work / "jl"))):
        for server in serving(target):
            out[name] = asyncio.run(phases(server.url, messages, size))
    for phase in ("snapshot_s", "restore_s"):
        out[f"ratio_{phase.removesuffix('_s')}"] = round(out["jetlake"][phase] / out["jetstream"][phase], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=128)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-archives-") as tmp:
        print(json.dumps(run(Path(tmp), args.messages, args.size)), flush=True)


if __name__ == "__main__":
    main()
