"""A writer process for tests/test_stream_fence.py: holds streams ``S`` and ``T`` of a store root
under a per-stream epoch each and commits one message of each per round, printing what each
commit acknowledged, until ``rounds`` rounds are done. A test pauses it (SIGSTOP) while another
writer takes ``S`` over, then lets it go on: its ``S`` rows must be refused, its ``T`` rows not.

Run as ``python -m tests.stream_writer_proc <root> <epoch> <rounds>`` (an object store's storage
options as JSON in ``JETLAKE_TEST_STORAGE_OPTIONS``); prints ``ready``, then per round
``acked <stream> <seq>`` for each row committed and ``fenced <stream>`` when a stream was left
out, then ``done``.
"""

from __future__ import annotations

import json
import os
import sys

from storage_delta.commit.owner import StreamEpochs
from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import MessageTable, StoredMessage

STREAMS = ("S", "T")
BLOCK = 1 << 20


def message(stream: str, seq: int, writer: str) -> StoredMessage:
    return StoredMessage(stream, BLOCK, seq, seq, f"{stream.lower()}.x", None, f"{writer}{seq}".encode())


def main(root: str, epoch: int, rounds: int) -> None:
    held = StreamEpochs()
    options = json.loads(os.environ.get("JETLAKE_TEST_STORAGE_OPTIONS", "null"))
    table = MessageTable(StoreRoot(root, options), streams=held)
    for stream in STREAMS:
        held.hold(stream, epoch)
        table.fence_stream(stream)
    print("ready", flush=True)
    writing = set(STREAMS)
    version = table.last_txn_version()
    for seq in range(1, rounds + 1):
        version += 1
        batch = [message(s, seq, "a") for s in STREAMS if s in writing]
        fenced = table.commit(batch, version)
        for stream in sorted(fenced):
            print(f"fenced {stream}", flush=True)
            writing.discard(stream)
            held.drop(stream)
        for m in batch:
            if m.stream not in fenced:
                print(f"acked {m.stream} {m.seq}", flush=True)
    table.close()  # waits for a checkpoint in progress
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
