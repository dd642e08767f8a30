"""Per-message TTL values (ADR-43) as nats-server reads the ``Nats-TTL`` header.

The value is ``never``, a Go duration (``90s``, ``1h30m``) of at least one second, or a plain
number of seconds. Sub-second and zero durations and anything unparsable are rejected (10165):
2.15.1 does this although ADR-43 says a zero TTL is ignored, and clients see the server.
"""

from __future__ import annotations

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
