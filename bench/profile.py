"""Where the time goes during a workload: py-spy attached to the gateway process, and Go's pprof
on each nats-server (jetlake's hub, the reference JetStream), summed into the functions that hold
the most samples (own time) and the call paths under them."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TOP = 15


@contextmanager
def sampled(pid: int, raw: Path, rate: int = 100) -> Iterator[None]:
    """Sample ``pid`` (all threads, GIL holders and waiters alike) while the block runs."""
    spy = Path(sys.executable).parent / "py-spy"
    proc = subprocess.Popen(
        [str(spy), "record", "-o", str(raw), "-f", "raw", "-r", str(rate), "-p", str(pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


#: A thread-pool worker waiting in its queue's ``get`` (C code under this frame): py-spy counts it
#: as active, and with the pool's threads mostly waiting it held 53-66% of a consume run's samples,
#: which made every other share look two to three times smaller than it is. Left out of the shares.
IDLE_WORKER = "_worker (thread.py)"


def summarize(raw: Path, top: int = TOP) -> dict[str, object]:
    """The functions with the most own samples and with the most samples under them, in percent of
    the samples that were not an idle pool worker's."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = idle = 0
    if raw.exists():
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            n = int(count)
            frames = [_short(f) for f in stack.split(";")]
            if frames[-1] == IDLE_WORKER:
                idle += n
                continue
            total += n
            own[frames[-1]] += n
            for frame in set(frames):
                inclusive[frame] += n
    return {
        "samples": total,
        "idle_worker_samples": idle,
        "own_pct": _pct(own, total, top),
        "inclusive_pct": _pct(inclusive, total, top + 8),
    }


def _pct(counter: Counter[str], total: int, top: int) -> dict[str, float]:
    return {f: round(100 * n / total, 1) for f, n in counter.most_common(top)} if total else {}


def _short(frame: str) -> str:
    """``func (path/to/module.py:123)`` → ``func (module.py)``: lines differ between samples of one
    function and would split its count."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit('/', 1)[-1].split(':')[0]})" if where else name


#: Length of each Go CPU profile taken while a workload runs (they are merged at the end): the
#: server's pprof endpoint profiles for a fixed time, the workload's length is not known ahead.
GO_SLICE_S = 1


@contextmanager
def go_sampled(port: int, out: Path) -> Iterator[None]:
    """Go CPU profiles of the nats-server serving pprof on ``port``, one per second into ``out``,
    while the block runs (nothing when ``port`` is 0)."""
    if not port:
        yield
        return
    out.mkdir()
    stop = threading.Event()

    def take() -> None:
        n = 0
        while not stop.is_set():
            url = f"http://127.0.0.1:{port}/debug/pprof/profile?seconds={GO_SLICE_S}"
            with urllib.request.urlopen(url, timeout=GO_SLICE_S + 30) as resp:
                (out / f"{n:05d}.pb.gz").write_bytes(resp.read())
            n += 1

    taker = threading.Thread(target=take, name="go-pprof")
    taker.start()
    try:
        yield
    finally:
        stop.set()
        taker.join()


def go_summarize(out: Path, top: int = TOP) -> dict[str, object]:
    """The merged profiles' functions with the most own (flat) and cumulative CPU, in percent of
    the samples, from ``go tool pprof -top`` (Debian's golang)."""
    files = sorted(out.glob("*.pb.gz")) if out.exists() else []
    go = shutil.which("go")
    if not files or go is None:
        return {}
    text = subprocess.run(
        [go, "tool", "pprof", "-top", f"-nodecount={top}", *map(str, files)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cum = subprocess.run(
        [go, "tool", "pprof", "-top", "-cum", f"-nodecount={top + 8}", *map(str, files)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {"own_pct": _pprof_rows(text, 1), "inclusive_pct": _pprof_rows(cum, 4)}


def _pprof_rows(text: str, column: int) -> dict[str, float]:
    """``flat flat% sum% cum cum% name`` rows: name to the percent in ``column`` (1 flat, 4 cum)."""
    rows: dict[str, float] = {}
    for line in text.splitlines():
        cols = line.split(None, 5)
        if len(cols) == 6 and cols[1].endswith("%") and cols[4].endswith("%"):
            rows[cols[5]] = float(cols[column].rstrip("%"))
    return rows
