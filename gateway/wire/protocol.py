"""The leaf-node wire protocol as pure functions: frames in, bytes out, no I/O.

A leaf connection speaks a small protocol (INFO, CONNECT, PING/PONG, ``LS+``/``LS-``, ``LMSG``,
``HMSG``). The parser works on a whole buffer at a time and returns every complete frame in it,
which is what lets the ingest path keep up with a fast publisher.
"""

from __future__ import annotations

import json
import re
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
    with one regular expression and hands over (subject, stream, consumer, stream sequence) per
    ack, as the bytes they came as (a run's names are decoded once, not once per ack)."""

    acks: list[tuple[bytes, bytes, bytes, bytes]]


Frame = Msg | Info | Interest | Ping | Pong | ServerError | AckRun


_MSG_OPS = (b"LMSG", b"HMSG")
_H = b"Hh"
_ACK_START = b"LMSG $JS.ACK."
_ACK_RUN = re.compile(
    rb"(?:LMSG \$JS\.ACK\.[^. \r\n]+\.[^. \r\n]+\.\d+\.\d+\.\d+\.\d+\.\d+ (?:4\r\n\+ACK|0\r\n)\r\n)+"
)
_ACK_FIELDS = re.compile(rb"LMSG (\$JS\.ACK\.([^.]+)\.([^.]+)\.\d+\.(\d+)\.[^ ]+) ")


class ProtocolError(Exception):
    """The server sent something this parser does not understand; the connection is dropped."""


class FrameParser:
    """Incremental parser: ``feed`` bytes, get back the frames completed so far.

    Messages are most of the traffic, so their lines are recognised first and cut with
    ``bytes.find`` on the read buffer itself: one copy per payload and one per line, no
    ``bytearray`` kept between reads unless a frame is split across them. With ``ack_runs``,
    plain acks come as :class:`AckRun` frames instead of one :class:`Msg` each."""

    def __init__(self, ack_runs: bool = False) -> None:
        self._rest = b""
        self._ack_runs = ack_runs

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._rest + data if self._rest else bytes(data)
        frames: list[Frame] = []
        append = frames.append
        find = buf.find
        startswith = buf.startswith
        pos = 0
        n = len(buf)
        ack_runs = self._ack_runs
        while pos < n:
            if ack_runs and startswith(_ACK_START, pos):
                run = _ACK_RUN.match(buf, pos)
                if run is not None:
                    end = run.end()
                    append(AckRun(_ACK_FIELDS.findall(buf, pos, end)))
                    pos = end
                    continue
            eol = find(CRLF, pos)
            if eol < 0:
                break
            if (
                startswith(b"LMSG ", pos)
                or startswith(b"HMSG ", pos)
                or buf[pos : pos + 4].upper() in _MSG_OPS
            ):
                is_hdr = buf[pos] in _H
                args = buf[pos + 4 : eol].split()
                try:
                    total = int(args[-1])
                    hdr_len = int(args[-2]) if is_hdr else 0
                except (ValueError, IndexError) as exc:
                    raise ProtocolError(f"bad message line {buf[pos:eol]!r}") from exc
                start = eol + 2
                end = start + total
                if end + 2 > n:
                    break
                nargs = len(args)
                if nargs == 2 and not is_hdr:  # the common publish: subject and size
                    reply = ""
                elif (nargs == 3 and not is_hdr) or (nargs == 4 and is_hdr):  # subject, reply, sizes
                    reply = args[1].decode()
                else:
                    reply = _reply_of(args[1:-2] if is_hdr else args[1:-1])
                if is_hdr:
                    split = start + hdr_len
                    append(Msg(args[0].decode(), reply, buf[start:split], buf[split:end]))
                else:
                    append(Msg(args[0].decode(), reply, None, buf[start:end]))
                pos = end + 2
                continue
            line = buf[pos:eol]
            pos = eol + 2
            self._control(line, append)
        self._rest = buf[pos:] if pos < n else b""
        return frames

    @staticmethod
    def _control(line: bytes, append: Callable[[Frame], None]) -> None:
        """Every frame but a message (rare: handshake, interest changes, pings)."""
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
    """An ``LMSG`` (or ``HMSG`` with headers) from the gateway to the server."""
    if hdrs:
        return b"".join((msg_head(subject, reply, len(data), len(hdrs), queues), hdrs, data, CRLF))
    return b"".join((msg_head(subject, reply, len(data), 0, queues), data, CRLF))


def msg_head(subject: str, reply: str, size: int, hdr_len: int = 0, queues: tuple[str, ...] = ()) -> bytes:
    """The line of an ``LMSG`` (``HMSG`` when ``hdr_len``) before its payload of ``size`` bytes
    (headers excluded). A message for queue subscribers names their groups (``+ <reply>
    <queues…>`` or ``| <queues…>``): the server hands a leaf's message to a queue group only when
    the message lists it."""
    if queues:
        groups = " ".join(queues)
        head = f"{subject} + {reply} {groups}" if reply else f"{subject} | {groups}"
    else:
        head = f"{subject} {reply}" if reply else subject
    if hdr_len:
        return f"HMSG {head} {hdr_len} {hdr_len + size}\r\n".encode()
    return f"LMSG {head} {size}\r\n".encode()


def encode_msgs(frames: list[tuple[str, bytes]]) -> bytes:
    """Several ``LMSG`` without reply or headers (subject, payload) as one buffer."""
    return b"".join(
        [b"LMSG %s %d\r\n%s\r\n" % (subject.encode(), len(data), data) for subject, data in frames]
    )
