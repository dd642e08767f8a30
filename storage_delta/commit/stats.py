"""Counters a component keeps about itself, cheap enough for the hot path.

The monitor renders them (``gateway/metrics.py``); the component that owns one only ever calls
``observe``. Kept free of any metrics library so the storage layer imports nothing of ours or theirs.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field


@dataclass(slots=True)
class Histogram:
    """Observations counted into fixed buckets (upper bounds, inclusive), plus their sum."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)  # the last bucket is +Inf

    def observe(self, value: float, n: int = 1) -> None:
        """``n`` observations of ``value`` (the PubAcks of one commit run share one latency)."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.total += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations at or below it)`` for every bucket, +Inf last."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


# PubAck latency: a read of the leaf link to the PubAcks its commit releases (a commit and a hop).
PUBACK_SECONDS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
# Commit latency: a local-disk commit takes a few ms, an object-store one tens to hundreds.
COMMIT_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Messages per group commit: one under light load, thousands under heavy load.
BATCH_SIZE_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
