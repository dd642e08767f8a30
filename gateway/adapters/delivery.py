"""Delivery: the thin async adapter around the consumer state machines.

It serves pull requests and push deliver subjects from the stream, sends the status messages,
runs the consumer timers (request expiry, idle heartbeats, ack-wait redelivery, interest and
inactivity) and takes the ``$JS.ACK`` path. The timers fire when something is due: each consumer
has one deadline (``gateway.runtime.timers``), the earliest of what it waits for, set after each of
its timer runs and brought forward by whatever adds an earlier one (a pull request, a delivery's ack
wait, a nak delay or ``+WPI``, a config change); interest changes (``LS+``/``LS-``) make every
consumer look again, at most once per ``SWEEP_NS``. An idle gateway does not wake.

One serve task per consumer at most, owned by the gateway's :class:`~gateway.tasks.TaskOwner`;
cold reads run on the executor so the event loop never waits on parquet. Interest comes from the
leaf's view of the server's subscriptions (``LS+``/``LS-``), as JetStream itself decides whether a
deliver subject or an inbox listens.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from functools import partial
from itertools import groupby
from operator import itemgetter
from typing import Any

from gateway.adapters.ack_recorder import AckRecorder
from gateway.adapters.coldread import ColdReader
from gateway.adapters.registry import Registry
from gateway.api.pull import (
    CONSUMER_DELETED,
    NO_MESSAGES,
    NO_RESPONDERS,
    PullRequest,
    Status,
    no_consumer,
    timeout_status,
    too_big_status,
)
from gateway.api.timefmt import now_ns
from gateway.engine import consumer_effects as ce
from gateway.engine import priority, retention
from gateway.engine.consumer import Consumer, Delivered
from gateway.engine.flow_control import FlowControl
from gateway.engine.stream import Stream
from gateway.runtime.tasks import TaskOwner
from gateway.runtime.timers import Timers
from gateway.wire import acks
from gateway.wire.leaf import LeafConnection
from gateway.wire.protocol import delivery_frames
from storage_delta.commit.writer import StoredMessage
from storage_delta.format.nats import no_responders, parse_headers, status_block

log = logging.getLogger(__name__)

FLOW_CONTROL_REQUEST = (100, "FlowControl Request")
NS = 1_000_000_000
#: Interest changes make every consumer look again (lost requesters, push subscribers that came or
#: went) at most this often: as often as the fixed tick did, however fast subscriptions churn.
SWEEP_NS = 50_000_000
#: A consumer's timer never fires sooner than this after its last run (against a deadline that
#: would stay due and spin), nor does a delivery task that failed get retried sooner.
MIN_STEP_NS = 1_000_000
RETRY_NS = SWEEP_NS
RATE_BURST_BYTES = 1 << 20  # what a rate-limited push consumer may send at once
RUN = 256  # deliveries made in one go at most, between checks of the link's send buffer
RUN_BYTES = 1 << 20  # and their payload bytes at most (a larger message goes alone)


class TokenBucket:
    """``rate_limit_bps`` as a token bucket in bytes: a burst at once, then the average rate."""

    def __init__(self, rate: float, capacity: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self.tokens = capacity
        self.at = 0.0

    def take(self, size: int, now: float) -> float:
        """Spend ``size`` bytes; the seconds to wait before sending them."""
        if self.at:
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= size
        return max(0.0, -self.tokens / self.rate)


def _served(consumer: Consumer, req: PullRequest, count: int, size: int, now: int) -> None:
    """A pull request got ``count`` more messages of ``size`` bytes: its idle heartbeat starts
    over, and it leaves the queue once its batch is complete."""
    req.delivered += count
    req.bytes_sent += size
    if req.heartbeat_ns:
        req.next_heartbeat_ns = now + req.heartbeat_ns
    if req.delivered >= req.batch:
        consumer.waiting.finish(req)
    elif priority.take_turns(consumer):
        consumer.waiting.requeue(req)


class Delivery:
    def __init__(
        self,
        registry: Registry,
        leaf: LeafConnection,
        cold: ColdReader,
        tasks: TaskOwner,
        delete_consumer: Callable[[Consumer], Coroutine[Any, Any, None]],
        recorder: AckRecorder,
        publish_event: Callable[[tuple[str, bytes]], None],
    ) -> None:
        self.recorder = recorder
        self.publish_event = publish_event  # advisories, as the service words them
        self.registry = registry
        self.leaf = leaf
        self.cold = cold
        self.tasks = tasks
        self.delete_consumer = delete_consumer
        self._serving: set[int] = set()
        self._replay_ts: dict[int, int] = {}  # replay original: stored time of the previous message
        self._buckets: dict[int, TokenBucket] = {}  # rate_limit_bps
        self._flow: dict[int, FlowControl] = {}  # push consumers with flow_control
        self._swept: dict[tuple[str, int], int] = {}  # interest streams: sequences checked
        #: One deadline per consumer, and ``None``: the sweep after interest changed. Exists while
        #: ``ticker`` runs.
        self._timers: Timers[Consumer | None] | None = None
        self._last_sweep = 0
        #: Plain acks of the current read of the leaf link (``protocol.AckRun``), not applied yet.
        self.queued_acks: list[tuple[bytes, bytes, bytes, bytes]] = []

    def _consumer(self, stream: str, name: str) -> Consumer | None:
        return self.registry.consumers.get(stream, {}).get(name)

    # ---- pull requests ------------------------------------------------------------------------

    def pull_request(
        self, stream: str, name: str, reply: str, body: bytes, hdrs: bytes | None = None
    ) -> None:
        consumer = self._consumer(stream, name)
        if not reply or self.registry.quarantine.reason(stream) is not None:
            return  # an offline stream's pulls time out, as on the server
        if consumer is None:
            self._send_status(no_consumer(reply, stream, name))
            return
        self._carry_out(consumer, ce.pull_request(consumer, reply, body, hdrs, now_ns()))

    def consumer_gone(self, consumer: Consumer) -> None:
        """The consumer was deleted: its waiting requests hear ``409 Consumer Deleted``."""
        for req in consumer.waiting.clear():
            self._send_status(Status(req.reply, *CONSUMER_DELETED))
        for table in (self._replay_ts, self._buckets, self._flow):
            table.pop(id(consumer), None)
        if self._timers is not None:
            self._timers.cancel(consumer)

    # ---- serving ------------------------------------------------------------------------------

    def kick_stream(self, stream: Stream) -> None:
        """New messages are stored: interest streams drop what nobody wants, consumers serve."""
        consumers = self.registry.consumers.get(stream.name, {})
        key = (stream.name, stream.created_ns)
        swept = self._swept.get(key, stream.state.first_seq - 1)
        if swept < stream.durable_last_seq:
            retention.sweep_unwanted(stream, consumers.values(), swept + 1, stream.durable_last_seq)
            self._swept[key] = stream.durable_last_seq
        for consumer in consumers.values():
            if len(consumer.waiting) or consumer.is_push:
                self.kick(consumer)

    def kick(self, consumer: Consumer) -> None:
        key = id(consumer)
        if key in self._serving:
            return
        self._serving.add(key)
        task = self.tasks.own(self._serve(consumer, key), f"deliver-{consumer.stream.name}-{consumer.name}")
        task.add_done_callback(partial(self._served_out, consumer))

    def _served_out(self, consumer: Consumer, task: asyncio.Task[None]) -> None:
        """A delivery task ended. If its consumer stopped listening meanwhile (its last request
        was served), inactivity counts from now. A task that failed is logged and its consumer's
        timer retries it (as the fixed tick used to)."""
        if task.cancelled() or self._consumer(consumer.stream.name, consumer.name) is not consumer:
            return
        exc = task.exception()
        now = now_ns()
        listening = ce.observe(consumer, self.leaf.interest, now)
        if exc is not None:
            log.error("delivery for %s/%s failed", consumer.stream.name, consumer.name, exc_info=exc)
        if self._timers is None:
            return
        if exc is not None:
            self._timers.earlier(consumer, now + RETRY_NS)
        threshold = consumer.config.inactive_threshold
        if threshold and not listening:
            self._timers.earlier(consumer, (consumer.watch.last_seen_ns or now) + threshold + 1)

    def _target(self, consumer: Consumer, now: int) -> tuple[str, PullRequest | None] | None:
        """Where the next message goes: the oldest waiting pull request that has time left (or the
        one its priority policy picks), or a push consumer's deliver subject while it is bound to
        a subscriber."""
        if consumer.is_push:
            subject = consumer.config.deliver_subject
            flow = self._flow.get(id(consumer))
            if flow is not None and flow.stalled():
                return None  # until the subscriber answers the flow-control request
            return (subject, None) if ce.push_bound(consumer, self.leaf.interest) else None
        for expired in consumer.waiting.expire_head(now):
            self._send_status(timeout_status(expired))
        req, effects = ce.choose_request(consumer, now)
        self._carry_out(consumer, effects)
        return (req.reply, req) if req is not None else None

    async def _serve(self, consumer: Consumer, key: int) -> None:
        """Deliver while there is a target and work; one such task per consumer."""
        try:
            while self._consumer(consumer.stream.name, consumer.name) is consumer:
                now = now_ns()
                target = self._target(consumer, now)
                if target is None or consumer.paused(now):
                    return
                inbox, req = target
                if not (self._runs(consumer, req) and self._serve_run(consumer, inbox, req, now)):
                    # one at a time: paced, sized, flow-controlled or not in memory
                    seq = consumer.next_seq()
                    if seq is None:
                        # no_wait ends with 404 once it ran dry; with expires, an empty start waits
                        if req is not None and req.no_wait and (req.delivered or not req.expires_at_ns):
                            consumer.waiting.finish(req)
                            self._send_status(Status(req.reply, *NO_MESSAGES))
                            continue
                        return
                    msg = consumer.stream.tail.get(seq) or await self._read_cold(consumer, seq)
                    if msg is None or (req is not None and self._request_over(consumer, req, msg)):
                        continue
                    cfg = consumer.config
                    if consumer.is_push and (cfg.replay_policy == "original" or cfg.rate_limit_bps):
                        await self._pace(consumer, key, msg)
                    if not self.recorder.has_room():
                        await self.recorder.writer.flush()  # back-pressure from the ack log
                        continue
                    done = consumer.deliver(seq, now_ns())
                    if done is None:
                        continue
                    self._delivered(consumer, [done])
                    size = self._send(consumer, inbox, msg, done)
                    if req is not None:
                        _served(consumer, req, 1, size, now_ns())
                if self.leaf.backlogged():
                    await self.leaf.drain()
        finally:
            self._serving.discard(key)

    async def _read_cold(self, consumer: Consumer, seq: int) -> StoredMessage | None:
        """A message the tail cache no longer holds; None when it is gone from the stream too,
        and then the consumer passes it (and the ack log lets it go, if it was pending)."""
        msg = await self.cold.read(consumer.stream, seq)
        if msg is None:
            was_pending = seq in consumer.pending
            consumer.passed(seq)
            if was_pending:
                self.recorder.dropped(consumer, seq)
        return msg

    def _request_over(self, consumer: Consumer, req: PullRequest, msg: StoredMessage) -> bool:
        """Whether the pull request takes no more: it expired or went away while the message was
        read, or the message would overrun its ``max_bytes`` (then it ends with a 409)."""
        if not consumer.waiting.holds(req):
            return True
        if req.max_bytes and _size(msg, consumer) > req.max_bytes - req.bytes_sent:
            priority.too_big(consumer, req)
            consumer.waiting.finish(req)
            self._send_status(too_big_status(req))
            return True
        return False

    @staticmethod
    def _runs(consumer: Consumer, req: PullRequest | None) -> bool:
        """Whether deliveries may go out as runs: nothing is paced, sized against a request's
        ``max_bytes``, served only while enough is pending (overflow), taking turns with others
        (prioritized) or counted for flow control per message."""
        if req is not None:
            return not (req.max_bytes or priority.gated(req) or priority.take_turns(consumer))
        cfg = consumer.config
        paced = cfg.rate_limit_bps or cfg.replay_policy == "original"
        return not (paced or cfg.flow_control)

    def _serve_run(self, consumer: Consumer, inbox: str, req: PullRequest | None, now: int) -> bool:
        """Deliver what the tail cache (or a cold read already done) holds of the next messages, up
        to a request's batch and the ack log's room, in one state-machine call, one log append and
        one write; False when there was nothing to deliver that way."""
        limit = min(req.batch - req.delivered if req is not None else RUN, self.recorder.room(), RUN)
        stream, tail, cold = consumer.stream, consumer.stream.tail.get, self.cold.held
        budget = RUN_BYTES

        def held(seq: int) -> StoredMessage | None:
            """The message if it is in memory and the run's bytes allow it (the link's send
            buffer is checked between runs)."""
            nonlocal budget
            msg = tail(seq) or cold(stream, seq)
            if msg is None or budget < len(msg.data):
                return None
            budget -= len(msg.data)
            return msg

        run = consumer.deliver_run(limit, now, held)
        if not run:
            return False
        self._delivered(consumer, [d for _, d in run])
        size = self._send_run(consumer, inbox, run)
        if req is not None:
            _served(consumer, req, len(run), size, now)
        return True

    def _delivered(self, consumer: Consumer, done: list[Delivered]) -> None:
        """Deliveries made: their ack-log rows; a consumer that takes no acks (ack none) is done
        with a message once delivered, so interest retention may let it go, as on the server."""
        self.recorder.delivered_run(consumer, done)
        stream = consumer.stream
        if consumer.ack_none and retention.policy(stream) != "limits":
            peers = self.registry.consumers.get(stream.name, {}).values()
            retention.settle(stream, peers, [d.seq for d in done])

    async def _pace(self, consumer: Consumer, key: int, msg: StoredMessage) -> None:
        """Push pacing: ``replay_policy: original`` keeps the stored gaps; ``rate_limit_bps``
        holds the average rate down."""
        if consumer.config.replay_policy == "original":
            prev = self._replay_ts.get(key)
            if prev is not None and msg.ts > prev:
                await asyncio.sleep(min((msg.ts - prev) / NS, 3600))
            self._replay_ts[key] = msg.ts
        bps = consumer.config.rate_limit_bps
        if bps:
            bucket = self._buckets.setdefault(key, TokenBucket(bps / 8, max(RATE_BURST_BYTES, bps / 8)))
            await asyncio.sleep(bucket.take(len(msg.data), time.monotonic()))

    def _send_run(self, consumer: Consumer, inbox: str, run: list[tuple[StoredMessage, Delivered]]) -> int:
        """Deliveries as one write, each under its stored subject with the ack reply; the bytes a
        pull request's ``max_bytes`` counts for them."""
        pin = None if consumer.is_push else priority.pin_header(consumer)
        group = consumer.config.deliver_group if consumer.is_push else None
        frames, size = delivery_frames(
            inbox,
            consumer.stream.name,
            consumer.name,
            (group,) if group else (),
            run,
            consumer.config.headers_only,
            pin,
        )
        self.leaf.publish_frames(frames)
        if consumer.is_push:
            consumer.watch.last_sent_ns = now_ns()
        if self._timers is not None:
            due = consumer.next_deadline_ns()  # the ack waits these deliveries started
            if due is not None:
                self._timers.earlier(consumer, due)
        return size

    def _send(self, consumer: Consumer, inbox: str, msg: StoredMessage, d: Delivered) -> int:
        """One delivery (and the flow-control request it makes due, if any: after a window of
        bytes, or, acking by flow control, at ``max_ack_pending``)."""
        size = self._send_run(consumer, inbox, [(msg, d)])
        if consumer.is_push and consumer.config.flow_control:
            flow = self._flow_of(consumer)
            request = flow.sent(size)
            if request is None and consumer.ack_policy == "flow_control" and consumer.at_ack_limit():
                request = flow.request()
            self._ask_flow(consumer, inbox, request)
        return size

    def _flow_of(self, consumer: Consumer) -> FlowControl:
        return self._flow.setdefault(id(consumer), FlowControl(consumer.stream.name, consumer.name))

    def _ask_flow(self, consumer: Consumer, inbox: str, request: str | None) -> None:
        """Send ``100 FlowControl Request`` with reply ``request``, if there is one."""
        if request is not None:
            group = consumer.config.deliver_group
            hdrs = status_block(*FLOW_CONTROL_REQUEST)
            self.leaf.publish(inbox, b"", reply=request, hdrs=hdrs, queues=(group,) if group else ())

    def _send_status(self, status: Status, queues: tuple[str, ...] = ()) -> None:
        hdrs = status_block(status.code, status.text, status.headers)
        self.leaf.publish(status.inbox, b"", hdrs=hdrs, queues=queues)

    def _carry_out(self, consumer: Consumer, effects: list[ce.Effect]) -> None:
        """Do what the consumer's state machine decided, in its order."""
        for effect in effects:
            match effect:
                case ce.SendStatus(status, queues):
                    self._send_status(status, queues)
                case ce.Advisory(subject, payload):
                    self.publish_event((subject, payload))
                case ce.RecordAck() | ce.RecordAckRun() | ce.RecordDrop():
                    self._record(consumer, effect)
                case ce.TakeRequest(reply, body):
                    self.pull_request(consumer.stream.name, consumer.name, reply, body)
                case ce.Heartbeat(inbox):
                    beat = ce.heartbeat(consumer, inbox, self._flow.get(id(consumer)))
                    self._send_status(beat.status, beat.queues)
                    if consumer.is_push and consumer.ack_policy == "flow_control" and consumer.pending:
                        # acking by flow control: each heartbeat asks for the acks of what waits
                        self._ask_flow(consumer, inbox, self._flow_of(consumer).request())
                case ce.Serve():
                    self.kick(consumer)
                case ce.WakeBy(deadline) if self._timers is not None:
                    self._timers.earlier(consumer, deadline)
                case ce.Remove():
                    self.tasks.own(self.delete_consumer(consumer), f"inactive-{consumer.name}")

    def _record(self, consumer: Consumer, effect: ce.RecordAck | ce.RecordAckRun | ce.RecordDrop) -> None:
        """An ack-log row; an ack with a reply is answered only once its row is committed
        (``ack_sync``)."""
        if isinstance(effect, ce.RecordAckRun):
            self.recorder.acked_run(consumer, effect.settled)
        elif isinstance(effect, ce.RecordDrop):
            self.recorder.dropped(consumer, effect.seq)
        else:
            delay = {} if effect.delay_ns is None else {"delay": effect.delay_ns}
            reply = effect.reply
            kind, seq, changed = effect.kind, effect.seq, effect.changed
            durable = self.recorder.acked(consumer, kind, seq, changed, bool(reply), **delay)
            if durable is not None and reply:
                durable.add_done_callback(lambda _: self.leaf.publish(reply, b""))

    # ---- the consumer timers ------------------------------------------------------------------

    async def ticker(self) -> None:
        """The owned task the consumer timers live in: every consumer is looked at once now (as
        after a restart), then each again when its deadline is due; cancelling the task stops them.
        Expires pull requests, sends idle heartbeats, redelivers what ``ack_wait`` ran out on,
        drops requests whose requester left, and deletes consumers inactive past their threshold."""
        self._timers = timers = Timers(self._due)
        listening = (
            self.leaf.interest.changed.connect(self._interest_changed),
            self.registry.consumer_changed.connect(self._consumer_changed),
        )
        try:
            timers.set(None, now_ns())
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            for disconnect in listening:
                disconnect()
            timers.close()
            self._timers = None

    def _consumer_changed(self, consumer: Consumer) -> None:
        """Created or reconfigured (thresholds, heartbeats, a pause): looked at right away."""
        if self._timers is not None:
            self._timers.set(consumer, now_ns())

    def _interest_changed(self) -> None:
        """A subscription came or went: every consumer looks again, at most once per SWEEP_NS."""
        if self._timers is not None and self.registry.consumers:
            self._timers.earlier(None, max(now_ns(), self._last_sweep + SWEEP_NS))

    def _due(self, key: Consumer | None) -> None:
        """A deadline is due: one consumer's, or the sweep of all of them (``None``)."""
        now = now_ns()
        if key is None:
            self._last_sweep = now
            consumers = [c for by_name in list(self.registry.consumers.values()) for c in by_name.values()]
        elif self._consumer(key.stream.name, key.name) is key:
            consumers = [key]
        else:
            return  # deleted meanwhile
        for consumer in consumers:
            try:
                self._tick(consumer, now)
            except Exception:
                log.exception("timer of consumer %s/%s failed", consumer.stream.name, consumer.name)
                self._schedule(consumer, now + RETRY_NS)
            else:
                self._schedule(consumer, now)

    def _schedule(self, consumer: Consumer, now: int) -> None:
        """Set the consumer's deadline to the earliest thing it waits for (what ``_tick`` acts
        on), or none; never sooner than MIN_STEP_NS after ``now``."""
        if self._timers is None or self._consumer(consumer.stream.name, consumer.name) is not consumer:
            return
        due = ce.next_due(consumer, now)
        if due is None:
            self._timers.cancel(consumer)
        else:
            self._timers.set(consumer, max(due, now + MIN_STEP_NS))

    def _tick(self, consumer: Consumer, now: int) -> None:
        self._carry_out(consumer, ce.tick(consumer, self.leaf.interest, now))

    def on_flow_control(self, subject: str, hdrs: bytes | None) -> None:
        """A subscriber answered a flow-control request (``$JS.FC.<stream>.<consumer>.<token>``);
        acking by flow control, the answer's headers name what it acks."""
        toks = subject.split(".")
        if len(toks) != 5:
            return
        consumer = self._consumer(toks[2], toks[3])
        flow = self._flow.get(id(consumer)) if consumer is not None else None
        if consumer is not None and flow is not None and flow.answered(subject):
            if self.recorder.has_room():
                peers = self.registry.consumers.get(consumer.stream.name, {}).values()
                answered = ce.flow_control_answered(consumer, peers, parse_headers(hdrs), now_ns())
                self._carry_out(consumer, answered)
            self.kick(consumer)

    # ---- acks ---------------------------------------------------------------------------------

    def on_ack(self, subject: str, reply: str, body: bytes) -> None:
        """An ack that came as a message of its own (every kind but runs of plain ones)."""
        token = acks.parse_ack_subject(subject)
        kind = acks.parse_ack_body(body)
        if token is None or kind is None:
            return
        consumer = self._consumer(token.stream, token.consumer)
        if consumer is not None and consumer.takes_acks:
            self._ack(consumer, token, kind, reply)
        elif reply:  # the server has nobody on the acks of a consumer that is gone or takes none
            self._send_status(Status(reply, *NO_RESPONDERS, no_responders(subject)))

    def apply_acks(self) -> None:
        """Apply the queued plain acks (``queued_acks``): each run of consecutive acks of one
        consumer in one state-machine call, one log append and at most one delivery kick. The
        gateway calls this before any other message of a read and at its end."""
        found, self.queued_acks = self.queued_acks, []
        for (stream, name), run in groupby(found, itemgetter(1, 2)):
            consumer = self._consumer(stream.decode(errors="replace"), name.decode(errors="replace"))
            if consumer is not None and consumer.takes_acks:  # nobody listens on the others'
                self._ack_run(consumer, list(run))

    def _ack_run(self, consumer: Consumer, run: list[tuple[bytes, bytes, bytes, bytes]]) -> None:
        if consumer.ack_all or consumer.config.sample_freq:
            # AckAll settles ranges and sampling answers per ack: one at a time, as ever
            for subject, *_ in run:
                token = acks.parse_ack_subject(subject.decode(errors="replace"))
                assert token is not None  # the parser took only well-formed ack subjects
                self._ack(consumer, token, acks.PLAIN_ACK, "")
            return
        seqs = [int(seq) for *_, seq in run]
        peers = self.registry.consumers.get(consumer.stream.name, {}).values()
        self._carry_out(consumer, ce.ack_run(consumer, peers, seqs, self.recorder.room(), now_ns()))

    def _ack(self, consumer: Consumer, token: acks.AckToken, kind: acks.AckKind, reply: str) -> None:
        """One ack of any kind, applied on its own, if the ack log takes it (if not, the ack is
        not taken and the message is redelivered)."""
        if self.recorder.has_room():
            peers = self.registry.consumers.get(token.stream, {}).values()
            self._carry_out(consumer, ce.ack(consumer, peers, token, kind, reply, now_ns()))


def _size(msg: StoredMessage, consumer: Consumer) -> int:
    """The size a pull request's ``max_bytes`` counts: subject, reply, headers and payload (the
    reply's length estimated from the consumer's next numbers)."""
    p = consumer.pending.get(msg.seq)
    deliveries, pending = (p.deliveries + 1, consumer.num_pending()) if p else (1, consumer.num_pending() - 1)
    token = acks.ack_subject(
        consumer.stream.name, consumer.name, deliveries, msg.seq, consumer.dseq + 1, msg.ts, max(pending, 0)
    )
    return len(msg.subject) + len(token) + len(msg.data) + (len(msg.hdrs) if msg.hdrs else 0)
