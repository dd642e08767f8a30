"""The leaf link's hot path, Python against compiled (#23), in interleaved rounds: each round runs
the workloads once with ``JETLAKE_NO_EXTENSIONS=1`` (the Python implementation, as before the
extension) and once compiled, in alternating order, each a ``bench.run`` with both servers (so every
ratio is against the real JetStream of the same run). Prints the medians per workload and variant:
the ratio to JetStream, and the CPU µs per message of jetlake's gateway and hub and of JetStream.

    python -m bench.interleaved.hotpath --rounds 3 --consume 20000 --scale 0.2

``--micro`` times the hot path's functions alone instead, both implementations in one process
(µs per message, the best of 7 passes): parsing publishes and plain acks, framing a run of 256
deliveries and 256 PubAcks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Any

from bench.targets import BENCH_DIR
from gateway.engine.consumer import Delivered
from gateway.wire import _framing, framing
from storage_delta.commit.writer import StoredMessage

WORKLOADS = "pull_consume_py,push_consume_py,pipelined_publish,core_publish,sync_publish"
VARIANTS = {"python": {"JETLAKE_NO_EXTENSIONS": "1"}, "compiled": {}}


def one_run(variant: str, workloads: str, consume: int, scale: float) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k != "JETLAKE_NO_EXTENSIONS"}
    env.update(VARIANTS[variant])
    command = [sys.executable, "-m", "bench.run", "--only", workloads, "--no-record"]
    out = subprocess.run(
        [*command, "--consume", str(consume), "--scale", str(scale)],
        env=env,
        cwd=BENCH_DIR.parent,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def figures(res: dict[str, Any]) -> dict[str, float | None]:
    """Ratio to JetStream (PubAck p50 over JetStream's for sync_publish: lower is better) and CPU µs
    per message."""
    lake, ref = res["jetlake"], res["jetstream"]
    lake_cpu, ref_cpu = lake.get("cpu_us_per_msg", {}), ref.get("cpu_us_per_msg", {})
    return {
        "ratio": res.get("ratio", res.get("ratio_p50")),
        "gateway_us": lake_cpu.get("gateway"),
        "hub_us": lake_cpu.get("hub"),
        "jetstream_us": ref_cpu.get("server"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default=WORKLOADS)
    ap.add_argument("--consume", type=int, default=20_000)
    ap.add_argument("--scale", type=float, default=0.2)
    ap.add_argument("--micro", action="store_true", help="time the hot path's functions alone")
    args = ap.parse_args()
    if args.micro:
        micro()
        return
    rows: dict[tuple[str, str], list[dict[str, float | None]]] = {}
    for r in range(args.rounds):
        order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
        for variant in order:
            for res in one_run(variant, args.only, args.consume, args.scale):
                fig = figures(res)
                print(
                    json.dumps({"round": r, "variant": variant, "workload": res["workload"], **fig}),
                    flush=True,
                )
                rows.setdefault((res["workload"], variant), []).append(fig)
    print(
        "| workload | implementation | ratio to JetStream | gateway µs/msg | hub µs/msg | JetStream µs/msg |"
    )
    print("|---|---|---|---|---|---|")
    for (workload, variant), figs in sorted(rows.items()):
        cells = [_median([f[k] for f in figs]) for k in ("ratio", "gateway_us", "hub_us", "jetstream_us")]
        print(f"| {workload} | {variant} | " + " | ".join(cells) + " |")


def micro() -> None:
    """µs per message of each hot-path function, Python and compiled."""
    n = 10_000
    pubs = b"".join(
        b"LMSG orders.new.%d _INBOX.abc.%d 64\r\n%s\r\n" % (i % 10, i, b"x" * 64) for i in range(n)
    )
    acks = b"".join(
        b"LMSG $JS.ACK.ORDERS.dur.1.%d.%d.1700000000000000000.%d 4\r\n+ACK\r\n" % (i, i, n - i)
        for i in range(n)
    )
    ts = 1_700_000_000_000_000_000
    run = [
        (
            StoredMessage("ORDERS", 100_000, i, ts + i, f"orders.new.{i % 10}", None, b"x" * 64),
            Delivered(i, i, 1, 256 - i, i, 0, 0),
        )
        for i in range(256)
    ]
    replies = [
        (f"_INBOX.abc.{i}", b'{"stream":"ORDERS","domain":"jetlake","seq":%d}' % i) for i in range(256)
    ]
    for name, impl in (("python", framing), ("compiled", _framing)):
        figures = {
            "parse publishes": _best(partial(_parse, impl, pubs, False), n),
            "parse plain acks": _best(partial(_parse, impl, acks, True), n),
            "frame deliveries": _best(
                partial(impl.delivery_frames, "_INBOX.x.1", "ORDERS", "dur", (), run), len(run)
            ),
            "frame PubAcks": _best(partial(impl.encode_msgs, replies), len(replies)),
        }
        print(
            json.dumps({"implementation": name, "us_per_msg": {k: round(v, 3) for k, v in figures.items()}})
        )


def _parse(impl: ModuleType, data: bytes, ack_runs: bool) -> None:
    impl.FrameParser(ack_runs=ack_runs).feed(data)


def _best(step: Callable[[], object], messages: int) -> float:
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e6 / messages


def _median(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{statistics.median(known):.3g}" if known else "—"


if __name__ == "__main__":
    main()
