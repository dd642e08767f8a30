"""The gateway's leaf-node connection to nats-server: handshake, reader, interest, reconnect.

A leaf link (not a client connection) is what lets a delivery reach a client's inbox under the
message's stored subject (reply ``$JS.ACK…@<stored subject>``) and what tells the gateway about
every subscription on the server (``LS+``/``LS-``), see docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from gateway.runtime.signals import Signal
from gateway.wire import protocol as proto
from gateway.wire.leafauth import CredentialsError, LeafTarget, SubscribePermissions
from storage_delta.format.nats import subject_matches

log = logging.getLogger(__name__)

HIGH_WATER = 8 * 1024 * 1024
FLUSH_BYTES = 256 * 1024  # queued frames are written at the latest at this size


class Interest:
    """Which subscriptions the server has, as ``LS+``/``LS-`` reported them: one entry per
    subject and queue group (the hub sends ``LS+`` for a plain subject when its first subscriber
    comes and ``LS-`` when its last goes, and for a queue group ``LS+`` with the group's new
    weight at every change, ``LS-`` when it is empty), so an entry is there or not, never counted.
    """

    def __init__(self) -> None:
        self._entries: set[tuple[str, str]] = set()  # (subject, queue group or "")
        self._literal: dict[str, int] = {}  # entries per subject without wildcards
        self._wild: dict[str, int] = {}
        #: Told after every change (consumer timers look at who listens then, not on a tick).
        self.changed: Signal[[]] = Signal()
        #: Told of each plain subject the hub reported coming (True) or going (False), before
        #: :attr:`changed`; not of a :meth:`clear`: a lost link says nothing of who left.
        self.moved: Signal[[str, bool]] = Signal()

    def add(self, subject: str, queue: str | None = None) -> None:
        entry = (subject, queue or "")
        if entry not in self._entries:
            self._entries.add(entry)
            bucket = self._bucket(subject)
            bucket[subject] = bucket.get(subject, 0) + 1
            if not queue:
                self.moved.emit(subject, True)
        self.changed.emit()

    def remove(self, subject: str, queue: str | None = None) -> None:
        entry = (subject, queue or "")
        if entry in self._entries:
            self._entries.discard(entry)
            bucket = self._bucket(subject)
            n = bucket[subject] - 1
            if n > 0:
                bucket[subject] = n
            else:
                del bucket[subject]
            if not queue:
                self.moved.emit(subject, False)
        self.changed.emit()

    def _bucket(self, subject: str) -> dict[str, int]:
        return self._wild if ("*" in subject or ">" in subject) else self._literal

    def clear(self) -> None:
        self._entries.clear()
        self._literal.clear()
        self._wild.clear()
        self.changed.emit()

    def has(self, subject: str) -> bool:
        """Whether a message to ``subject`` reaches some subscriber (wildcards and queue groups
        included): a pull request's inbox is alive while this holds."""
        if subject in self._literal:
            return True
        return any(subject_matches(w, subject) for w in self._wild)

    def bound(self, subject: str, group: str) -> bool:
        """Whether a push consumer delivering to ``subject`` (in queue group ``group``, "" for
        none) is bound: the server binds it to a subscription on exactly that subject in exactly
        that group (``Sublist.registerNotification``); a wildcard subscription, a queue
        subscriber of a consumer without group or a plain one of a consumer with one does not
        bind it, and such a consumer delivers nothing."""
        return (subject, group) in self._entries


def _always() -> bool:
    return True


class LinkHandler(Protocol):
    """What the link hands over, in the order it reads it (the service's dispatcher)."""

    def on_msg(self, msg: proto.Msg) -> None: ...

    def on_acks(self, acks: list[tuple[bytes, bytes, bytes, bytes]]) -> None:
        """A run of plain acks (``protocol.AckRun``)."""

    def on_read_done(self) -> None:
        """The messages of one socket read are handed over, before the reader waits again: the
        publish path submits what that read accepted as one run per stream."""

    def on_connected(self, info: dict[str, object]) -> None:
        """The hub's INFO, once per connection."""


class _Nobody:
    """The handler before ``start``: nothing is read before it, so nothing is handed over."""

    def on_msg(self, msg: proto.Msg) -> None:
        pass

    def on_acks(self, acks: list[tuple[bytes, bytes, bytes, bytes]]) -> None:
        pass

    def on_read_done(self) -> None:
        pass

    def on_connected(self, info: dict[str, object]) -> None:
        pass


class LeafConnection:
    """One leaf link; :meth:`start` keeps it up (reconnecting) until :meth:`close`. Components
    that send hold it from construction; what it reads goes to the handler given to ``start``."""

    def __init__(self, target: LeafTarget, name: str) -> None:
        self.target = target
        self.name = name
        self._handler: LinkHandler = _Nobody()
        self._subs: set[str] = set()
        self.interest = Interest()
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        self._closing = False
        self.server_info: dict[str, object] = {}
        self.permissions = SubscribePermissions()
        self.reconnects = 0
        self.dropped_writes = 0
        self._out: list[bytes] = []  # frames written this event-loop turn, sent by ``_flush``
        self._flush_scheduled = False
        self._out_bytes = 0
        #: Whether what the link reads may be served now. While it says no, messages and acks are
        #: dropped as read (control frames are still handled): a gateway that cannot be sure it
        #: still owns the store answers nothing (its clients time out and retry).
        self.admits: Callable[[], bool] = _always

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def start(self, handler: LinkHandler, wait_s: float = 3.0) -> None:
        """Start the link, handing what it reads to ``handler``, and give it ``wait_s`` to come
        up. A hub that is down or refuses the credentials at start-up is not fatal: the link keeps
        retrying, as after any later loss."""
        self._handler = handler
        self._task = asyncio.create_task(self._run(), name="leaf-connection")
        try:
            await asyncio.wait_for(self._connected.wait(), wait_s)
        except TimeoutError:
            t = self.target
            log.warning("leaf link to %s:%d not up after %.0f s; still trying", t.host, t.port, wait_s)

    async def _run(self) -> None:
        delay = 0.05
        while not self._closing:
            try:
                await self._session()
                delay = 0.05
            except asyncio.CancelledError:
                raise
            except (
                OSError,
                proto.ProtocolError,
                asyncio.IncompleteReadError,
                ConnectionError,
                CredentialsError,
            ) as exc:
                log.warning("leaf connection lost: %s", exc)
            self._connected.clear()
            self._writer = None
            self._out, self._out_bytes = [], 0  # frames for the lost connection are not sent later
            self.interest.clear()
            if self._closing:
                return
            self.reconnects += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _session(self) -> None:
        t = self.target
        reader, writer = await asyncio.open_connection(t.host, t.port, limit=1 << 20)
        try:
            parser = proto.FrameParser(ack_runs=True)
            await self._handshake(reader, writer, parser)
            await self._read(reader, writer, parser)
        finally:
            self._connected.clear()
            # Aborted, not closed: a TLS transport's close waits for the peer's close_notify (up to
            # 30 s), and a gateway that stops closes its loop before that, leaving the socket open.
            # Nothing is lost: close() drained what was to be sent, and after a lost connection the
            # frames are dropped anyway.
            writer.transport.abort()

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, parser: proto.FrameParser
    ) -> None:
        """INFO, TLS if the server asks for it, then CONNECT and a PING: its PONG, which ``_read``
        waits for, says the server took the CONNECT."""
        t = self.target
        line = await reader.readline()
        frames = parser.feed(line)
        info = next((f for f in frames if isinstance(f, proto.Info)), None)
        if info is None:
            raise proto.ProtocolError("no INFO from server")
        self.server_info = info.body
        self.permissions = SubscribePermissions.from_info(info.body)
        if t.wants_tls(info.body):
            # a leafnode listener sends INFO in the clear, then expects the TLS handshake
            await writer.start_tls(t.ssl_context(), server_hostname=t.host)
        opts: dict[str, object] = {
            "name": self.name,
            "headers": True,
            "protocol": 1,
            "verbose": False,
            "pedantic": False,
            **t.connect_auth(str(info.body.get("nonce", ""))),
        }
        writer.write(proto.encode_connect(opts) + b"PING\r\n")
        await writer.drain()

    async def _read(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, parser: proto.FrameParser
    ) -> None:
        """The link's frames until it ends: messages and ack runs, nearly all of them, are handed
        on here; the rest go to ``_on_control``."""
        up = False
        handler = self._handler
        on_msg, on_acks, on_read_done = handler.on_msg, handler.on_acks, handler.on_read_done
        while True:
            data = await reader.read(1 << 20)
            if not data:
                raise ConnectionError("server closed the connection")
            serving = self.admits()
            try:
                for frame in parser.feed(data):
                    if type(frame) is proto.Msg:
                        if serving:
                            on_msg(frame)
                    elif type(frame) is proto.AckRun:
                        if serving:
                            on_acks(frame.acks)
                    else:
                        up = self._on_control(frame, writer, up)
            finally:
                on_read_done()

    def _on_control(self, frame: proto.Frame, writer: asyncio.StreamWriter, up: bool) -> bool:
        """Interest, PING, INFO, PONG, -ERR; whether the link is up after the frame (the first
        PONG brings it up: only then are the subscriptions sent and writes let through; the
        second says the server holds the subscriptions, and the link is connected)."""
        if isinstance(frame, proto.Interest):
            if frame.added:
                self.interest.add(frame.subject, frame.queue)
            else:
                self.interest.remove(frame.subject, frame.queue)
        elif isinstance(frame, proto.Ping):
            writer.write(b"PONG\r\n")
        elif isinstance(frame, proto.Info):
            # sent after CONNECT: what this leaf may subscribe to
            self.server_info = frame.body
            self.permissions = SubscribePermissions.from_info(frame.body)
        elif isinstance(frame, proto.Pong) and not up:
            # the CONNECT taken: the subscriptions, and a PING whose PONG says the server holds
            # them (the link counts as connected only then: a request right after a start got
            # "no responders" from a hub that had not read them yet)
            writer.write(b"".join(self._sub_frame(s) for s in sorted(self._subs)) + b"PING\r\n")
            self._writer = writer
            return True
        elif isinstance(frame, proto.Pong) and not self._connected.is_set():
            self._connected.set()
            self._handler.on_connected(self.server_info)
        elif isinstance(frame, proto.ServerError):
            if not frame.text.startswith("Permissions Violation"):
                raise ConnectionError(f"server error: {frame.text}")
            # the server refused one subject and keeps the link up; so does the gateway
            log.warning("leaf link: %s", frame.text)
        return up

    def subscribe(self, subject: str) -> None:
        if subject in self._subs:
            return
        self._subs.add(subject)
        if self._writer is not None:
            self._write(self._sub_frame(subject))

    def _sub_frame(self, subject: str) -> bytes:
        if self.permissions.allows(subject):
            return proto.encode_sub(subject)
        log.warning(
            "leaf link: no permission to subscribe to %r: its messages will not reach jetlake", subject
        )
        return b""

    def unsubscribe(self, subject: str) -> None:
        if subject not in self._subs:
            return
        self._subs.discard(subject)
        if self.permissions.allows(subject):
            self._write(proto.encode_unsub(subject))

    def publish(
        self,
        subject: str,
        data: bytes = b"",
        reply: str = "",
        hdrs: bytes | None = None,
        queues: tuple[str, ...] = (),
    ) -> None:
        self._write(proto.encode_msg(subject, reply, data, hdrs, queues))

    def publish_frames(self, frames: bytes) -> None:
        """Frames already encoded (``protocol.delivery_frames``), as one queued write."""
        self._write(frames)

    def publish_many(self, frames: list[tuple[str, bytes]]) -> None:
        """Plain messages (subject, payload), e.g. a commit's PubAcks, as one queued write."""
        self._write(proto.encode_msgs(frames))

    def _write(self, data: bytes) -> None:
        """Queue a frame; the frames of one event-loop turn go out in one socket write (a write
        per message was most of the delivery path's cost)."""
        w = self._writer
        if w is None or w.is_closing():
            self.dropped_writes += 1
            return
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= FLUSH_BYTES:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._out:
            return
        data = b"".join(self._out)
        self._out.clear()
        self._out_bytes = 0
        w = self._writer
        if w is None or w.is_closing():
            self.dropped_writes += 1
            return
        w.write(data)

    def backlogged(self) -> bool:
        """Whether the socket's send buffer is above its high-water mark (senders should drain)."""
        w = self._writer
        return w is not None and w.transport.get_write_buffer_size() > HIGH_WATER

    async def drain(self) -> None:
        """Wait while the socket's send buffer is above its high-water mark."""
        if self.backlogged():
            assert self._writer is not None
            await self._writer.drain()

    async def close(self) -> None:
        self._closing = True
        self._flush()
        if self._writer is not None:
            with contextlib.suppress(ConnectionError, OSError):
                await self._writer.drain()
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
