"""The frames of the leaf-node protocol and the parsing of its rare ones, shared by both parsers
(``gateway.wire.framing`` in Python, ``gateway.wire._framing`` compiled): a frame means the same
whichever parser read it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CRLF = b"\r\n"


@dataclass(slots=True)
class Msg:
    """An ``LMSG``/``HMSG`` from the server: a message for a subject the gateway has interest in."""

    subject: str
    reply: str
    hdrs: bytes | None
    data: bytes


@dataclass(slots=True)
class Info:
    body: dict[str, Any]


@dataclass(slots=True)
class Interest:
    """``LS+``/``LS-``: a subscription appeared (``added``) or went away on the server side."""

    added: bool
    subject: str
    queue: str | None


@dataclass(slots=True)
class Ping:
    pass


@dataclass(slots=True)
class Pong:
    pass


@dataclass(slots=True)
class ServerError:
    text: str


@dataclass(slots=True)
class AckRun:
    """Consecutive plain JetStream acks: ``LMSG`` frames without reply to an ack subject in the
    gateway's form (``$JS.ACK.<stream>.<consumer>`` and five numbers) with body ``+ACK`` or none,
    which is most of what consuming clients send. The parser cuts such a run out of the buffer
    in one pass and hands over (subject, stream, consumer, stream sequence) per ack, as the bytes
    they came as (a run's names are decoded once, not once per ack)."""

    acks: list[tuple[bytes, bytes, bytes, bytes]]


Frame = Msg | Info | Interest | Ping | Pong | ServerError | AckRun


class ProtocolError(Exception):
    """The server sent something this parser does not understand; the connection is dropped."""


def control_frame(line: bytes, append: Callable[[Frame], None]) -> None:
    """Every frame but a message (rare: handshake, interest changes, pings), from its line."""
    op = line[:4].upper()
    if op == b"PING":
        append(Ping())
    elif op == b"PONG":
        append(Pong())
    elif op.startswith(b"LS+") or op.startswith(b"LS-"):
        args = line.split()
        if len(args) < 2:
            raise ProtocolError(f"bad interest line {line!r}")
        append(
            Interest(
                added=args[0] == b"LS+",
                subject=args[1].decode(),
                queue=args[2].decode() if len(args) > 2 else None,
            )
        )
    elif op == b"INFO":
        append(Info(json.loads(line[5:])))
    elif op == b"-ERR":
        append(ServerError(line[5:].decode(errors="replace").strip("' ")))
    elif op.startswith(b"+OK") or not line:
        return
    else:
        raise ProtocolError(f"unknown operation {line[:40]!r}")


def reply_of(args: list[bytes]) -> str:
    """The reply among a message line's middle arguments (``reply``, ``+ reply queues…``, ``| queues…``)."""
    if not args:
        return ""
    if args[0] == b"+":
        return args[1].decode()
    if args[0] == b"|":
        return ""
    return args[0].decode()


def with_header(hdrs: bytes | None, name: str, value: str) -> bytes:
    """Stored headers plus one a delivery adds (``Nats-Msg-Size`` for ``headers_only``,
    ``Nats-Pin-Id``), last, as the server's ``genHeader`` adds it."""
    line = f"{name}: {value}\r\n\r\n".encode()
    return hdrs[:-2] + line if hdrs else b"NATS/1.0\r\n" + line
