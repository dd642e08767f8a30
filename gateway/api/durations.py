"""Durations as Go writes them (``time.Duration.String``, in the real server's texts and headers) and
reads them (``time.ParseDuration``, e.g. a ``Nats-TTL`` header)."""

from __future__ import annotations

import re


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


class BadDuration(ValueError):
    """Not a Go duration string."""


_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,
    "\u03bcs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_PART = re.compile(r"(\d*)(?:\.(\d*))?([a-z\u00b5\u03bc]+)")


def parse_go_duration(text: str) -> int:
    """Nanoseconds of a Go duration string (``time.ParseDuration``), or :class:`BadDuration`."""
    s = text
    sign = 1
    if s[:1] in ("+", "-"):
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise BadDuration(text)
    total = 0
    pos = 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None or m.end() == pos:
            raise BadDuration(text)
        whole, frac, unit = m.group(1), m.group(2), m.group(3)
        if (not whole and not frac) or unit not in _UNIT_NS:
            raise BadDuration(text)
        scale = _UNIT_NS[unit]
        total += int(whole or 0) * scale
        if frac:
            total += int(frac) * scale // 10 ** len(frac)
        pos = m.end()
    return sign * total
