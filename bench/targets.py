"""The two servers every workload runs against in the same run, started as the tests start them."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.js.client import JetStreamContext
from nats.js.errors import APIError

from tests.harness import Jetlake, ReferenceJetStream, free_port

BENCH_DIR = Path(__file__).resolve().parent
NODE_DIR = BENCH_DIR / "node"


@dataclass
class Target:
    """One server under test: its client URL and where its messages live on disk."""

    name: str
    url: str
    workdir: Path
    #: Stop and start the server that holds the streams (jetlake: the gateway process alone),
    #: running the given step, if any, while it is down.
    restart: Callable[[Callable[[], None] | None], None]
    #: The process that stores the messages (jetlake: the gateway), for profiles.
    pid: Callable[[], int]
    #: Every process of the server by role (jetlake: the gateway and its hub nats-server), whose
    #: CPU time a workload reports per message.
    processes: Callable[[], dict[str, int]]
    #: The Go pprof port of its nats-server (jetlake: the hub), 0 for none (``bench.run --profile``).
    pprof_port: int = 0

    def stream_dir(self, stream: str) -> Path:
        if self.name == "jetstream":
            return self.workdir / "js" / "jetstream" / "$G" / "streams" / stream
        return self.workdir / "data" / "messages" / f"stream={stream}"


class ProfiledJetlake(Jetlake):
    """jetlake whose hub nats-server serves Go's pprof on ``profile_port``."""

    def __init__(self, workdir: Path, profile_port: int) -> None:
        super().__init__(workdir)
        self.profile_port = profile_port

    def server_conf(self) -> str:
        return super().server_conf() + f"prof_port: {self.profile_port}\n"


def start_targets(workdir: Path, pprof: bool = False) -> tuple[ReferenceJetStream, Jetlake, list[Target]]:
    """Both servers; with ``pprof``, each nats-server (the reference, jetlake's hub) serves Go's
    CPU profiles."""
    ref = ReferenceJetStream(workdir / "jetstream", profile_port=free_port() if pprof else 0)
    ref.start()
    lake = ProfiledJetlake(workdir / "jetlake", free_port()) if pprof else Jetlake(workdir / "jetlake")
    lake.start()

    def restart_ref(between: Callable[[], None] | None = None) -> None:
        ref.stop()
        if between is not None:
            between()
        ref.start()

    def restart_lake(between: Callable[[], None] | None = None) -> None:
        lake.stop_gateway()
        if between is not None:
            between()
        lake.start_gateway()  # returns once the API answers, which is after recovery

    return (
        ref,
        lake,
        [
            Target(
                "jetstream",
                ref.url,
                ref.workdir,
                restart_ref,
                lambda: _pid(ref.proc),
                lambda: {"server": _pid(ref.proc)},
                ref.profile_port,
            ),
            Target(
                "jetlake",
                lake.url,
                lake.workdir,
                restart_lake,
                lambda: _pid(lake.gateway),
                lambda: {"gateway": _pid(lake.gateway), "hub": _pid(lake.server)},
                lake.profile_port if isinstance(lake, ProfiledJetlake) else 0,
            ),
        ],
    )


def _pid(proc: subprocess.Popen[bytes] | None) -> int:
    assert proc is not None
    return proc.pid


async def wait_stream_messages(url: str, name: str, messages: int, wait_s: float = 600) -> None:
    """Poll until the stream answers with all its messages (JetStream answers STREAM.INFO while it
    is still recovering a stream). Each ask waits 0.1 s at most: one that went to a
    gateway killed a moment before is asked again, not waited out (a takeover measured 30 s so)."""
    deadline = time.monotonic() + wait_s
    seen: object = None
    while True:
        try:
            seen = (await stream_state(url, name, ask_s=0.1))["messages"]
            if seen == messages:
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"stream {name} has {seen} messages after {wait_s} s, not {messages}")
        await asyncio.sleep(0.05)


def timed_restart(
    target: Target, stream: str, messages: int, between: Callable[[], None] | None = None
) -> float:
    """Seconds from stop to a stream that answers with all its messages again (``between`` runs
    while the server is down)."""
    t0 = time.monotonic()
    target.restart(between)
    asyncio.run(wait_stream_messages(target.url, stream, messages))
    return round(time.monotonic() - t0, 2)


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


async def stream_state(url: str, name: str, ask_s: float = 30) -> dict[str, Any]:
    nc = await nats.connect(url)
    try:
        msg = await nc.request(f"$JS.API.STREAM.INFO.{name}", b"", timeout=ask_s)
        state: dict[str, Any] = json.loads(msg.data)["state"]
        return state
    finally:
        await nc.close()


async def acked_publish(js: JetStreamContext, subject: str, data: bytes) -> int:
    """A publish waiting for its PubAck; returns its sequence. A server still working through a flood
    of core publishes refuses it with 429 (JetStream's ingest queue is full): it is sent again until
    the queue has room."""
    deadline = time.monotonic() + 600
    while True:
        try:
            return (await js.publish(subject, data, timeout=120)).seq
        except APIError as err:
            if err.code != 429 or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def barrier(url: str, subject: str) -> tuple[int, float]:
    """An acked publish after a core load: its sequence minus one is what the stream stored before it,
    and its PubAck time is when that was stored (both servers store a stream's messages in order)."""
    nc = await nats.connect(url)
    try:
        return await acked_publish(nc.jetstream(), subject, b"barrier"), time.time()
    finally:
        await nc.close()


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
