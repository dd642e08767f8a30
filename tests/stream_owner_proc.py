"""A gateway's owner of streams S and T in a process of its own (tests/test_stream_claims.py): it
claims both through :class:`~gateway.service.ownership.StreamClaims`, publishes one message of
each per round through the group-commit writer, whose loop drops a stream found fenced
(``on_stream_fenced``), and prints what happened: ``acked S 3``, ``refused S 4``, ``dropped S``,
then the streams it still holds and ``done``. Its publisher stops publishing a dropped stream, as
a gateway stops serving it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from gateway.service.ownership import StreamClaims
from storage_delta.commit.lease import open_lease
from storage_delta.commit.owner import StreamFenced
from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import GroupCommitWriter, MessageTable
from storage_delta.tables.acklog import AckLogTable
from tests.stream_writer_proc import STREAMS, message


async def main(path: str, rounds: int) -> None:
    root = StoreRoot(path, json.loads(os.environ.get("JETLAKE_TEST_STORAGE_OPTIONS", "null")))
    with ThreadPoolExecutor(4) as executor:
        claims = StreamClaims(open_lease(root), "a", root, executor)
        claims.dropped.connect(lambda streams: print(*(f"dropped {s}" for s in sorted(streams)), flush=True))
        table = MessageTable(root, streams=claims.held)
        acks = AckLogTable(root, streams=claims.held)
        assert set((await claims.claim(STREAMS, [table, acks], acks)).epochs) == set(STREAMS)
        front = GroupCommitWriter(table, executor, 1 << 20, lambda _rows: None)
        front.loop.on_stream_fenced = claims.drop
        await front.start()
        print("ready", flush=True)
        for seq in range(1, rounds + 1):
            serving = [s for s in STREAMS if claims.held.epoch(s) is not None]
            futures = {s: front.submit([message(s, seq, "a")]) for s in serving}
            for stream, fut in futures.items():
                try:
                    await fut
                    print(f"acked {stream} {seq}", flush=True)
                except StreamFenced:
                    print(f"refused {stream} {seq}", flush=True)
        await front.close()
        table.close()
        print("held", *sorted(claims.held.streams()), flush=True)
        print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
