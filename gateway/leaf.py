"""The gateway's leaf-node connection to nats-server: handshake, reader, interest, reconnect.

A leaf link (not a client connection) is what lets a delivery reach a client's inbox under the
message's stored subject (reply ``$JS.ACK…@<stored subject>``) and what tells the gateway about
every subscription on the server (``LS+``/``LS-``), see docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from gateway import protocol as proto
from gateway.subjects import subject_matches

log = logging.getLogger(__name__)

HIGH_WATER = 8 * 1024 * 1024


@dataclass(frozen=True)
class LeafTarget:
    host: str
    port: int
    user: str | None = None
    password: str | None = None
    token: str | None = None
    tls: bool = False
    creds_file: str | None = None

    @classmethod
    def parse(cls, url: str, creds_file: str | None = None) -> LeafTarget:
        u = urlparse(url if "://" in url else f"nats-leaf://{url}")
        user = unquote(u.username) if u.username else None
        password = unquote(u.password) if u.password else None
        token = None
        if user and password is None:
            token, user = user, None
        return cls(
            host=u.hostname or "127.0.0.1",
            port=u.port or 7422,
            user=user,
            password=password,
            token=token,
            tls=u.scheme in ("tls", "nats-leaf+tls", "wss"),
            creds_file=creds_file,
        )


class Interest:
    """Which subjects have subscribers on the server side, as ``LS+``/``LS-`` reported them."""

    def __init__(self) -> None:
        self._literal: dict[str, int] = {}
        self._wild: dict[str, int] = {}

    def add(self, subject: str) -> None:
        bucket = self._wild if ("*" in subject or ">" in subject) else self._literal
        bucket[subject] = bucket.get(subject, 0) + 1

    def remove(self, subject: str) -> None:
        bucket = self._wild if ("*" in subject or ">" in subject) else self._literal
        n = bucket.get(subject, 0) - 1
        if n > 0:
            bucket[subject] = n
        else:
            bucket.pop(subject, None)

    def clear(self) -> None:
        self._literal.clear()
        self._wild.clear()

    def has(self, subject: str) -> bool:
        if subject in self._literal:
            return True
        return any(subject_matches(w, subject) for w in self._wild)


class LeafConnection:
    """One leaf link; ``run`` keeps it up (reconnecting) until ``close``."""

    def __init__(
        self,
        target: LeafTarget,
        name: str,
        on_msg: Callable[[proto.Msg], None],
        on_connected: Callable[[dict[str, object]], None] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.target = target
        self.name = name
        self._on_msg = on_msg
        self._on_connected = on_connected
        self._ssl = ssl_context
        self._subs: set[str] = set()
        self.interest = Interest()
        self._writer: asyncio.StreamWriter | None = None
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._task: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        self._closing = False
        self.server_info: dict[str, object] = {}
        self.reconnects = 0
        self.dropped_writes = 0

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def start(self, wait_s: float = 10.0) -> None:
        self._task = asyncio.create_task(self._run(), name="leaf-connection")
        await asyncio.wait_for(self._connected.wait(), wait_s)

    async def _run(self) -> None:
        delay = 0.05
        while not self._closing:
            try:
                await self._session()
                delay = 0.05
            except asyncio.CancelledError:
                raise
            except (OSError, proto.ProtocolError, asyncio.IncompleteReadError, ConnectionError) as exc:
                log.warning("leaf connection lost: %s", exc)
            self._connected.clear()
            self._writer = None
            self._out = []
            self.interest.clear()
            if self._closing:
                return
            self.reconnects += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _session(self) -> None:
        t = self.target
        ctx = self._ssl or (ssl.create_default_context() if t.tls else None)
        reader, writer = await asyncio.open_connection(t.host, t.port, ssl=ctx, limit=1 << 20)
        try:
            parser = proto.FrameParser()
            line = await reader.readline()
            frames = parser.feed(line)
            info = next((f for f in frames if isinstance(f, proto.Info)), None)
            if info is None:
                raise proto.ProtocolError("no INFO from server")
            self.server_info = info.body
            opts: dict[str, object] = {
                "name": self.name,
                "headers": True,
                "protocol": 1,
                "verbose": False,
                "pedantic": False,
            }
            if t.user:
                opts["user"], opts["pass"] = t.user, t.password or ""
            if t.token:
                opts["auth_token"] = t.token
            if t.creds_file:
                opts.update(_creds_auth(t.creds_file, str(info.body.get("nonce", ""))))
            out = [proto.encode_connect(opts), b"PING\r\n"]
            out += [proto.encode_sub(s) for s in sorted(self._subs)]
            writer.write(b"".join(out))
            await writer.drain()
            self._writer = writer
            got_pong = False
            while True:
                data = await reader.read(1 << 20)
                if not data:
                    raise ConnectionError("server closed the connection")
                for frame in parser.feed(data):
                    if isinstance(frame, proto.Msg):
                        self._on_msg(frame)
                    elif isinstance(frame, proto.Interest):
                        if frame.added:
                            self.interest.add(frame.subject)
                        else:
                            self.interest.remove(frame.subject)
                    elif isinstance(frame, proto.Ping):
                        writer.write(b"PONG\r\n")
                    elif isinstance(frame, proto.Pong) and not got_pong:
                        got_pong = True
                        self._connected.set()
                        if self._on_connected:
                            self._on_connected(self.server_info)
                    elif isinstance(frame, proto.ServerError):
                        raise ConnectionError(f"server error: {frame.text}")
        finally:
            self._connected.clear()
            writer.close()

    def subscribe(self, subject: str) -> None:
        if subject in self._subs:
            return
        self._subs.add(subject)
        self._write(proto.encode_sub(subject))

    def unsubscribe(self, subject: str) -> None:
        if subject not in self._subs:
            return
        self._subs.discard(subject)
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

    def _write(self, data: bytes) -> None:
        """Queue bytes for the socket; everything written during one turn of the event loop leaves
        in one ``send`` (a commit answers thousands of publishes at once: one syscall, not one per
        PubAck)."""
        w = self._writer
        if w is None or w.is_closing():
            self.dropped_writes += 1
            return
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        w = self._writer
        if w is None or w.is_closing():
            self.dropped_writes += len(out)
            return
        w.write(b"".join(out))

    async def drain(self) -> None:
        """Wait while the socket's send buffer is above its high-water mark."""
        self._flush()
        w = self._writer
        if w is not None and w.transport.get_write_buffer_size() > HIGH_WATER:
            await w.drain()

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


def _creds_auth(path: str, nonce: str) -> dict[str, object]:
    """JWT and nonce signature from a ``.creds`` file (needs ``nkeys``, which nats-py brings)."""
    import nkeys  # type: ignore[import-not-found]

    text = Path(path).read_text()
    blocks = [b.strip() for b in text.split("-----") if b.strip() and "BEGIN" not in b and "END" not in b]
    jwt, seed = blocks[0], blocks[1]
    kp = nkeys.from_seed(seed.encode())
    import base64

    sig = base64.urlsafe_b64encode(kp.sign(nonce.encode())).decode().rstrip("=")
    return {"jwt": jwt, "sig": sig}
