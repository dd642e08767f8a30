"""Timestamps as JetStream writes them: Go's RFC 3339 with nanoseconds, trailing zeros trimmed."""

from __future__ import annotations

import time
from datetime import UTC, datetime

ZERO_TIME = "0001-01-01T00:00:00Z"


def rfc3339(ns: int) -> str:
    if ns <= 0:
        return ZERO_TIME
    secs, frac = divmod(ns, 1_000_000_000)
    base = datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if frac:
        return f"{base}.{frac:09d}".rstrip("0") + "Z"
    return base + "Z"


#: The wall clock in Unix nanoseconds (the function itself: it is read several times per message).
now_ns = time.time_ns
