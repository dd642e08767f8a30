"""The publish path: route a message to its stream, give it a sequence, hand it to the group-commit
writer, and send the PubAck only once its commit is durable."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from gateway import errors
from gateway.leaf import LeafConnection
from gateway.protocol import Msg
from gateway.registry import Registry
from gateway.stream import Stream
from gateway.timefmt import now_ns
from storage_delta.writer import GroupCommitWriter, StoredMessage, WriterClosed, WriterOverloaded

ROUTE_CACHE_SIZE = 100_000


class PublishPath:
    def __init__(
        self,
        registry: Registry,
        writer: GroupCommitWriter,
        leaf: LeafConnection,
        on_stored: Callable[[Stream], None],
    ) -> None:
        self.registry = registry
        self.writer = writer
        self.leaf = leaf
        self._on_stored = on_stored
        self._route_cache: dict[str, Stream | None] = {}
        self.received = 0  # publishes to a stream subject (the monitor reads these)
        self.failed = 0  # publishes answered with an error

    def streams_changed(self) -> None:
        """Forget cached routes: a stream was added (or its subjects changed)."""
        self._route_cache.clear()

    def route(self, subject: str) -> Stream | None:
        if subject in self._route_cache:
            return self._route_cache[subject]
        found = next((s for s in self.registry.streams.values() if s.captures(subject)), None)
        if len(self._route_cache) > ROUTE_CACHE_SIZE:
            self._route_cache.clear()
        self._route_cache[subject] = found
        return found

    def on_publish(self, msg: Msg) -> None:
        stream = self.route(msg.subject)
        if stream is None:
            return
        self.received += 1
        try:
            stored = stream.accept(msg.subject, msg.hdrs, msg.data, now_ns())
        except errors.ApiError as err:  # refused by a limit (discard new)
            self.failed += 1
            if msg.reply:
                body = {"error": err.render(), "stream": stream.name, "seq": 0}
                self.leaf.publish(msg.reply, json.dumps(body, separators=(",", ":")).encode())
            return
        try:
            fut = self.writer.submit([stored])
        except (WriterOverloaded, WriterClosed) as exc:
            stream.rollback()
            self._reply_error(msg.reply, errors.STREAM_STORE_FAILED.format(err=f"message not stored: {exc}"))
            return
        reply = msg.reply
        fut.add_done_callback(lambda f: self._committed(stream, stored, reply, f))

    def _committed(
        self, stream: Stream, stored: StoredMessage, reply: str, fut: asyncio.Future[None]
    ) -> None:
        if fut.cancelled() or fut.exception() is not None:
            self._reply_error(
                reply, errors.STREAM_STORE_FAILED.format(err=f"message not stored: {fut.exception()}")
            )
            return
        stream.committed(stored.seq)
        if reply:
            body = b'{"stream":"%s","seq":%d}' % (stream.name.encode(), stored.seq)
            self.leaf.publish(reply, body)
        self._on_stored(stream)

    def _reply_error(self, reply: str, err: errors.ApiError) -> None:
        self.failed += 1
        if reply:
            self.leaf.publish(reply, json.dumps({"error": err.render()}).encode())
