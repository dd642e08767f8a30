"""The gateway: the leaf link, the publish path, the API worker and pull delivery, wired together.

Owns every background task (API worker, commit loop, consumer timer, per-consumer delivery) and
cancels and awaits them on ``close``. Blocking work (delta-rs, parquet) runs on ``executor``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gateway import acks, errors
from gateway.api import Api, split_api_subject
from gateway.consumer import Consumer, PullRequest, Status
from gateway.headers import status_block
from gateway.leaf import LeafConnection, LeafTarget
from gateway.protocol import Msg
from gateway.pull import IDLE_HEARTBEAT, NO_MESSAGES, parse_pull_request, timeout_status
from gateway.registry import Registry
from gateway.settings import Settings
from gateway.stream import Stream
from gateway.timefmt import now_ns
from storage_delta.catalog import CatalogTable
from storage_delta.reader import MessageReader
from storage_delta.tables import StoreRoot
from storage_delta.writer import (
    GroupCommitWriter,
    MessageTable,
    StoredMessage,
    WriterClosed,
    WriterOverloaded,
)

log = logging.getLogger(__name__)

API_QUEUE_SIZE = 4096
TICK_S = 0.05


class Gateway:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.root = StoreRoot(settings.data_root, settings.storage_options or None)
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="jetlake-io")
        self.api_prefix = f"$JS.{settings.domain}.API."
        self._api_queue: asyncio.Queue[tuple[list[str], str, bytes]] = asyncio.Queue(API_QUEUE_SIZE)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._serving: set[tuple[str, str]] = set()
        self._route_cache: dict[str, Stream | None] = {}
        self.leaf: LeafConnection | None = None
        self.writer: GroupCommitWriter | None = None
        self.registry: Registry | None = None
        self.reader = MessageReader(self.root)
        self.api_dropped = 0
        self.started = False

    # ---- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        table, catalog = await loop.run_in_executor(
            self.executor, lambda: (MessageTable(self.root), CatalogTable(self.root))
        )
        self.registry = Registry(catalog, self.executor, self.settings.tail_cache_bytes, self._stream_added)
        await self._recover(catalog)
        self.writer = GroupCommitWriter(
            table, self.executor, self.settings.max_pending_bytes, self._commit_failed
        )
        await self.writer.start()
        self.leaf = LeafConnection(
            LeafTarget.parse(self.settings.nats_url, self.settings.creds_file),
            name=self.settings.leaf_name,
            on_msg=self._on_msg,
            on_connected=self._on_connected,
        )
        self.leaf.subscribe(self.api_prefix + ">")
        self.leaf.subscribe("$JS.ACK.>")
        for stream in self.registry.streams.values():
            for subject in stream.subjects:
                self.leaf.subscribe(subject)
        self._own(self._api_worker(), "api-worker")
        self._own(self._ticker(), "consumer-timer")
        await self.leaf.start()
        self.started = True

    async def _recover(self, catalog: CatalogTable) -> None:
        """Rebuild streams and consumers from the catalog, and stream state from the messages table."""
        assert self.registry is not None
        loop = asyncio.get_running_loop()
        entries = await loop.run_in_executor(self.executor, catalog.load)
        for entry in entries:
            if entry.kind == "stream":
                stream = self.registry.install_stream(entry.body["config"], int(entry.body["created"]))
                rows = await loop.run_in_executor(self.executor, self.reader.scan_index, stream.name)
                for seq, ts, subject, size in rows:
                    stream.restore(seq, ts, subject, size)
            elif entry.kind == "consumer" and entry.stream in self.registry.streams:
                self.registry.install_consumer(
                    self.registry.streams[entry.stream], entry.body["config"], int(entry.body["created"])
                )

    def _on_connected(self, info: dict[str, object]) -> None:
        if self.registry is not None and info.get("version"):
            self.registry.server_version = str(info["version"])

    def _own(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        """Stop taking work, finish the commit in flight and answer what is owed, then stop."""
        if self.leaf is not None:
            for stream in self.registry.streams.values() if self.registry else []:
                for subject in stream.subjects:
                    self.leaf.unsubscribe(subject)
        if self.writer is not None:
            await self.writer.close()
        await asyncio.sleep(0)  # let the PubAck callbacks of the last commit write
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.leaf is not None:
            await self.leaf.close()
        self.executor.shutdown(wait=True)

    # ---- inbound ----------------------------------------------------------------------------

    def _on_msg(self, msg: Msg) -> None:
        subject = msg.subject
        if subject.startswith(self.api_prefix):
            toks = split_api_subject(subject, self.api_prefix) or []
            if toks[:3] == ["CONSUMER", "MSG", "NEXT"] and len(toks) == 5:
                self._pull_request(toks[3], toks[4], msg.reply, msg.data)
                return
            try:
                self._api_queue.put_nowait((toks, msg.reply, msg.data))
            except asyncio.QueueFull:
                self.api_dropped += 1
            return
        if subject.startswith("$JS.ACK."):
            self._on_ack(subject, msg.reply, msg.data)
            return
        self._on_publish(msg)

    async def _api_worker(self) -> None:
        assert self.registry is not None
        assert self.leaf is not None
        api = Api(self.registry)
        while True:
            toks, reply, body = await self._api_queue.get()
            try:
                answer = await api.handle(toks, body)
            except Exception:
                log.exception("API request %s failed", ".".join(toks))
                continue
            if answer is None:
                continue
            self.registry.api_total += 1
            if "error" in answer:
                self.registry.api_errors += 1
            if reply:
                self.leaf.publish(reply, json.dumps(answer, separators=(",", ":")).encode())

    # ---- publish path -----------------------------------------------------------------------

    def _stream_added(self, stream: Stream) -> None:
        self._route_cache.clear()
        if self.leaf is not None:
            for subject in stream.subjects:
                self.leaf.subscribe(subject)

    def _route(self, subject: str) -> Stream | None:
        if subject in self._route_cache:
            return self._route_cache[subject]
        assert self.registry is not None
        found = next((s for s in self.registry.streams.values() if s.captures(subject)), None)
        if len(self._route_cache) > 100_000:
            self._route_cache.clear()
        self._route_cache[subject] = found
        return found

    def _on_publish(self, msg: Msg) -> None:
        stream = self._route(msg.subject)
        if stream is None or self.writer is None or self.leaf is None:
            return
        stored = stream.accept(msg.subject, msg.hdrs, msg.data, now_ns())
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
        assert self.leaf is not None
        if fut.cancelled() or fut.exception() is not None:
            self._reply_error(
                reply, errors.STREAM_STORE_FAILED.format(err=f"message not stored: {fut.exception()}")
            )
            return
        stream.committed(stored.seq)
        if reply:
            body = b'{"stream":"%s","seq":%d}' % (stream.name.encode(), stored.seq)
            self.leaf.publish(reply, body)
        self._kick_stream(stream)

    def _commit_failed(self, stream_names: set[str]) -> None:
        assert self.registry is not None
        for name in stream_names:
            stream = self.registry.streams.get(name)
            if stream is not None:
                stream.rollback()

    def _reply_error(self, reply: str, err: errors.ApiError) -> None:
        if reply and self.leaf is not None:
            self.leaf.publish(reply, json.dumps({"error": err.render()}).encode())

    # ---- pull delivery ----------------------------------------------------------------------

    def _consumer(self, stream: str, name: str) -> Consumer | None:
        assert self.registry is not None
        return self.registry.consumers.get(stream, {}).get(name)

    def _pull_request(self, stream: str, name: str, reply: str, body: bytes) -> None:
        consumer = self._consumer(stream, name)
        if consumer is None or not reply:
            return
        now = now_ns()
        req = parse_pull_request(reply, body, now)
        if isinstance(req, Status):
            self._send_status(req)
            return
        if consumer.config.get("deliver_subject"):
            self._send_status(Status(reply, 409, "Consumer is push based"))
            return
        if consumer.waiting.full():
            self._send_status(Status(reply, 409, "Exceeded MaxWaiting"))
            return
        if req.no_wait and not req.expires_at_ns and not consumer.has_work():
            self._send_status(Status(reply, *NO_MESSAGES))
            return
        consumer.waiting.push(req)
        self._kick(consumer)

    def _kick_stream(self, stream: Stream) -> None:
        assert self.registry is not None
        for consumer in self.registry.consumers.get(stream.name, {}).values():
            if len(consumer.waiting):
                self._kick(consumer)

    def _kick(self, consumer: Consumer) -> None:
        key = (consumer.stream.name, consumer.name)
        if key in self._serving:
            return
        self._serving.add(key)
        self._own(self._serve(consumer, key), f"deliver-{key[0]}-{key[1]}")

    async def _serve(self, consumer: Consumer, key: tuple[str, str]) -> None:
        """Deliver to the waiting requests while there is work; one such task per consumer."""
        assert self.leaf is not None
        try:
            while True:
                req = consumer.waiting.peek()
                if req is None:
                    return
                now = now_ns()
                nxt = consumer.next_delivery(now)
                if nxt is None:
                    if req.no_wait and not req.expires_at_ns:
                        consumer.waiting.pop()
                        self._send_status(
                            Status(req.reply, *NO_MESSAGES) if not req.delivered else timeout_status(req)
                        )
                        continue
                    return
                seq, cseq, deliveries = nxt
                msg = await self._load(consumer.stream, seq)
                if msg is None:
                    continue
                pending = consumer.num_pending()
                token = acks.ack_subject(
                    consumer.stream.name, consumer.name, deliveries, seq, cseq, msg.ts, pending
                )
                self.leaf.publish(req.reply, msg.data, reply=f"{token}@{msg.subject}", hdrs=msg.hdrs)
                req.delivered += 1
                req.bytes_sent += len(msg.data) + len(msg.subject) + (len(msg.hdrs) if msg.hdrs else 0)
                if req.heartbeat_ns:
                    req.next_heartbeat_ns = now + req.heartbeat_ns
                if req.delivered >= req.batch:
                    consumer.waiting.pop()
                await self.leaf.drain()
        finally:
            self._serving.discard(key)

    async def _load(self, stream: Stream, seq: int) -> StoredMessage | None:
        cached = stream.tail.get(seq)
        if cached is not None:
            return cached
        loop = asyncio.get_running_loop()
        table = await loop.run_in_executor(
            self.executor, self.reader.read_range, stream.name, seq, seq, stream.block_size
        )
        if table.num_rows == 0:
            return None
        row = table.slice(0, 1).to_pylist()[0]
        return StoredMessage(
            stream.name, stream.block_size, row["seq"], row["ts"], row["subject"], row["hdrs"], row["data"]
        )

    def _send_status(self, status: Status) -> None:
        if self.leaf is not None:
            self.leaf.publish(status.inbox, b"", hdrs=status_block(status.code, status.text, status.headers))

    async def _ticker(self) -> None:
        """Expire pull requests, send idle heartbeats, queue redeliveries whose ack wait ran out."""
        assert self.registry is not None
        while True:
            await asyncio.sleep(TICK_S)
            now = now_ns()
            for by_name in self.registry.consumers.values():
                for consumer in by_name.values():
                    for req in consumer.waiting.expire(now):
                        self._send_status(timeout_status(req))
                    for req in consumer.waiting:
                        if req.heartbeat_ns and req.next_heartbeat_ns <= now:
                            req.next_heartbeat_ns = now + req.heartbeat_ns
                            self._heartbeat(consumer, req)
                    if consumer.due_redeliveries(now) and len(consumer.waiting):
                        self._kick(consumer)

    def _heartbeat(self, consumer: Consumer, req: PullRequest) -> None:
        self._send_status(
            Status(
                req.reply,
                *IDLE_HEARTBEAT,
                {"Nats-Last-Consumer": str(consumer.dseq), "Nats-Last-Stream": str(consumer.sseq)},
            )
        )

    # ---- acks -------------------------------------------------------------------------------

    def _on_ack(self, subject: str, reply: str, body: bytes) -> None:
        token = acks.parse_ack_subject(subject)
        kind = acks.parse_ack_body(body)
        if token is None or kind is None:
            return
        consumer = self._consumer(token.stream, token.consumer)
        if consumer is None:
            return
        now = now_ns()
        if kind.kind in ("ack", "term", "next"):
            consumer.ack(token.seq, now)
        elif kind.kind == "nak":
            consumer.nak(token.seq)
        elif kind.kind == "wpi":
            p = consumer.pending.get(token.seq)
            if p is not None:
                p.deadline_ns = now + int(consumer.config["ack_wait"])
        if kind.kind == "next" and reply:
            self._pull_request(token.stream, token.consumer, reply, str(kind.next_batch).encode())
        elif reply and self.leaf is not None:
            self.leaf.publish(reply, b"")
        if len(consumer.waiting):
            self._kick(consumer)
