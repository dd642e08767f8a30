"""The publish path: route a message to its stream, check it (``publish_checks``), give it a
sequence, hand it to the group-commit writer, and send the PubAck only once its commit is durable.

A duplicate (``Nats-Msg-Id`` seen within the window) stores nothing; its PubAck names the original
sequence, and if the original is still in flight it waits for that commit, so no client is told of
a sequence that a failed commit could take back. ``no_ack`` streams answer nothing, errors included.
A ``Nats-TTL`` enters the stream's TTL schedule, a ``Nats-Rollup`` purges once the writer has the
message, and the delete markers expiry asks for (ADR-43) are stored here by ``marker_ticker``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from functools import partial

from gateway import errors
from gateway.durations import go_duration
from gateway.headers import status_block
from gateway.leaf import LeafConnection
from gateway.protocol import Msg
from gateway.publish_checks import Accepted, Duplicate, check_publish
from gateway.registry import Registry
from gateway.stream import Stream
from gateway.timefmt import now_ns
from storage_delta.writer import GroupCommitWriter, StoredMessage, WriterClosed, WriterOverloaded

ROUTE_CACHE_SIZE = 100_000
MARKER_TICK_S = 0.05
NO_RESPONDERS = status_block(503, "")


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
        # Commits in flight of messages that carry a msg id, for duplicates that arrive meanwhile.
        self._inflight_ids: dict[tuple[str, int], asyncio.Future[None]] = {}
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
        reply = "" if stream.config.get("no_ack") else msg.reply
        now = now_ns()
        verdict = check_publish(stream, msg.subject, msg.hdrs, msg.data, now)
        if type(verdict) is Accepted:
            self._store(stream, msg, verdict, reply, now)
        elif type(verdict) is Duplicate:
            self._duplicate(stream, verdict.seq, reply)
        elif isinstance(verdict, errors.ApiError):
            self._reply_error(reply, stream, verdict)

    def on_kv_publish(self, msg: Msg) -> None:
        """A ``$KV`` publish, which reaches the gateway through the API domain mapping whether or
        not a bucket captures it: without one, the requester gets the no-responders status the
        hub would have sent (nats-py: ``NoStreamResponseError``)."""
        if self.route(msg.subject) is None:
            if msg.reply:
                self.leaf.publish(msg.reply, b"", hdrs=NO_RESPONDERS)
            return
        self.on_publish(msg)

    def _store(self, stream: Stream, msg: Msg, verdict: Accepted, reply: str, now: int) -> None:
        try:
            stored = stream.accept(msg.subject, verdict.hdrs, msg.data, now)
        except errors.ApiError as err:  # refused by a limit (discard new)
            self._reply_error(reply, stream, err)
            return
        stream.dedup.record(verdict.msg_id, stored.seq, stored.ts, now, stream.config["duplicate_window"])
        if verdict.ttl:
            stream.ttl.add(stored.seq, stored.ts, verdict.ttl)
        if verdict.is_marker:
            stream.ttl.markers.add(stored.seq)
        fut = self._submit(stream, stored, reply)
        if fut is None:
            return
        if verdict.rollup:  # keeps only this message of its subject (sub) or of the stream (all)
            stream.purge(subject=msg.subject if verdict.rollup == "sub" else None, keep=1)
        if verdict.msg_id:
            key = (stream.name, stored.seq)
            self._inflight_ids[key] = fut
            fut.add_done_callback(lambda _: self._inflight_ids.pop(key, None))
        fut.add_done_callback(lambda f: self._committed(stream, stored, reply, f))

    def _submit(self, stream: Stream, stored: StoredMessage, reply: str) -> asyncio.Future[None] | None:
        try:
            return self.writer.submit([stored])
        except (WriterOverloaded, WriterClosed) as exc:
            stream.rollback()
            self._reply_error(
                reply, stream, errors.STREAM_STORE_FAILED.format(err=f"message not stored: {exc}")
            )
            return None

    def place_markers(self, stream: Stream, now: int) -> None:
        """Store the delete markers (ADR-43) for subjects whose last message MaxAge or a TTL removed:
        an empty message with ``Nats-Marker-Reason: MaxAge``, the marker TTL and ``Nats-Rollup: sub``,
        itself removed once that TTL runs out."""
        marker_ns = int(stream.config.get("subject_delete_marker_ttl") or 0)
        hdrs = (
            b"NATS/1.0\r\nNats-Marker-Reason: MaxAge\r\nNats-TTL: %s\r\nNats-Rollup: sub\r\n\r\n"
            % go_duration(marker_ns).encode()
        )
        subjects, stream.markers_due = stream.markers_due, []
        for subject in subjects:
            try:
                stored = stream.accept(subject, hdrs, b"", now)
            except errors.ApiError:  # a full discard-new stream has no room for it either
                continue
            stream.ttl.add(stored.seq, stored.ts, marker_ns // 1_000_000_000)
            stream.ttl.markers.add(stored.seq)
            fut = self._submit(stream, stored, "")
            if fut is not None:
                fut.add_done_callback(partial(self._committed, stream, stored, ""))

    async def marker_ticker(self) -> None:
        """Place the markers that expiry (on the removal task's tick) asked for."""
        while True:
            await asyncio.sleep(MARKER_TICK_S)
            now = now_ns()
            for stream in list(self.registry.streams.values()):
                if stream.markers_due:
                    self.place_markers(stream, now)

    def _duplicate(self, stream: Stream, seq: int, reply: str) -> None:
        if not reply:
            return
        body = b'{"stream":"%s","seq":%d,"duplicate": true}' % (stream.name.encode(), seq)
        original = self._inflight_ids.get((stream.name, seq))
        if original is None or original.done():
            self.leaf.publish(reply, body)
            return

        def answer(f: asyncio.Future[None]) -> None:
            if f.cancelled() or f.exception() is not None:
                self._reply_error(reply, stream, _store_failed(f))
            else:
                self.leaf.publish(reply, body)

        original.add_done_callback(answer)

    def _committed(
        self, stream: Stream, stored: StoredMessage, reply: str, fut: asyncio.Future[None]
    ) -> None:
        if fut.cancelled() or fut.exception() is not None:
            self._reply_error(reply, stream, _store_failed(fut))
            return
        stream.committed(stored.seq)
        if reply:
            body = b'{"stream":"%s","seq":%d}' % (stream.name.encode(), stored.seq)
            self.leaf.publish(reply, body)
        self._on_stored(stream)

    def _reply_error(self, reply: str, stream: Stream, err: errors.ApiError) -> None:
        """An error PubAck as JetStream sends it: the error, the stream's name and sequence 0."""
        self.failed += 1
        if reply:
            body = {"error": err.render(), "stream": stream.name, "seq": 0}
            self.leaf.publish(reply, json.dumps(body, separators=(",", ":")).encode())


def _store_failed(fut: asyncio.Future[None]) -> errors.ApiError:
    exc = None if fut.cancelled() else fut.exception()
    return errors.STREAM_STORE_FAILED.format(err=f"message not stored: {exc}")
