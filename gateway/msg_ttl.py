"""Per-message TTL values (ADR-43) as nats-server reads the ``Nats-TTL`` header.

The value is ``never``, a Go duration (``90s``, ``1h30m``) of at least one second, or a plain
number of seconds. Sub-second and zero durations and anything unparsable are rejected (10165):
2.15.1 does this although ADR-43 says a zero TTL is ignored, and clients see the server.
"""

from __future__ import annotations

import heapq
import re

NEVER = -1

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


class InvalidTTL(ValueError):
    """The header holds no TTL nats-server would accept."""


class BadDuration(ValueError):
    """Not a Go duration string."""


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


def parse_ttl(value: str) -> int:
    """Seconds of a ``Nats-TTL`` value, :data:`NEVER` for ``never``; raises :class:`InvalidTTL`."""
    if value.lower() == "never":
        return NEVER
    try:
        ns = parse_go_duration(value)
    except BadDuration:
        if value.isdigit() and value.isascii():
            return int(value)
        raise InvalidTTL(value) from None
    if ns < 1_000_000_000:
        raise InvalidTTL(value)
    return ns // 1_000_000_000


def go_duration_string(ns: int) -> str:
    """A duration as Go's ``time.Duration.String`` writes it for whole seconds (``1s``, ``1m30s``,
    ``1h0m0s``): the form nats-server puts in a delete marker's ``Nats-TTL``."""
    secs = ns // 1_000_000_000
    if secs < 60:
        return f"{secs}s"
    mins, s = divmod(secs, 60)
    if mins < 60:
        return f"{mins}m{s}s"
    hours, m = divmod(mins, 60)
    return f"{hours}h{m}m{s}s"


class TTLSchedule:
    """Which messages of a stream a ``Nats-TTL`` removes, and when; pure.

        Deadlines sit in a heap keyed by time; an entry names the message by sequence *and* stored time,
        because a failed commit can hand the same sequence to another message. ``never`` messages are
        exempt from MaxAge; ``markers`` are delete markers (the server's, or KV purges), whose expiry
    places no new marker.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, int]] = []
        self.never: set[int] = set()
        self.markers: set[int] = set()

    def add(self, seq: int, ts: int, ttl_s: int) -> None:
        if ttl_s == NEVER:
            self.never.add(seq)
        elif ttl_s > 0:
            heapq.heappush(self._heap, (ts + ttl_s * 1_000_000_000, seq, ts))

    def due(self, now_ns: int) -> list[tuple[int, int]]:
        """(seq, stored time) of every message whose TTL has run out, taken off the schedule."""
        out = []
        heap = self._heap
        while heap and heap[0][0] <= now_ns:
            _, seq, ts = heapq.heappop(heap)
            out.append((seq, ts))
        return out

    def forget_after(self, seq: int) -> None:
        """Sequences above ``seq`` were rolled back (heap entries are checked by time instead)."""
        self.never = {s for s in self.never if s <= seq}
        self.markers = {s for s in self.markers if s <= seq}
