"""Where the gateway's time goes during a workload: py-spy attached to the gateway process, summed
into the functions that hold the most samples (own time) and the call paths under them."""

from __future__ import annotations

import signal
import subprocess
import sys
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


def summarize(raw: Path, top: int = TOP) -> dict[str, object]:
    """The functions with the most own samples and with the most samples under them, in percent."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    if raw.exists():
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            n = int(count)
            total += n
            frames = [_short(f) for f in stack.split(";")]
            own[frames[-1]] += n
            for frame in set(frames):
                inclusive[frame] += n
    return {
        "samples": total,
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
