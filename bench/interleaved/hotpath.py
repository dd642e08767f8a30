"""The leaf link's hot path, Python against compiled (#23), in interleaved rounds: each round runs
the workloads once with ``JETLAKE_NO_EXTENSIONS=1`` (the Python implementation, as before the
extension) and once compiled, in alternating order, each a ``bench.run`` with both servers (so every
ratio is against the real JetStream of the same run). Prints the medians per workload and variant:
the ratio to JetStream, and the CPU µs per message of jetlake's gateway and hub and of JetStream.

    python -m bench.interleaved.hotpath --rounds 3 --consume 20000 --scale 0.2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

from bench.targets import BENCH_DIR

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
    args = ap.parse_args()
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


def _median(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{statistics.median(known):.3g}" if known else "—"


if __name__ == "__main__":
    main()
