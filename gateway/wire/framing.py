"""The leaf link's per-message work in plain Python: the frame parser, the framing of a run of
deliveries and of PubAcks. ``gateway.wire._framing`` is the same compiled (Cython, built at
install); ``gateway.wire.protocol`` picks one, and this one wherever the compiled one is missing
or ``JETLAKE_NO_EXTENSIONS`` is set. Both give the same bytes and frames (tests/test_protocol.py
runs every case on both)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from gateway.wire.frames import CRLF, AckRun, Frame, Msg, ProtocolError, control_frame, reply_of, with_header

_MSG_OPS = (b"LMSG", b"HMSG")
_H = b"Hh"
_ACK_START = b"LMSG $JS.ACK."
_ACK_RUN = re.compile(
    rb"(?:LMSG \$JS\.ACK\.[^. \r\n]+\.[^. \r\n]+\.\d+\.\d+\.\d+\.\d+\.\d+ (?:4\r\n\+ACK|0\r\n)\r\n)+"
)
_ACK_FIELDS = re.compile(rb"LMSG (\$JS\.ACK\.([^.]+)\.([^.]+)\.\d+\.(\d+)\.[^ ]+) ")


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
                    reply = reply_of(args[1:-2] if is_hdr else args[1:-1])
                if is_hdr:
                    split = start + hdr_len
                    append(Msg(args[0].decode(), reply, buf[start:split], buf[split:end]))
                else:
                    append(Msg(args[0].decode(), reply, None, buf[start:end]))
                pos = end + 2
                continue
            line = buf[pos:eol]
            pos = eol + 2
            control_frame(line, append)
        self._rest = buf[pos:] if pos < n else b""
        return frames


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


class StoredLike(Protocol):
    """What a delivery sends of a stored message (``storage_delta``'s ``StoredMessage``)."""

    @property
    def subject(self) -> str: ...
    @property
    def hdrs(self) -> bytes | None: ...
    @property
    def data(self) -> bytes: ...
    @property
    def ts(self) -> int: ...


class DeliveredLike(Protocol):
    """A delivery's ack-token numbers (the consumer engine's ``Delivered``)."""

    @property
    def seq(self) -> int: ...
    @property
    def cseq(self) -> int: ...
    @property
    def deliveries(self) -> int: ...
    @property
    def pending(self) -> int: ...


def delivery_frames(
    inbox: str,
    stream: str,
    consumer: str,
    queues: tuple[str, ...],
    run: Sequence[tuple[StoredLike, DeliveredLike]],
    headers_only: bool = False,
    pin: str | None = None,
) -> tuple[bytes, int]:
    """A run of deliveries to ``inbox`` as one buffer, each under its stored subject with its ack
    reply (``$JS.ACK.<stream>.<consumer>.<deliveries>.<seq>.<cseq>.<ts>.<pending>@<subject>``),
    and the size a pull request's ``max_bytes`` counts for them (subject, reply, headers, payload,
    before a pin header is added, as the server sizes it)."""
    parts: list[bytes] = []
    add = parts.append
    size = 0
    for msg, d in run:
        token = f"$JS.ACK.{stream}.{consumer}.{d.deliveries}.{d.seq}.{d.cseq}.{msg.ts}.{d.pending}"
        data, hdrs = msg.data, msg.hdrs
        if headers_only:
            data, hdrs = b"", with_header(hdrs, "Nats-Msg-Size", str(len(data)))
        size += len(msg.subject) + len(token) + len(data) + (len(hdrs) if hdrs else 0)
        if pin is not None:
            hdrs = with_header(hdrs, "Nats-Pin-Id", pin)
        hdr_len = len(hdrs) if hdrs else 0
        add(msg_head(inbox, f"{token}@{msg.subject}", len(data), hdr_len, queues))
        if hdrs:
            add(hdrs)
        add(data)
        add(CRLF)
    return b"".join(parts), size
