"""The leaf-node wire protocol as pure functions: frames in, bytes out, no I/O.

A leaf connection speaks a small protocol (INFO, CONNECT, PING/PONG, ``LS+``/``LS-``, ``LMSG``,
``HMSG``). The parser works on a whole buffer at a time and returns every complete frame in it,
which is what lets the ingest path keep up with a fast publisher.
"""

from __future__ import annotations

import json
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


Frame = Msg | Info | Interest | Ping | Pong | ServerError


class ProtocolError(Exception):
    """The server sent something this parser does not understand; the connection is dropped."""


class FrameParser:
    """Incremental parser: ``feed`` bytes, get back the frames completed so far."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._buf
        buf += data
        frames: list[Frame] = []
        pos = 0
        n = len(buf)
        while pos < n:
            eol = buf.find(CRLF, pos)
            if eol < 0:
                break
            line = bytes(buf[pos:eol])
            op = line[:4].upper()
            if op in (b"LMSG", b"HMSG"):
                args = line.split()
                is_hdr = op == b"HMSG"
                try:
                    total = int(args[-1])
                    hdr_len = int(args[-2]) if is_hdr else 0
                except (ValueError, IndexError) as exc:
                    raise ProtocolError(f"bad message line {line!r}") from exc
                start = eol + 2
                end = start + total
                if end + 2 > n:
                    break
                subject = args[1].decode()
                rest = args[2:-2] if is_hdr else args[2:-1]
                reply = _reply_of(rest)
                payload = bytes(buf[start:end])
                if is_hdr:
                    frames.append(Msg(subject, reply, payload[:hdr_len], payload[hdr_len:]))
                else:
                    frames.append(Msg(subject, reply, None, payload))
                pos = end + 2
                continue
            pos = eol + 2
            if op == b"PING":
                frames.append(Ping())
            elif op == b"PONG":
                frames.append(Pong())
            elif op.startswith(b"LS+") or op.startswith(b"LS-"):
                args = line.split()
                if len(args) < 2:
                    raise ProtocolError(f"bad interest line {line!r}")
                frames.append(
                    Interest(
                        added=args[0] == b"LS+",
                        subject=args[1].decode(),
                        queue=args[2].decode() if len(args) > 2 else None,
                    )
                )
            elif op == b"INFO":
                frames.append(Info(json.loads(line[5:])))
            elif op == b"-ERR":
                frames.append(ServerError(line[5:].decode(errors="replace").strip("' ")))
            elif op.startswith(b"+OK") or not line:
                continue
            else:
                raise ProtocolError(f"unknown operation {line[:40]!r}")
        del buf[:pos]
        return frames


def _reply_of(args: list[bytes]) -> str:
    """The reply among a message line's middle arguments (``reply``, ``+ reply queues…``, ``| queues…``)."""
    if not args:
        return ""
    if args[0] == b"+":
        return args[1].decode()
    if args[0] == b"|":
        return ""
    return args[0].decode()


def encode_connect(options: dict[str, Any]) -> bytes:
    return b"CONNECT " + json.dumps(options, separators=(",", ":")).encode() + CRLF


def encode_sub(subject: str, queue: str | None = None) -> bytes:
    return f"LS+ {subject} {queue} 1\r\n".encode() if queue else f"LS+ {subject}\r\n".encode()


def encode_unsub(subject: str, queue: str | None = None) -> bytes:
    return f"LS- {subject} {queue}\r\n".encode() if queue else f"LS- {subject}\r\n".encode()


def encode_msg(
    subject: str, reply: str, data: bytes, hdrs: bytes | None = None, queues: tuple[str, ...] = ()
) -> bytes:
    """An ``LMSG`` (or ``HMSG`` with headers) from the gateway to the server. A message for queue
    subscribers names their groups (``+ <reply> <queues…>`` or ``| <queues…>``): the server hands
    a leaf's message to a queue group only when the message lists it."""
    if queues:
        groups = " ".join(queues)
        head = f"{subject} + {reply} {groups} " if reply else f"{subject} | {groups} "
    else:
        head = f"{subject} {reply} " if reply else f"{subject} "
    if hdrs:
        return b"".join(
            (
                b"HMSG ",
                head.encode(),
                str(len(hdrs)).encode(),
                b" ",
                str(len(hdrs) + len(data)).encode(),
                CRLF,
                hdrs,
                data,
                CRLF,
            )
        )
    return b"".join((b"LMSG ", head.encode(), str(len(data)).encode(), CRLF, data, CRLF))
