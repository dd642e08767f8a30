"""Restart time of a gateway whose consumer has 1M acks in its ack log, before and after compaction.

The stream (1M messages) and the consumer's history (a delivery and an ack row per message, in
group commits of ``--rows-per-commit`` rows, checkpointed as the gateway does) are written straight
into the tables, as a long-lived gateway would have left them; the consumer itself is created
through the API. Each restart is timed from starting the gateway process until ``CONSUMER.INFO``
answers with the full ack floor; the ack log's own part (load + replay) is timed in-process too.

    python -m bench.storage.acklog_restart [--acks 1000000] [--rows-per-commit 10000]

Prints one JSON line.
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

from bench.stored import write_messages
from storage_delta.commit.store import StoreRoot
from storage_delta.read.consumer_log import reduce
from storage_delta.tables import acklog as al
from storage_delta.tables.catalog import CatalogTable
from tests.harness import Jetlake

STREAM, CONSUMER = "HISTORY", "LONGLIVED"


async def api(url: str, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    nc = await nats.connect(url)
    try:
        msg = await nc.request(f"$JS.API.{subject}", json.dumps(body or {}).encode(), timeout=60)
        answer: dict[str, Any] = json.loads(msg.data)
        return answer
    finally:
        await nc.close()


def write_history(root: StoreRoot, acks: int, rows_per_commit: int) -> int:
    """1M messages, then a deliver and an ack row for each; returns the ack log rows written."""
    # After the stream's creation (the caller created it through the API): recovery leaves out rows
    # stored before it, as belonging to an earlier stream of the same name.
    now = time.time_ns()
    write_messages(root, STREAM, "history.x", acks, now)
    table = al.AckLogTable(root)
    lsn, rows, version = table.load().max_lsn, [], table.last_txn_version()
    for seq in range(1, acks + 1):
        ts = now + acks + 2 * seq
        for kind, floor in ((al.DELIVER, seq - 1), (al.ACK, seq)):
            lsn += 1
            rows.append(
                al.AckRecord(
                    STREAM,
                    CONSUMER,
                    kind,
                    seq=seq,
                    cseq=seq if kind == al.DELIVER else 0,
                    deliveries=1 if kind == al.DELIVER else 0,
                    ts=ts + (kind == al.ACK),
                    delivered_seq=seq,
                    delivered_cseq=seq,
                    floor_seq=floor,
                    floor_cseq=floor,
                    lsn=lsn,
                )
            )
        if len(rows) >= rows_per_commit or seq == acks:
            version += 1
            table.append(rows, version)
            rows = []
    return 2 * acks


def timed_start(lake: Jetlake, acks: int) -> tuple[float, dict[str, Any]]:
    """Seconds from starting the gateway to a consumer info with the whole ack floor."""
    t0 = time.monotonic()
    lake.start_gateway(ready_s=3600)
    info = asyncio.run(api(lake.url, f"CONSUMER.INFO.{STREAM}.{CONSUMER}"))
    elapsed = time.monotonic() - t0
    assert info["ack_floor"]["stream_seq"] == acks, info
    state = asyncio.run(api(lake.url, f"STREAM.INFO.{STREAM}"))["state"]
    assert state["messages"] == acks, state  # the restart recovered the stream's messages too
    return elapsed, info


def replay_s(root: StoreRoot) -> tuple[float, int]:
    """The ack log's part of a restart: load the table and replay the consumer's rows."""
    t0 = time.monotonic()
    log = al.AckLogTable(root).load()
    created = next(e for e in CatalogTable(root).load() if e.name == CONSUMER).body["created"]
    reduce(log.consumers[(STREAM, CONSUMER)], int(created))
    return time.monotonic() - t0, log.rows


def measure(acks: int, rows_per_commit: int) -> dict[str, Any]:
    """The whole measurement in a jetlake of its own (JetStream has no ack log to compare with)."""
    with tempfile.TemporaryDirectory(prefix="jetlake-acklog-bench-") as tmp:
        lake = Jetlake(Path(tmp))
        lake.start()
        try:
            asyncio.run(api(lake.url, f"STREAM.CREATE.{STREAM}", {"name": STREAM, "subjects": ["history.>"]}))
            cfg = {"durable_name": CONSUMER, "ack_policy": "explicit"}
            asyncio.run(
                api(lake.url, f"CONSUMER.CREATE.{STREAM}.{CONSUMER}", {"stream_name": STREAM, "config": cfg})
            )
            assert lake.stop_gateway() == 0
            root = StoreRoot(str(lake.data_root))
            t0 = time.monotonic()
            write_history(root, acks, rows_per_commit)
            setup_s = time.monotonic() - t0

            before_s, before = timed_start(lake, acks)
            assert lake.stop_gateway() == 0
            before_replay_s, rows_before = replay_s(root)
            t0 = time.monotonic()
            compaction = al.compact_store(root)
            compact_s = time.monotonic() - t0
            after_replay_s, rows_after = replay_s(root)
            after_s, after = timed_start(lake, acks)
            same = {k: v for k, v in before.items() if k != "ts"} == {
                k: v for k, v in after.items() if k != "ts"
            }
        finally:
            lake.stop()
    return {
        "workload": "acklog_restart",
        "acks": acks,
        "rows_per_commit": rows_per_commit,
        "setup_s": round(setup_s, 1),
        "restart_before_compaction_s": round(before_s, 2),
        "acklog_replay_before_s": round(before_replay_s, 2),
        "acklog_rows_before": rows_before,
        "compaction_s": round(compact_s, 2),
        "acklog_rows_after": rows_after,
        "restart_after_compaction_s": round(after_s, 2),
        "acklog_replay_after_s": round(after_replay_s, 3),
        "consumer_info_unchanged": same,
        "compaction_version": compaction.version,
        "ratio": round(after_s / before_s, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--acks", type=int, default=1_000_000)
    ap.add_argument("--rows-per-commit", type=int, default=10_000)
    args = ap.parse_args()
    print(json.dumps(measure(args.acks, args.rows_per_commit)), flush=True)


if __name__ == "__main__":
    main()
