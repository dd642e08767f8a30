"""``make bench``: every workload against the real ``nats-server -js`` and jetlake in the same run.

Prints one JSON line per workload (both figures and the ratio) and appends them to bench/RESULTS.md
with the date and the machine. ``--quick`` runs small sizes for a smoke test.

    python -m bench.run [--quick] [--scale 0.2] [--only sync_publish,core_publish,...] [--no-record]
        [--consume N] [--catch-up N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from bench import consumers, freshness, spark_read
from bench import workloads as wl
from bench.storage import acklog_restart, compaction, small_files, sync_cost
from bench.targets import BENCH_DIR, start_targets
from storage_delta.commit.store import StoreRoot

RESULTS = BENCH_DIR / "RESULTS.md"


@dataclass(frozen=True)
class Sizes:
    sync: int
    pipelined: int
    window: int
    core: int
    bytes_msgs: int
    commit_versions: tuple[int, int]
    commit_sample: int
    consume: int
    consume_window: int
    catch_up: int
    acks: int
    small_files: int


FULL = Sizes(
    sync=2_000,
    pipelined=200_000,
    window=256,
    core=500_000,
    bytes_msgs=1_000_000,
    commit_versions=(100, 10_000),
    commit_sample=50,
    consume=100_000,
    consume_window=256,
    catch_up=1_000_000,
    acks=1_000_000,
    small_files=20_000,
)
QUICK = Sizes(
    sync=200,
    pipelined=10_000,
    window=128,
    core=20_000,
    bytes_msgs=20_000,
    commit_versions=(100, 300),
    commit_sample=30,
    consume=5_000,
    consume_window=128,
    catch_up=20_000,
    acks=20_000,
    small_files=1_000,
)


def scaled(sizes: Sizes, factor: float) -> Sizes:
    """The sizes with every message count multiplied by ``factor`` (windows and versions kept)."""
    if factor == 1.0:
        return sizes
    counts = ("sync", "pipelined", "core", "bytes_msgs", "consume", "catch_up", "acks", "small_files")
    return replace(sizes, **{k: max(1, round(getattr(sizes, k) * factor)) for k in counts})


def machine() -> str:
    mem_kb = next(
        int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if "MemTotal" in line
    )
    gib = mem_kb / 1024 / 1024
    return f"{platform.node()}, {os.cpu_count()} cpus (nproc), {gib:.1f} GiB, {platform.platform()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke test, not a measurement")
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="py-spy on the gateway, Go pprof on each nats-server, during the publish and consume workloads",
    )
    ap.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply the message counts (not windows or versions), e.g. 0.2 for a moderate run",
    )
    ap.add_argument("--consume", type=int, default=0, help="messages for pull_consume and push_consume")
    ap.add_argument("--catch-up", type=int, default=0, help="messages for catch_up")
    ap.add_argument(
        "--bytes-messages", type=int, default=0, help="messages for bytes_json and bytes_random128"
    )
    args = ap.parse_args()
    sizes = scaled(QUICK if args.quick else FULL, args.scale)
    sizes = replace(
        sizes,
        consume=args.consume or sizes.consume,
        catch_up=args.catch_up or sizes.catch_up,
        bytes_msgs=args.bytes_messages or sizes.bytes_msgs,
    )
    only = {w for w in args.only.split(",") if w}

    with tempfile.TemporaryDirectory(prefix="jetlake-bench-") as tmp:
        ref, lake, targets = start_targets(Path(tmp), pprof=args.profile)
        lake_root = StoreRoot(str(lake.data_root))
        profile = Path(tmp) / "profiles" if args.profile else None
        if profile is not None:
            profile.mkdir()
        runs: dict[str, Callable[[], dict[str, object]]] = {
            "sync_publish": lambda: wl.sync_publish(targets, sizes.sync),
            "pipelined_publish": lambda: wl.pipelined_publish(
                targets, sizes.pipelined, sizes.window, profile
            ),
            "core_publish": lambda: wl.core_publish(targets, sizes.core, profile),
            "bytes_json": lambda: wl.bytes_per_message(targets, sizes.bytes_msgs, "json", lake_root),
            "bytes_random128": lambda: wl.bytes_per_message(
                targets, sizes.bytes_msgs, "random128", lake_root
            ),
            "commit_latency": lambda: wl.commit_latency(list(sizes.commit_versions), sizes.commit_sample),
            "pull_consume": lambda: consumers.consume(
                targets, "pull", sizes.consume, sizes.consume_window, profile
            ),
            "push_consume": lambda: consumers.consume(
                targets, "push", sizes.consume, sizes.consume_window, profile
            ),
            "pull_consume_py": lambda: consumers.consume(
                targets, "pull", sizes.consume, sizes.consume_window, profile, client="py"
            ),
            "push_consume_py": lambda: consumers.consume(
                targets, "push", sizes.consume, sizes.consume_window, profile, client="py"
            ),
            "catch_up": lambda: consumers.catch_up(targets, lake, sizes.catch_up, sizes.consume_window),
            "acklog_restart": lambda: acklog_restart.measure(sizes.acks, 10_000),
            "spark_vs_drain": lambda: spark_read.spark_vs_drain(targets, lake, sizes.catch_up, 1000),
            "compaction": lambda: compaction.compaction_throughput(targets, lake, sizes.catch_up, Path(tmp)),
            "sync_cost": lambda: sync_cost.sync_cost(
                targets, Path(tmp), sizes.sync, sizes.pipelined, sizes.window
            ),
            "small_files": lambda: small_files.measure(ref, Path(tmp) / "small_files", sizes.small_files),
            "freshness": lambda: freshness.freshness(
                targets, str(lake.data_root), Path(tmp), 20.0, 5.0 if args.quick else 20.0
            ),
        }
        results = []
        try:
            for name, run in runs.items():
                if only and name not in only:
                    continue
                t0 = time.monotonic()
                res = run()
                res["wall_s"] = round(time.monotonic() - t0, 1)
                print(json.dumps(res), flush=True)
                results.append(res)
        finally:
            lake.stop()
            ref.stop()
    if not args.no_record:
        mode = "quick" if args.quick else "full sizes"
        mode += f" x{args.scale:g}" if args.scale != 1.0 else ""
        mode += f"; only {', '.join(sorted(only))}" if only else ""
        mode += f"; --consume {args.consume}" if args.consume else ""
        mode += f"; --catch-up {args.catch_up}" if args.catch_up else ""
        mode += f"; --bytes-messages {args.bytes_messages}" if args.bytes_messages else ""
        mode += "; --profile: py-spy on the gateway" if args.profile else ""
        record(results, mode)


def record(results: list[dict[str, object]], mode: str) -> None:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"\n## {stamp} ({mode})\n", f"Machine: {machine()}\n", "```"]
    lines += [json.dumps(r) for r in results]
    lines.append("```\n")
    if not RESULTS.exists():
        RESULTS.write_text("# Benchmark results\n\nAppended by `make bench` (bench/run.py); newest last.\n")
    with RESULTS.open("a") as fh:
        fh.write("\n".join(lines))


if __name__ == "__main__":
    main()
