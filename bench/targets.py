"""The two servers every workload runs against in the same run, started as the tests start them."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats

from tests.harness import Jetlake, ReferenceJetStream

BENCH_DIR = Path(__file__).resolve().parent
NODE_DIR = BENCH_DIR / "node"


@dataclass
class Target:
    """One server under test: its client URL and where its messages live on disk."""

    name: str
    url: str
    workdir: Path

    def stream_dir(self, stream: str) -> Path:
        if self.name == "jetstream":
            return self.workdir / "js" / "jetstream" / "$G" / "streams" / stream
        return self.workdir / "data" / "messages" / f"stream={stream}"


def start_targets(workdir: Path) -> tuple[ReferenceJetStream, Jetlake, list[Target]]:
    ref = ReferenceJetStream(workdir / "jetstream")
    ref.start()
    lake = Jetlake(workdir / "jetlake")
    lake.start()
    return ref, lake, [Target("jetstream", ref.url, ref.workdir), Target("jetlake", lake.url, lake.workdir)]


def loadgen(mode: str, url: str, prefix: str, count: int, payload: str, window: int = 256) -> dict[str, Any]:
    """Run the nats.js load generator and return its JSON line."""
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("the benchmarks need Node.js 20+ on PATH")
    proc = subprocess.run(
        [node, str(NODE_DIR / "loadgen.mjs"), mode, url, prefix, str(count), payload, str(window)],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    out: dict[str, Any] = json.loads(lines[-1]) if lines else {"error": proc.stderr[-2000:]}
    if proc.returncode != 0 or "error" in out:
        raise RuntimeError(f"loadgen {mode} against {url} failed: {out.get('error')}")
    return out


async def add_stream(url: str, name: str, subjects: list[str]) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(name=name, subjects=subjects, storage="file")
    finally:
        await nc.close()


async def stream_state(url: str, name: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    try:
        msg = await nc.request(f"$JS.API.STREAM.INFO.{name}", b"", timeout=30)
        state: dict[str, Any] = json.loads(msg.data)["state"]
        return state
    finally:
        await nc.close()


async def barrier(url: str, subject: str) -> tuple[int, float]:
    """An acked publish after a core load: its sequence minus one is what the stream stored before it,
    and its PubAck time is when that was stored (both servers store a stream's messages in order)."""
    nc = await nats.connect(url)
    try:
        ack = await nc.jetstream().publish(subject, b"barrier", timeout=120)
        return ack.seq, time.time()
    finally:
        await nc.close()


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
