"""What a streaming query's planner pays to list a stream's files after each new commit (#18): the
``messages`` table brought forward by delta-rs (``catch_up``, then its add actions: the path every
micro-batch took before, and still takes on an object store) against the follower that reads only
the new commit files (``StoreFollower`` on a local root). A table of ``--files`` one-message commits
(checkpointed every 100 commits, as the gateway's writer does), then one commit at a time, each
followed by both listings in turns (which goes first alternates). Reported: p50 and p95 of each, in
ms, and their ratio. jetlake only: JetStream has no table to list.

    python -m bench.storage.follow_cost [--files 2000] [--trials 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from storage_delta.commit.store import StoreRoot, catch_up, open_existing
from storage_delta.commit.writer import MessageTable, StoredMessage
from storage_delta.format import schema as sch
from storage_delta.maintenance.files import LiveFile, live_files_of
from storage_delta.read.follower import StoreFollower

STREAM = "FOLLOW"


def _message(seq: int) -> StoredMessage:
    return StoredMessage(STREAM, 1 << 30, seq, time.time_ns(), "follow.x", None, b'{"n": %d}' % seq)


def _timed(listing: Callable[[], list[LiveFile]]) -> tuple[float, int]:
    t0 = time.perf_counter()
    files = listing()
    return (time.perf_counter() - t0) * 1000, max(f.max_seq or 0 for f in files)


def measure(work: Path, files: int, trials: int) -> dict[str, Any]:
    root = StoreRoot(str(work / "root"))
    table = MessageTable(root)
    try:
        for seq in range(1, files + 1):
            table.commit([_message(seq)], seq)
        dt = open_existing(root, sch.MESSAGES)
        assert dt is not None
        follower = StoreFollower(root)

        def by_delta_rs() -> list[LiveFile]:
            catch_up(dt)
            return live_files_of(dt, STREAM)

        def by_follower() -> list[LiveFile]:
            return follower.files(STREAM)

        took: dict[str, list[float]] = {"delta_rs": [], "follower": []}
        ways = {"delta_rs": by_delta_rs, "follower": by_follower}
        for way in ways.values():
            way()  # warm: the first listing loads the table
        for trial in range(trials):
            seq = files + trial + 1
            table.commit([_message(seq)], seq)
            for name in sorted(ways, reverse=trial % 2 == 1):
                ms, newest = _timed(ways[name])
                assert newest == seq, (name, newest, seq)  # both see the commit just made
                took[name].append(ms)
    finally:
        table.close()

    def stats(xs: list[float]) -> dict[str, float]:
        p95 = sorted(xs)[int(0.95 * len(xs))]
        return {"p50_ms": round(statistics.median(xs), 2), "p95_ms": round(p95, 2)}

    out: dict[str, Any] = {"workload": "follow_cost", "files": files, "trials": trials}
    out.update({name: stats(xs) for name, xs in took.items()})
    out["ratio_p50"] = round(out["follower"]["p50_ms"] / out["delta_rs"]["p50_ms"], 3)
    out["load"] = round(os.getloadavg()[0], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=2000, help="one-message commits before the trials")
    ap.add_argument("--trials", type=int, default=200, help="commits, each followed by both listings")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-follow-") as tmp:
        print(json.dumps(measure(Path(tmp), args.files, args.trials)), flush=True)


if __name__ == "__main__":
    main()
