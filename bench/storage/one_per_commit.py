"""A stream written one message per commit, produced at the storage layer (#22): the gateway's own
commit primitive (:class:`~storage_delta.commit.writer.MessageTable`, the files and log entries a
sync publisher's commits make, a checkpoint every 100 commits, the log's trim) driven directly, one
message per Delta version, under an owner epoch of the store's lease, while the gateway's continuous
compaction (:class:`~storage_delta.maintenance.recent.Compaction` with the default
``compact_min_files``, ``compact_max_file_bytes`` and ``compact_interval_ms``) runs beside it on a
thread, as the gateway runs it on its executor.

Why not through the gateway: a sync publisher there makes 16–92 commits a second on this shared
machine, so a million would take 3 to 17 hours. What is left out is what a commit costs around the
store (the NATS round trip, the PubAck), not what it leaves in the store; the commits are not synced
one by one (as with ``sync_interval`` "30s"), and the whole tree is synced at the end.

The writer waits, every ``BACKPRESSURE_EVERY`` commits, while the compaction's last round left a
backlog: unchecked, at 190 commits a second on this machine at load 20–30 (twice a sync publisher's
rate through the gateway here) the compaction fell behind and never caught up, 176,102 live files
after 317,000 commits, a store no gateway publishing at its own pace leaves (the compaction kept
up with the gateway's sync publisher, ``small_files``'s ``files_during_publish``).

The stream is created through a gateway first (its catalog entry, exactly as ``js.add_stream``
makes it), then the gateway is stopped and the messages are written. The first start of a gateway
on the result recovers the stream from the files alone (no index snapshot covers them);
``python -m bench.storage.recovery --bulk 0 --tail N --keep DIR`` then measures restarts with a
tail published through the gateway, ``python -m bench.storage.small_files --kept DIR`` the cold reads.

    python -m bench.storage.one_per_commit --messages 1000000 --keep DIR [--per-commit 1] [--resume]

``--per-commit 256`` writes the same messages in the commits a pipelined publisher's 256 PubAcks
in flight make: what ``small_files --kept DIR --large-kept DIR2`` compares the cold reads with.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
from pathlib import Path

import nats

from bench.storage.small_files import STREAM, SUBJECT, _publish
from gateway.runtime.settings import Settings
from storage_delta.commit.lease import open_lease
from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import MessageTable, StoredMessage
from storage_delta.format.schema import DEFAULT_BLOCK_SIZE
from storage_delta.maintenance.files import live_files
from storage_delta.maintenance.recent import Compaction
from storage_delta.tables.catalog import CatalogTable
from tests.harness import Jetlake

PAYLOAD = b'{"order": %d, "customer": "c-%d", "amount": 12.5}'
#: Commits between two looks at the compaction: the writer waits while a round left a backlog.
BACKPRESSURE_EVERY = 100


def _compact(
    root: StoreRoot,
    created: dict[str, int],
    settings: Settings,
    done: threading.Event,
    caught_up: threading.Event,
) -> int:
    """The gateway's compaction task, on a thread: a round, and after a round that left no backlog
    the interval; returns the files merged. ``caught_up`` is clear while a round leaves a backlog."""
    compaction, merged = Compaction(root), 0
    while not done.is_set():
        removed, more = compaction.round(created, settings.compact_min_files, settings.compact_max_file_bytes)
        merged += removed
        if more:
            caught_up.clear()
        else:
            caught_up.set()
            done.wait(settings.compact_interval_ms / 1000)
    caught_up.set()
    return merged


async def _last_seq(url: str) -> int:
    nc = await nats.connect(url)
    try:
        return int((await nc.jetstream().stream_info(STREAM)).state.last_seq)
    finally:
        await nc.close()


def produce(workdir: Path, count: int, per_commit: int = 1, resume: bool = False) -> dict[str, object]:
    """Messages up to sequence ``count``; with ``resume`` after the last one a gateway on the kept
    store reports (a store grown in several sittings), else into a stream created first."""
    lake = Jetlake(workdir)
    lake.start()
    try:
        if resume:
            after = asyncio.run(_last_seq(lake.url))
        else:
            asyncio.run(_publish(lake.url, 0, 1))  # the stream, created as a client creates it
            after = 0
    finally:
        lake.stop()
    path = str(lake.data_root)
    [entry] = [e for e in CatalogTable(StoreRoot(path)).load() if e.kind == "stream" and e.stream == STREAM]
    created = int(entry.body["created"])
    lease = open_lease(StoreRoot(path))
    epoch = lease.current() + 1
    assert lease.claim(epoch), "another writer holds the store"
    root = StoreRoot(path, fsync=False, epoch=epoch)
    settings = Settings()
    table = MessageTable(root)
    version = table.last_txn_version()
    done, caught_up = threading.Event(), threading.Event()
    caught_up.set()
    merged: list[int] = []
    compactor = threading.Thread(
        target=lambda: merged.append(_compact(root, {STREAM: created}, settings, done, caught_up))
    )
    compactor.start()
    t0 = last_ts = time.time_ns()
    waits = 0
    started = time.monotonic()
    try:
        for first in range(after + 1, count + 1, per_commit):
            batch = []
            for seq in range(first, min(first + per_commit, count + 1)):
                last_ts = max(time.time_ns(), last_ts + 1)
                payload = PAYLOAD % (seq, seq % 97)
                batch.append(StoredMessage(STREAM, DEFAULT_BLOCK_SIZE, seq, last_ts, SUBJECT, None, payload))
            version += 1
            table.commit(batch, version)
            if version % BACKPRESSURE_EVERY == 0:
                waits += not caught_up.is_set()
                caught_up.wait()
            if (first - 1) // 50_000 != batch[-1].seq // 50_000:
                lease.beat(epoch)
                written = batch[-1].seq
                per_s = round((written - after) / (time.monotonic() - started))
                print(json.dumps({"written": written, "per_s": per_s}), flush=True)
    finally:
        done.set()
        compactor.join()
        table.close()
        lease.beat(epoch, released=True)
    seconds = time.monotonic() - started
    os.sync()
    return {
        "workload": "one_per_commit",
        "messages": count,
        "resumed_after": after,
        "per_commit": per_commit,
        "commits": -(-(count - after) // per_commit),
        "seconds": round(seconds),
        "per_s": round((count - after) / seconds),
        "first_ts": t0,
        "files_merged": merged[0] if merged else 0,
        "waits_for_compaction": waits,
        "files_at_end": len(live_files(StoreRoot(path), STREAM)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument(
        "--per-commit", type=int, default=1, help="messages per commit (256: a pipelined publisher's)"
    )
    ap.add_argument("--keep", required=True, help="the store's work directory, kept for the other benches")
    ap.add_argument(
        "--resume", action="store_true", help="go on after the last message of a store --keep already holds"
    )
    args = ap.parse_args()
    print(json.dumps(produce(Path(args.keep), args.messages, args.per_commit, args.resume)), flush=True)


if __name__ == "__main__":
    main()
