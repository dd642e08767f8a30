"""What the damage check costs a restart (#16): ``MessageReader.verify`` (the CRC-32 of every file
below a stream's index snapshot, which recovery does not otherwise read) beside ``stored_index`` (the
full scan a restart without a snapshot makes, every file read through the same checks).

A stream of ``--messages`` messages in ``--files`` commit files (as the gateway writes them before
sealing) is written in-process to a temporary store; each figure is the best of ``--rounds`` with a
fresh reader (files in the page cache: the CPU of the check, not the disk). Prints one JSON line.

    python -m bench.storage.integrity_cost --messages 1000000 --files 4000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from storage_delta.commit.append import TableAppender
from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import MESSAGES_TABLE
from storage_delta.read.reader import MessageReader


def _payload(seq: int) -> bytes:
    """A JSON order that differs from its neighbours, as the bytes workloads' messages do."""
    return json.dumps(
        {"id": seq, "customer": f"c-{seq * 7919 % 100_003}", "qty": seq % 17, "sku": f"s{seq % 977}"}
    ).encode()


def _fill(root: StoreRoot, messages: int, files: int) -> None:
    appender = TableAppender(root, MESSAGES_TABLE, "bench-integrity", checkpoint_every=10**9)
    per, seq = messages // files, 1
    for version in range(1, files + 1):
        rows = pa.table(
            {
                "seq": pa.array(range(seq, seq + per), pa.int64()),
                "ts": pa.array([time.time_ns()] * per, pa.int64()),
                "subject": ["orders.new"] * per,
                "hdrs": pa.array([None] * per, pa.binary()),
                "data": [_payload(s) for s in range(seq, seq + per)],
            }
        )
        appender.append([({"stream": "S", "block": str(seq // 100_000)}, rows)], version)
        seq += per


def _best(rounds: int, root: StoreRoot, what: str) -> float:
    best = float("inf")
    for _ in range(rounds):
        reader = MessageReader(root)
        reader.stream_files("S")  # the file list: read at start in either case
        t0 = time.perf_counter()
        if what == "verify":
            assert reader.verify("S") == []
        else:
            reader.stored_index("S")
        best = min(best, time.perf_counter() - t0)
    return round(best, 3)


def run(messages: int, files: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = StoreRoot(tmp, fsync=False)
        _fill(root, messages, files)
        size = sum(p.stat().st_size for p in Path(tmp, "messages").rglob("*.parquet"))
        return {
            "workload": "integrity_cost",
            "messages": messages,
            "files": files,
            "mib": round(size / 2**20, 1),
            "verify_s": _best(rounds, root, "verify"),
            "full_scan_s": _best(rounds, root, "scan"),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(json.dumps(run(args.messages, args.files, args.rounds)))


if __name__ == "__main__":
    main()
