"""The histogram components keep for the monitor (``storage_delta/stats.py``): Prometheus semantics."""

from __future__ import annotations

from storage_delta.commit.stats import Histogram


def test_bounds_are_inclusive_and_cumulative() -> None:
    """An observation equal to a bound counts in that bucket (Prometheus ``le``); buckets add up."""
    h = Histogram((1.0, 5.0))
    for v in (0.5, 1.0, 1.5, 5.0, 7.0):
        h.observe(v)
    assert h.cumulative() == [(1.0, 2), (5.0, 4), (float("inf"), 5)]
    assert h.count == 5
    assert h.total == 15.0


def test_empty_histogram() -> None:
    h = Histogram((1.0,))
    assert h.cumulative() == [(1.0, 0), (float("inf"), 0)]
    assert (h.count, h.total) == (0, 0.0)
