"""Per-message TTL values (ADR-43) as nats-server reads the ``Nats-TTL`` header.

The value is ``never``, a Go duration (``90s``, ``1h30m``) of at least one second, or a plain
number of seconds. Sub-second and zero durations and anything unparsable are rejected (10165):
2.15.1 does this although ADR-43 says a zero TTL is ignored, and clients see the server.
"""

from __future__ import annotations

import heapq

from gateway.api.durations import BadDuration, parse_go_duration

NEVER = -1


class InvalidTTL(ValueError):
    """The header holds no TTL nats-server would accept."""


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

    def next_ns(self) -> int | None:
        """The earliest deadline on the schedule (its message may be gone by then), None if none."""
        return self._heap[0][0] if self._heap else None

    def forget_after(self, seq: int) -> None:
        """Sequences above ``seq`` were rolled back (heap entries are checked by time instead)."""
        self.never = {s for s in self.never if s <= seq}
        self.markers = {s for s in self.markers if s <= seq}
