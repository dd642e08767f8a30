"""What the writer's Delta checkpoints cost sync publishers (#22): PubAck latency of ``messages``
sync publishes (one in flight, so one message per commit, ``sync_interval`` ``always``), which pass
a checkpoint every 100 commits. Before #22 every commit waited while a checkpoint was written and
synced; after, the checkpoint is written and synced beside the log and no commit waits for it.
Reported: PubAck p50, p99, p99.9 and max over the run (a stall at each checkpoint shows at p99: one
publish in 100 meets one).

    python -m bench.storage.checkpoint_stall [--messages 3000] [--keep DIR]
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
import numpy as np

from tests.harness import Jetlake

STREAM, SUBJECT = "CKPT", "ckpt.x"


async def _latencies(url: str, count: int) -> list[float]:
    """Seconds from each sync publish to its PubAck, one at a time."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=STREAM, subjects=["ckpt.>"])
        out = []
        for i in range(count):
            t0 = time.perf_counter()
            await js.publish(SUBJECT, b'{"n": %d}' % i, timeout=60)
            out.append(time.perf_counter() - t0)
        return out
    finally:
        await nc.close()


def _ms(values: list[float], q: float) -> float:
    return round(float(np.quantile(np.array(values), q)) * 1000, 2)


def measure(workdir: Path, count: int) -> dict[str, Any]:
    lake = Jetlake(workdir)
    lake.start()
    try:
        lat = asyncio.run(_latencies(lake.url, count))
        log_dir = lake.data_root / "messages" / "_delta_log"
        checkpoints = len(list(log_dir.glob("*.checkpoint.parquet")))
    finally:
        lake.stop()
    return {
        "workload": "checkpoint_stall",
        "messages": count,
        "checkpoints_left_in_log": checkpoints,
        "puback_p50_ms": _ms(lat, 0.5),
        "puback_p99_ms": _ms(lat, 0.99),
        "puback_p999_ms": _ms(lat, 0.999),
        "puback_max_ms": round(max(lat) * 1000, 2),
        "publish_per_s": round(count / sum(lat)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--keep", default="", help="work in this directory and keep it (the gateway's log)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="jetlake-ckpt-") as tmp:
        print(json.dumps(measure(Path(args.keep or tmp), args.messages)), flush=True)


if __name__ == "__main__":
    main()
