"""The ``$JS.ACK`` reply subject and ack bodies, as pure functions.

Token layout (what clients parse into message metadata):
``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<stored ns>.<pending>``;
the newer form inserts ``<domain>.<account hash>`` after ``ACK`` and appends a random token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AckToken:
    stream: str
    consumer: str
    deliveries: int
    seq: int
    cseq: int
    ts: int
    pending: int


@dataclass(frozen=True, slots=True)
class AckKind:
    kind: str  # "ack" | "nak" | "wpi" | "term" | "next"
    delay_ns: int = 0
    next_request: bytes = b""  # a pull request body for +NXT (a number or JSON)
    reason: str = ""


def ack_subject(
    stream: str, consumer: str, deliveries: int, seq: int, cseq: int, ts: int, pending: int
) -> str:
    return f"$JS.ACK.{stream}.{consumer}.{deliveries}.{seq}.{cseq}.{ts}.{pending}"


def parse_ack_subject(subject: str) -> AckToken | None:
    toks = subject.split(".")
    if len(toks) < 9 or toks[0] != "$JS" or toks[1] != "ACK":
        return None
    if len(toks) >= 11:
        toks = toks[:2] + toks[4:11]  # drop domain and account hash, and the trailing token
    try:
        return AckToken(
            toks[2], toks[3], int(toks[4]), int(toks[5]), int(toks[6]), int(toks[7]), int(toks[8])
        )
    except ValueError:
        return None


def parse_ack_body(body: bytes) -> AckKind | None:
    """The kind of an ack message; None for a body JetStream ignores."""
    text = body.strip()
    if text in (b"", b"+ACK", b"+OK"):
        return AckKind("ack")
    if text.startswith(b"-NAK"):
        return AckKind("nak", delay_ns=_nak_delay(text[4:].strip()))
    if text == b"+WPI":
        return AckKind("wpi")
    if text.startswith(b"+TERM"):
        return AckKind("term", reason=text[5:].strip().decode(errors="replace"))
    if text.startswith(b"+NXT"):
        return AckKind("next", next_request=text[4:].strip())
    return None


def _nak_delay(rest: bytes) -> int:
    if not rest:
        return 0
    try:
        value = json.loads(rest)
        return int(value.get("delay", 0)) if isinstance(value, dict) else 0
    except (ValueError, TypeError):
        return 0
