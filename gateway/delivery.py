"""Pull delivery and acks: waiting requests served from the stream, status messages, the consumer
timer (expiry, idle heartbeats, redelivery) and the ``$JS.ACK`` path.

One delivery task per consumer at most, owned by the gateway's :class:`~gateway.tasks.TaskOwner`;
cold reads run on the executor so the event loop never waits on parquet.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor

from gateway import acks
from gateway.ack_recorder import AckRecorder
from gateway.consumer import Consumer, PullRequest, Status
from gateway.headers import status_block
from gateway.leaf import LeafConnection
from gateway.pull import IDLE_HEARTBEAT, NO_MESSAGES, parse_pull_request, timeout_status
from gateway.registry import Registry
from gateway.stream import Stream
from gateway.tasks import TaskOwner
from gateway.timefmt import now_ns
from storage_delta import acklog as al
from storage_delta.reader import MessageReader
from storage_delta.writer import StoredMessage

TICK_S = 0.05


class Delivery:
    def __init__(
        self,
        registry: Registry,
        leaf: LeafConnection,
        reader: MessageReader,
        executor: Executor,
        tasks: TaskOwner,
        recorder: AckRecorder,
    ) -> None:
        self.registry = registry
        self.recorder = recorder
        self.leaf = leaf
        self.reader = reader
        self.executor = executor
        self.tasks = tasks
        self._serving: set[tuple[str, str]] = set()

    def _consumer(self, stream: str, name: str) -> Consumer | None:
        return self.registry.consumers.get(stream, {}).get(name)

    def pull_request(self, stream: str, name: str, reply: str, body: bytes) -> None:
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

    def kick_stream(self, stream: Stream) -> None:
        for consumer in self.registry.consumers.get(stream.name, {}).values():
            if len(consumer.waiting):
                self._kick(consumer)

    def _kick(self, consumer: Consumer) -> None:
        key = (consumer.stream.name, consumer.name)
        if key in self._serving:
            return
        self._serving.add(key)
        self.tasks.own(self._serve(consumer, key), f"deliver-{key[0]}-{key[1]}")

    async def _serve(self, consumer: Consumer, key: tuple[str, str]) -> None:
        """Deliver to the waiting requests while there is work; one such task per consumer."""
        try:
            while True:
                req = consumer.waiting.peek()
                if req is None:
                    return
                if not self.recorder.has_room():
                    await self.recorder.writer.flush()  # back-pressure from the ack log
                    continue
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
                self.recorder.delivered(consumer, seq, cseq, deliveries)
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
        self.leaf.publish(status.inbox, b"", hdrs=status_block(status.code, status.text, status.headers))

    async def ticker(self) -> None:
        """Expire pull requests, send idle heartbeats, queue redeliveries whose ack wait ran out."""
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

    def on_ack(self, subject: str, reply: str, body: bytes) -> None:
        token = acks.parse_ack_subject(subject)
        kind = acks.parse_ack_body(body)
        if token is None or kind is None:
            return
        consumer = self._consumer(token.stream, token.consumer)
        if consumer is None or not self.recorder.has_room():
            # With the ack log full the ack is not taken: the message is redelivered after ack_wait.
            return
        now = now_ns()
        record, changed, extra = al.ACK, False, {}
        if kind.kind in ("ack", "term", "next"):
            changed = consumer.ack(token.seq, now)
            record = al.TERM if kind.kind == "term" else al.ACK
        elif kind.kind == "nak":
            changed, record = token.seq in consumer.pending, al.NAK
            extra = {"delay": kind.delay_ns} if kind.delay_ns else {}
            consumer.nak(token.seq)
        elif kind.kind == "wpi":
            p = consumer.pending.get(token.seq)
            changed, record = p is not None, al.WPI
            if p is not None:
                p.deadline_ns = now + int(consumer.config["ack_wait"])
        sync = bool(reply) and kind.kind != "next"
        durable = self.recorder.acked(consumer, record, token.seq, changed, sync, **extra)
        if kind.kind == "next" and reply:
            self.pull_request(token.stream, token.consumer, reply, str(kind.next_batch).encode())
        elif durable is not None:
            # An ack with a reply is answered only once its row is committed.
            durable.add_done_callback(lambda _: self.leaf.publish(reply, b""))
        if len(consumer.waiting):
            self._kick(consumer)
