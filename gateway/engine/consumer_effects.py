"""What a consumer does in answer to an ack, a pull request and its timer, as effects.

The decisions live here, over the consumer and stream state machines and the clock, with no I/O:
each function changes the state and returns the effects (status messages and advisories to send,
ack-log rows to record, a pull request to take, delivery to start, a timer to bring forward, the
consumer to remove) in the order the delivery adapter (:mod:`gateway.adapters.delivery`) carries
them out. The adapter keeps only what needs I/O: the link, the ack log's room and durability,
the serve tasks and the timers. Whether an inbox has a listener, or a push consumer is bound to a
subscriber, is asked of the ``Listeners`` it passes in (the leaf's view of the server's
subscriptions).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from gateway.api import advisories
from gateway.api.pull import (
    EXCEEDED_MAX_WAITING,
    IDLE_HEARTBEAT,
    NO_MESSAGES,
    PUSH_BASED,
    REQUIRED_API_LEVEL,
    PullRequest,
    Status,
    limit_status,
    parse_pull_request,
    timeout_status,
)
from gateway.api.requests import above_api_level
from gateway.engine import priority, retention
from gateway.engine.consumer import Consumer, Pending
from gateway.engine.flow_control import FlowControl
from gateway.wire.acks import PLAIN_ACK, AckKind, AckToken
from storage_delta.tables import acklog as al


class Listeners(Protocol):
    """Who subscribes on the server now (``gateway.wire.leaf.Interest``)."""

    def has(self, subject: str) -> bool:
        """Whether a message to ``subject`` reaches a subscriber (a pull request's inbox)."""

    def bound(self, subject: str, group: str) -> bool:
        """Whether a push consumer delivering to ``subject`` in queue group ``group`` ("" for
        none) has a subscriber it binds to."""


def push_bound(consumer: Consumer, listeners: Listeners) -> bool:
    """A push consumer's ``push_bound``: it delivers only while this holds."""
    cfg = consumer.config
    return consumer.is_push and listeners.bound(cfg.deliver_subject, cfg.deliver_group)


@dataclass(frozen=True, slots=True)
class SendStatus:
    """A status message to a pull request's inbox or a push consumer's deliver subject (its
    queue group, if any, in ``queues``)."""

    status: Status
    queues: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Advisory:
    """A JetStream advisory event to publish."""

    subject: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class RecordAck:
    """One ack-log row of ``kind`` for ``seq``, or, when it ``changed`` nothing (a late
    duplicate), none. With a ``reply`` the client is answered once the row (for a duplicate:
    everything before it) is durable; ``delay_ns`` is a nak's redelivery delay."""

    kind: str
    seq: int
    changed: bool
    reply: str = ""
    delay_ns: int | None = None


@dataclass(frozen=True, slots=True)
class RecordAckRun:
    """The ack-log rows of plain acks taken in one run: (stream seq, floor seq, floor cseq) each."""

    settled: list[tuple[int, int, int]]


@dataclass(frozen=True, slots=True)
class RecordDrop:
    """``seq`` left the pending set unacknowledged."""

    seq: int


@dataclass(frozen=True, slots=True)
class TakeRequest:
    """``+NXT``: a pull request with ``body``, answered on ``reply``."""

    reply: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """An idle heartbeat is due on ``inbox`` (:func:`heartbeat` words it)."""

    inbox: str


@dataclass(frozen=True, slots=True)
class Serve:
    """The consumer has a target and work: delivery should run."""


@dataclass(frozen=True, slots=True)
class WakeBy:
    """The consumer's timer is due no later than ``deadline_ns``."""

    deadline_ns: int


@dataclass(frozen=True, slots=True)
class Remove:
    """The consumer was inactive past its ``inactive_threshold``: delete it."""


#: Everything a consumer's state machine asks of its adapter.
Effect = (
    SendStatus
    | Advisory
    | RecordAck
    | RecordAckRun
    | RecordDrop
    | TakeRequest
    | Heartbeat
    | Serve
    | WakeBy
    | Remove
)
SERVE = Serve()
REMOVE = Remove()


# ---- acks -------------------------------------------------------------------------------------


def ack(
    consumer: Consumer, peers: Iterable[Consumer], token: AckToken, kind: AckKind, reply: str, now: int
) -> list[Effect]:
    """One ack of any kind, applied on its own; ``peers`` are the stream's consumers (interest and
    work-queue retention settle against them all). A ``+TERM`` is advised whatever it changed
    (the server's ``processTerm`` advises every one, with the token's numbers); an ack or term of
    a message above the last delivered one changes nothing and gets no answer, as from the server,
    which ignores it."""
    k = kind.kind
    floor = consumer.ack_floor_sseq
    effects: list[Effect] = []
    record, changed, delay = al.ACK, False, None
    if k in ("ack", "next"):
        settled = consumer.ack(token.seq, token.cseq, now)
        changed = settled is not None
        if settled is not None and consumer.config.sample_freq:
            effects += _sample(consumer, token, settled, now)
    elif k == "term":
        record, changed = al.TERM, consumer.term(token.seq, token.cseq, now) is not None
        effects.append(_advisory(advisories.terminated(*_names(token), kind.reason, now)))
    elif k == "nak":
        record, changed = al.NAK, consumer.nak(token.seq, kind.delay_ns, now)
        delay = _nak_delay(consumer, token.seq, kind, now)
        if changed:
            effects.append(_advisory(advisories.nak(*_names(token), now)))
    elif k == "wpi":
        record, changed = al.WPI, consumer.progress(token.seq, now)
    if k in ("ack", "next", "term") and retention.policy(consumer.stream) != "limits":
        acked = range(floor + 1, token.seq + 1) if consumer.ack_all else (token.seq,)
        retention.settle(consumer.stream, peers, acked)
    ignored = k in ("ack", "term") and token.seq > consumer.sseq
    effects.append(RecordAck(record, token.seq, changed, "" if k == "next" or ignored else reply, delay))
    if k == "next" and reply:
        effects.append(TakeRequest(reply, kind.next_request))
    effects += _serve_if_due(consumer)
    if k in ("nak", "wpi"):
        due = consumer.next_deadline_ns()  # a nak delay or a restarted ack wait
        if due is not None:
            effects.append(WakeBy(due))
    return effects


def flow_control_answered(
    consumer: Consumer, peers: Iterable[Consumer], hdrs: dict[str, str], now: int
) -> list[Effect]:
    """The answer to the outstanding flow-control request of a consumer with ``ack_policy:
    flow_control``: it acks everything up to the ``Nats-Last-Stream`` (and ``Nats-Last-Consumer``)
    it names, as an ack-all ``+ACK`` would (the server's ``processFlowControl``); an answer
    without them acks nothing."""
    last_sseq = _whole(hdrs.get("Nats-Last-Stream"))
    if consumer.ack_policy != "flow_control" or last_sseq <= 0:
        return []
    last_cseq = max(_whole(hdrs.get("Nats-Last-Consumer")), 0)
    token = AckToken(consumer.stream.name, consumer.name, 1, last_sseq, last_cseq, 0, 0)
    return ack(consumer, peers, token, PLAIN_ACK, "", now)


def _whole(text: str | None) -> int:
    """A header's number as the server reads it (``parseInt64``: digits only, else -1)."""
    return int(text) if text and text.isascii() and text.isdigit() else -1


def ack_run(
    consumer: Consumer, peers: Iterable[Consumer], seqs: list[int], room: int, now: int
) -> list[Effect]:
    """Consecutive plain acks of one consumer in one state-machine call, as many as the ack log
    has ``room`` for (the rest are not taken: redelivered)."""
    taken, settled = consumer.ack_run(seqs, now, room)
    if retention.policy(consumer.stream) != "limits":
        retention.settle(consumer.stream, peers, seqs[:taken])
    effects: list[Effect] = [RecordAckRun(settled)] if settled else []
    return effects + _serve_if_due(consumer) if taken else effects


def _names(token: AckToken) -> tuple[str, str, int, int, int]:
    """What the nak and terminated advisories name of the acked delivery."""
    return token.stream, token.consumer, token.cseq, token.seq, token.deliveries


def _advisory(event: tuple[str, bytes]) -> Advisory:
    return Advisory(*event)


def _sample(consumer: Consumer, token: AckToken, settled: Pending, now: int) -> list[Effect]:
    """``sample_freq``: an advisory for that share of the acks, with the delivery's round trip."""
    rate = advisories.sample_rate(consumer.config.sample_freq)
    if not (rate and sampled(rate, token.cseq)):
        return []
    rtt = now - settled.sent_ns
    return [
        _advisory(
            advisories.ack_sample(
                token.stream, token.consumer, token.cseq, token.seq, rtt, settled.deliveries, now
            )
        )
    ]


def sampled(rate: int, cseq: int) -> bool:
    """Deterministic sampling: ``rate`` percent of consumer sequences."""
    return rate >= 100 or (cseq * 7919) % 100 < rate


def _nak_delay(consumer: Consumer, seq: int, kind: AckKind, now: int) -> int | None:
    """The nak's redelivery delay the ack log keeps, if it had one."""
    p = consumer.pending.get(seq)
    if p is not None and kind.delay_ns > 0:
        return p.deadline_ns - now
    return None


def _serve_if_due(consumer: Consumer) -> list[Effect]:
    """An ack that frees nothing to deliver starts no delivery."""
    listening = len(consumer.waiting) > 0 or consumer.is_push
    return [SERVE] if listening and consumer.has_work() else []


# ---- pull requests ----------------------------------------------------------------------------


def pull_request(consumer: Consumer, reply: str, body: bytes, hdrs: bytes | None, now: int) -> list[Effect]:
    """A ``CONSUMER.MSG.NEXT`` request: refused with the status the server sends, or queued."""
    consumer.watch.last_seen_ns = now
    if consumer.is_push:
        return [SendStatus(Status(reply, *PUSH_BASED))]
    if above_api_level(hdrs):
        return [SendStatus(Status(reply, *REQUIRED_API_LEVEL))]
    req = parse_pull_request(reply, body, now)
    if isinstance(req, Status):
        return [SendStatus(req)]
    refused = limit_status(req, consumer.config, now) or priority.admit(consumer, req, now)
    if refused is not None:
        return [SendStatus(refused)]
    if consumer.waiting.full():
        return [SendStatus(Status(reply, *EXCEEDED_MAX_WAITING))]
    if req.no_wait and not req.expires_at_ns and not consumer.has_work():
        return [SendStatus(Status(reply, *NO_MESSAGES))]
    priority.enqueue(consumer, req)
    consumer.watch.listening = True
    effects: list[Effect] = []
    if req.expires_at_ns or req.heartbeat_ns:
        effects.append(WakeBy(min(t for t in (req.expires_at_ns, req.next_heartbeat_ns) if t)))
    return [*effects, SERVE]


def choose_request(consumer: Consumer, now: int) -> tuple[PullRequest | None, list[Effect]]:
    """The waiting request the next message goes to: the first in the queue, unless a priority
    policy passes over it (:func:`priority.choose`, asked only when there is a message to give,
    as the server asks it only then)."""
    if not priority.selective(consumer) or not consumer.has_work():
        return consumer.waiting.peek(), []
    choice = priority.choose(consumer, now)
    effects: list[Effect] = [SendStatus(s) for s in choice.refused]
    effects += [_advisory(e) for e in choice.events]
    if choice.events and consumer.pin is not None:
        effects.append(WakeBy(consumer.pin.expires_ns))  # the new pin's lapse
    return choice.request, effects


# ---- the timer --------------------------------------------------------------------------------


def tick(consumer: Consumer, listeners: Listeners, now: int) -> list[Effect]:
    """The consumer's timer is due: expire pull requests, send idle heartbeats, redeliver what
    ``ack_wait`` ran out on, drop requests whose requester left, and remove the consumer once it
    has been inactive past its threshold."""
    effects: list[Effect] = [SendStatus(timeout_status(req)) for req in consumer.waiting.expire(now)]
    consumer.waiting.remove_where([r for r in consumer.waiting if not listeners.has(r.reply)])
    for req in consumer.waiting:
        if req.heartbeat_ns and req.next_heartbeat_ns <= now:
            req.next_heartbeat_ns = now + req.heartbeat_ns
            effects.append(Heartbeat(req.reply))
    for seq, deliveries in consumer.expire(now):
        effects.append(RecordDrop(seq))
        effects.append(
            _advisory(advisories.max_deliveries(consumer.stream.name, consumer.name, seq, deliveries, now))
        )
    lapsed = priority.lapse(consumer, now)
    if lapsed is not None:
        effects.append(_advisory(lapsed))
    listening = observe(consumer, listeners, now)
    if consumer.is_push and listening and _push_heartbeat_due(consumer, now):
        effects.append(Heartbeat(consumer.config.deliver_subject))
    if _inactive(consumer, now):
        return [*effects, REMOVE]
    if (listening or consumer.is_push) and consumer.has_work():
        effects.append(SERVE)
    return effects


def _push_heartbeat_due(consumer: Consumer, now: int) -> bool:
    """A listening push consumer's idle heartbeat: due ``idle_heartbeat`` after it last sent."""
    beat, watch = consumer.config.idle_heartbeat, consumer.watch
    if not beat:
        return False
    if watch.last_sent_ns is None:
        watch.last_sent_ns = now
    if now - watch.last_sent_ns < beat:
        return False
    watch.last_sent_ns = now
    return True


def _inactive(consumer: Consumer, now: int) -> bool:
    """Whether the consumer went unseen past its ``inactive_threshold`` (then its clock moves on
    by the threshold, so it is removed once). A pull consumer counts as seen until the ack wait of
    its last pending message runs out, as the server's ``deleteNotActive`` waits for it."""
    threshold, watch = consumer.config.inactive_threshold, consumer.watch
    if not threshold:
        return False
    if watch.last_seen_ns is None:
        watch.last_seen_ns = now
    if now - watch.last_seen_ns <= threshold:
        return False
    if not consumer.is_push:
        acked_by = consumer.last_ack_deadline_ns()
        if acked_by is not None and now - acked_by <= threshold:
            watch.last_seen_ns = acked_by
            return False
    watch.last_seen_ns = now + threshold
    return True


def observe(consumer: Consumer, listeners: Listeners, now: int) -> bool:
    """Whether the consumer listens (waiting requests; a push consumer bound to a subscriber).
    While it does, and at the first look after it stopped, it counts as seen now."""
    watch = consumer.watch
    push = consumer.is_push
    listening = push_bound(consumer, listeners) if push else len(consumer.waiting) > 0
    if listening or watch.listening:
        watch.last_seen_ns = now
    watch.listening = listening
    return listening


def next_due(consumer: Consumer, now: int) -> int | None:
    """The earliest thing :func:`tick` acts on, or None: the ack waits, the requests' expiry and
    heartbeats, a push heartbeat, inactivity, the end of a pause."""
    watch = consumer.watch
    times = [consumer.next_deadline_ns()]
    for req in consumer.waiting:
        times += (req.expires_at_ns, req.next_heartbeat_ns)
    cfg = consumer.config
    beat = cfg.idle_heartbeat if consumer.is_push else 0
    if beat and watch.listening:
        times.append((now if watch.last_sent_ns is None else watch.last_sent_ns) + beat)
    threshold = cfg.inactive_threshold
    if threshold and not watch.listening:
        times.append((now if watch.last_seen_ns is None else watch.last_seen_ns) + threshold + 1)
    if consumer.paused_until_ns > now:
        times.append(consumer.paused_until_ns)  # delivery resumes
    if consumer.pin is not None:
        times.append(consumer.pin.expires_ns)  # the pin lapses
    return min((t for t in times if t), default=None)


def heartbeat(consumer: Consumer, inbox: str, flow: FlowControl | None) -> SendStatus:
    """``100 Idle Heartbeat`` with the last sequences; while a flow-control request is unanswered
    it also names that request's reply (``Nats-Consumer-Stalled``), as the server does, so a
    client that missed the request can answer it."""
    group = consumer.config.deliver_group if consumer.is_push else None
    headers = {"Nats-Last-Consumer": str(consumer.dseq), "Nats-Last-Stream": str(consumer.sseq)}
    if flow is not None and flow.outstanding is not None:
        headers["Nats-Consumer-Stalled"] = flow.outstanding
    return SendStatus(Status(inbox, *IDLE_HEARTBEAT, headers), (group,) if group else ())
