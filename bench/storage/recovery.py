"""Recovery bounded (#22): the time from starting the gateway after ``kill -9`` until STREAM.INFO
answers with every message, for one stream written ``bulk`` messages in large commits (256
PubAcks in flight) and then ``tail`` messages one per commit (sync publishing, each PubAck
awaited). ``--bulk 0 --tail 50000`` is a stream written one message per commit throughout;
``--bulk 995000 --tail 5000`` a million messages with a small-file tail (one-per-commit at a million
takes the better part of an hour to publish here; ``--keep DIR`` of an earlier run and ``--bulk 0 --tail 0``
measures that store's stream again). The first ``kill -9`` comes right after the last
PubAck, while the compaction and the index snapshots may be behind; each figure is the median of
``trials`` kills.

With ``--standby`` the same stream is written through an owner gateway while a standby gateway on
the same store waits (#19's owner lease), and the figure is a takeover: from ``kill -9`` of the
owner to the standby answering STREAM.INFO with every message; then a new standby is started and
waits, and its owner is killed in turn, ``trials`` times.

    python -m bench.storage.recovery [--bulk 0] [--tail 50000] [--trials 3] [--standby] [--keep DIR]
        [--against OTHER_CHECKOUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.storage.small_files import STREAM, _publish
from bench.targets import stream_state, wait_stream_messages
from storage_delta.commit.store import StoreRoot
from storage_delta.maintenance.files import live_files
from tests.harness import ROOT, Jetlake, Peer, stop, wait_log


def _restart(lake: Jetlake, count: int, tree: Path) -> float:
    """``kill -9``, then seconds from starting the gateway of the checkout ``tree`` until the stream
    answers with every message."""
    lake.kill_gateway()
    lake.gateway_cwd = tree
    lake.gateway_env = {"PYTHONPATH": str(tree)}
    t0 = time.monotonic()
    lake.start_gateway(ready_s=3600)
    asyncio.run(wait_stream_messages(lake.url, STREAM, count))
    return time.monotonic() - t0


def measure(workdir: Path, bulk: int, tail: int, trials: int, against: Path | None = None) -> dict[str, Any]:
    """With ``against`` (another checkout, e.g. ``git worktree add DIR <commit>``), each trial
    restarts this checkout's gateway and then that one's on the same store, interleaved, so that
    both meet the same load."""
    lake = Jetlake(workdir)
    lake.start()
    try:
        t0 = time.monotonic()
        if bulk:
            asyncio.run(_publish(lake.url, bulk, 256))
        bulk_s = time.monotonic() - t0
        # the tail's sequences follow the bulk's: _publish numbers payloads, not sequences
        tail_s = asyncio.run(_publish(lake.url, tail, 1)) if tail else 0.0
        count = asyncio.run(stream_state(lake.url, STREAM))["messages"]  # and a kept store's before
        files = len(live_files(StoreRoot(str(lake.data_root)), STREAM))
        restarts, others = [], []
        for _ in range(trials):
            restarts.append(_restart(lake, count, ROOT))
            if against is not None:
                others.append(_restart(lake, count, against))
        compared = {}
        if against is not None:
            compared = {
                "against": str(against),
                "against_restart_after_kill9_s": [round(r, 2) for r in others],
                "against_restart_median_s": round(statistics.median(others), 2),
                "restart_vs_against": round(statistics.median(restarts) / statistics.median(others), 3),
            }
        return {
            "workload": "recovery",
            "bulk": bulk,
            "tail": tail,
            "messages": count,
            "trials": trials,
            "bulk_publish_s": round(bulk_s, 1),
            "tail_publish_per_s": round(tail / tail_s) if tail else None,
            "files_at_kill": files,
            "restart_after_kill9_s": [round(r, 2) for r in restarts],
            "restart_median_s": round(statistics.median(restarts), 2),
            **compared,
        }
    finally:
        lake.stop()


def measure_takeover(workdir: Path, bulk: int, tail: int, trials: int) -> dict[str, Any]:
    lake = Jetlake(workdir)
    lake.start()
    # the owner's epoch: 1 in a new store, the next one in a kept store
    first = int(re.findall(r"owner of the store as epoch (\d+)", (workdir / "gateway.log").read_text())[-1])
    peers = [Peer(lake, f"gateway-{first}")]
    try:
        wait_log(peers[0].log, f"standing by: epoch {first} holds the store", timeout=300)
        if bulk:
            asyncio.run(_publish(lake.url, bulk, 256))
        tail_s = asyncio.run(_publish(lake.url, tail, 1)) if tail else 0.0
        # bulk + tail, and what a kept store (--keep of an earlier run) held before
        count = asyncio.run(stream_state(lake.url, STREAM))["messages"]
        files = len(live_files(StoreRoot(str(lake.data_root)), STREAM))
        owner, takeovers = lake.gateway, []
        for epoch in range(first + 1, first + trials + 1):
            assert owner is not None
            stop(owner, signal.SIGKILL)
            t0 = time.monotonic()
            asyncio.run(wait_stream_messages(lake.url, STREAM, count))
            takeovers.append(time.monotonic() - t0)
            owner = next(p for p in peers if f"owner of the store as epoch {epoch}" in p.text()).proc
            peers.append(Peer(lake, f"gateway-{epoch}"))
            wait_log(peers[-1].log, f"standing by: epoch {epoch} holds the store", timeout=300)
        return {
            "workload": "recovery_takeover",
            "bulk": bulk,
            "tail": tail,
            "messages": count,
            "trials": trials,
            "tail_publish_per_s": round(tail / tail_s) if tail else None,
            "files_at_kill": files,
            "takeover_after_kill9_s": [round(t, 2) for t in takeovers],
            "takeover_median_s": round(statistics.median(takeovers), 2),
        }
    finally:
        for peer in peers:
            stop(peer.proc)
        lake.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bulk", type=int, default=0)
    ap.add_argument("--tail", type=int, default=50_000)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--standby", action="store_true", help="a standby's takeover, not a restart")
    ap.add_argument("--keep", default="", help="work in this directory and keep it (the gateway's log)")
    ap.add_argument(
        "--against", default="", help="another checkout whose gateway restarts interleaved with this one's"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="jetlake-recovery-") as tmp:
        work = Path(args.keep or tmp)
        if args.standby:
            out = measure_takeover(work, args.bulk, args.tail, args.trials)
        else:
            against = Path(args.against) if args.against else None
            out = measure(work, args.bulk, args.tail, args.trials, against)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
