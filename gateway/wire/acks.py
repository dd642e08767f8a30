"""The ``$JS.ACK`` reply subject and ack bodies, as pure functions.

Token layout (what clients parse into message metadata):
``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<stored ns>.<pending>``;
the newer form inserts ``<domain>.<account hash>`` after ``ACK`` and appends a random token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import NamedTuple


class AckToken(NamedTuple):
    """The numbers of an ack reply subject (a tuple: one is parsed per ack)."""

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
    n = len(toks)
    if n < 9 or toks[0] != "$JS" or toks[1] != "ACK":
        return None
    i = 4 if n >= 11 else 2  # the newer form: skip domain and account hash (and the trailing token)
    try:
        # a named tuple without its Python-level constructor call: one is parsed per ack
        return _new(AckToken, (toks[i], toks[i + 1], *map(int, toks[i + 2 : i + 7])))
    except ValueError:
        return None


_new = tuple.__new__


#: ``+ACK`` (or an empty body): what nearly every ack is.
PLAIN_ACK = AckKind("ack")
_WPI = AckKind("wpi")


def parse_ack_body(body: bytes) -> AckKind | None:
    """The kind of an ack message; None for a body JetStream ignores."""
    if not body or body == b"+ACK":  # what nearly every ack is: no strip, no allocation
        return PLAIN_ACK
    text = body.strip()
    if text in (b"", b"+ACK", b"+OK"):
        return PLAIN_ACK
    if text.startswith(b"-NAK"):
        return AckKind("nak", delay_ns=_nak_delay(text[4:].strip()))
    if text == b"+WPI":
        return _WPI
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
