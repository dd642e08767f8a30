"""Durations as Go renders them in the real server's error texts."""

from __future__ import annotations


def go_duration(ns: int) -> str:
    """A duration as Go's ``time.Duration.String`` writes it (``2s``, ``1.5s``, ``1m30s``, ``500ms``)."""
    if ns == 0:
        return "0s"
    if ns < 1_000:
        return f"{ns}ns"
    if ns < 1_000_000:
        return _trim(ns / 1_000) + "µs"
    if ns < 1_000_000_000:
        return _trim(ns / 1_000_000) + "ms"
    hours, rest = divmod(ns, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    secs = _trim(rest / 1_000_000_000) + "s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    if minutes:
        return f"{minutes}m{secs}"
    return secs


def _trim(value: float) -> str:
    return f"{value:.9f}".rstrip("0").rstrip(".")
