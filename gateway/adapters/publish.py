"""The publish path: route a message to its stream, check it (``publish_checks``), give it a
sequence, hand it to the group-commit writer, and send the PubAck only once its commit is durable.

A duplicate (``Nats-Msg-Id`` seen within the window) stores nothing; its PubAck names the original
sequence, and if the original is still in flight it waits for that commit, so no client is told of
a sequence that a failed commit could take back. ``no_ack`` streams answer nothing, errors included.
A ``Nats-TTL`` enters the stream's TTL schedule, a ``Nats-Rollup`` purges once the writer has the
message, and the delete markers expiry asks for (ADR-43) are stored here by ``place_markers``, which
the removal recorder calls as soon as expiry has asked (``gateway.adapters.removals``).
An atomic batch is held until its commit and accepted whole; a fast batch's messages (reply
ending in ``.$FI``) are stored one by one and its flow acks, reports and PubAck wait, like every
PubAck, for the commit they speak for.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from gateway.adapters.registry import Registry
from gateway.api import errors
from gateway.api.advisories import batch_abandoned
from gateway.api.durations import go_duration
from gateway.api.timefmt import now_ns
from gateway.engine.atomic_batch import Abandoned, AtomicBatches, Commit, Dropped, Held, check_batch
from gateway.engine.fast_batch import (
    SUFFIX,
    Answer,
    BatchDone,
    FastBatches,
    FastRef,
    FlowAck,
    FlowErr,
    FlowGap,
    Refused,
    parse_reply,
)
from gateway.engine.publish_checks import (
    Accepted,
    Batched,
    Duplicate,
    check_in_batch,
    check_publish,
    exceeds_size,
    size_limit,
)
from gateway.engine.republish import Republished, republished
from gateway.engine.stream import Stream
from gateway.runtime.signals import Signal
from gateway.runtime.timers import Timers
from gateway.wire.leaf import LeafConnection
from gateway.wire.protocol import Msg
from storage_delta.commit.owner import StreamFenced
from storage_delta.commit.stats import PUBACK_SECONDS_BUCKETS, Histogram
from storage_delta.commit.writer import (
    GroupCommitWriter,
    StoredMessage,
    WriterClosed,
    WriterOverloaded,
    message_bytes,
)
from storage_delta.format.nats import status_block

NO_RESPONDERS = status_block(503, "")


def pub_ack_format(domain: str) -> bytes:
    """A PubAck's body (``%s`` the stream, ``%d`` the sequence) as a server in JetStream domain
    ``domain`` words it: the domain between the two, left out without one."""
    named = b',"domain":' + json.dumps(domain).encode().replace(b"%", b"%%") if domain else b""
    return b'{"stream":"%s"' + named + b',"seq":%d'


@dataclass(slots=True, eq=False)
class _Run:
    """The messages one stream accepted during one read of the leaf link: they are submitted
    together, wait on one future, and their PubAcks leave in sequence order in one write."""

    stream: Stream
    #: Publishes without headers not yet accepted (subject, payload, reply): ``_accept_queued``
    #: takes them in one call, before the stream's next publish with headers and at ``flush``.
    queued: list[tuple[str, bytes, str]] = field(default_factory=list)
    msgs: list[StoredMessage] = field(default_factory=list)
    acks: list[tuple[str, bytes]] = field(default_factory=list)  # (reply, PubAck body)
    msg_ids: list[tuple[str, int]] = field(default_factory=list)  # keys in ``_inflight_ids``
    #: Duplicates of a msg id this run carries, answered once it is durable (or failed).
    after: list[Callable[[BaseException | None], None]] = field(default_factory=list)
    #: Copies its stream's ``republish`` asks for, published once the run is durable.
    republish: list[Republished] = field(default_factory=list)
    #: Fast batches with answers in ``acks``: dropped if the commit fails.
    fast_batches: set[str] = field(default_factory=set)
    settled: bool = False  # its commit landed or failed
    #: When the read that began it was handed over (monotonic s): its PubAcks' latency counts from here.
    opened: float = field(default_factory=time.monotonic)


class PublishPath:
    def __init__(
        self,
        registry: Registry,
        writer: GroupCommitWriter,
        leaf: LeafConnection,
        on_stored: Callable[[Stream], None],
        domain: str,
    ) -> None:
        self.registry = registry
        self._domain = domain
        self._pub_ack = pub_ack_format(domain) + b"}"
        self._batch_ack = pub_ack_format(domain) + b',"batch":%s,"count":%d}'
        self._duplicate_ack = pub_ack_format(domain) + b',"duplicate": true}'
        self._batch_duplicate_ack = pub_ack_format(domain) + b',"duplicate": true,"batch":%s,"count":%d}'
        self.writer = writer
        self.leaf = leaf
        self._on_stored = on_stored
        self.route = registry.route
        #: Told of each committed run of a stream that has something to expire (MaxAge, or TTLs)
        #: with its first message's stored time: the expiry timer is brought forward to it.
        self.expiring: Signal[[Stream, int]] = Signal()
        #: Told of each committed run: its commit added a data file to the stream's partition (the
        #: compactor counts them).
        self.files_added: Signal[[Stream]] = Signal()
        # Accepted but not yet submitted: one run per stream, until ``flush``.
        self._runs: dict[Stream, _Run] = {}
        # Each stream's last submitted run while in flight: answers of a run that stored nothing
        # (a fast batch's ping, or a refusal) wait for it, so they leave in the order decided.
        self._tail: dict[Stream, _Run] = {}
        # Runs in flight holding a message with a msg id, for duplicates that arrive meanwhile.
        self._inflight_ids: dict[tuple[str, int], _Run] = {}
        #: Atomic batches waiting for their commit.
        self.batches = AtomicBatches()
        #: When each held batch (stream, batch id) times out, made on the first one held.
        self._batch_idle: Timers[tuple[str, str]] | None = None
        #: Fast batches in progress.
        self.fast = FastBatches()
        self.received = 0  # publishes to a stream subject (the monitor reads these)
        self.failed = 0  # publishes answered with an error
        #: Messages made durable per stream name, mirrored and sourced copies included.
        self.stored: dict[str, int] = {}
        #: Seconds from the read that brought a publish to its PubAck leaving, one per PubAck.
        self.puback_seconds = Histogram(PUBACK_SECONDS_BUCKETS)

    def on_publish(self, msg: Msg) -> None:
        """Check and accept one publish. What is accepted is submitted by the next ``flush``,
        which the leaf calls once the messages of a read are handed over; publishes without
        headers (most) wait there too, to be accepted together."""
        stream = self.route(msg.subject)
        if stream is None:
            return
        self.received += 1
        subject = msg.subject
        if stream.input_transform is not None:  # a subject the source does not match stays as it is
            subject = stream.input_transform.match(subject) or subject
        reply = "" if stream.no_ack else msg.reply
        run = self._run_of(stream)
        fast = msg.reply.endswith(SUFFIX)
        if msg.hdrs is None and stream.takes_runs and not fast:
            run.queued.append((subject, msg.data, reply))
            return
        if run.queued:  # what came before is accepted first: the checks below see it
            self._accept_queued(run)
        now = now_ns()
        if fast and (ref := parse_reply(msg.reply)) is not None:
            self._fast(run, subject, msg, ref, now)
            return
        verdict = check_publish(stream, subject, msg.hdrs, msg.data, now)
        if type(verdict) is Accepted:
            self._store(run, subject, msg.data, verdict, reply, now)
        elif type(verdict) is Duplicate:
            self._duplicate(stream, verdict.seq, reply)
        elif type(verdict) is Batched:
            assert msg.hdrs is not None  # the batch id is a header
            self._batch(run, subject, msg.hdrs, msg.data, reply, now)
        elif isinstance(verdict, errors.ApiError):
            self._reply_error(reply, stream, verdict)

    def _batch(self, run: _Run, subject: str, hdrs: bytes, data: bytes, reply: str, now: int) -> None:
        """A message of an atomic batch: held (an empty reply), refused, or the commit of its batch,
        whose messages are then checked and accepted together into ``run``, so one commit stores
        them all; the commit's PubAck carries the batch id and its size."""
        stream = run.stream
        decided = self.batches.hold(stream.name, subject, hdrs, data, now)
        if type(decided) is Held:
            if self._batch_idle is None:
                self._batch_idle = Timers(self._batch_timed_out)
            self._batch_idle.set((stream.name, decided.batch_id), decided.idle_until_ns + 1)
            if reply:
                self.leaf.publish(reply, b"")
            return
        if type(decided) is Dropped:
            self._announce(decided.abandoned)
            self._reply_error(reply, stream, decided.error)
            return
        if isinstance(decided, errors.ApiError):
            self._reply_error(reply, stream, decided)
            return
        assert type(decided) is Commit
        if self._batch_idle is not None:
            self._batch_idle.cancel((stream.name, decided.batch_id))
        checked = check_batch(stream, decided.msgs, now, stream.room_for(decided.msgs))
        if isinstance(checked, errors.ApiError):
            self._reply_error(reply, stream, checked)
            return
        last = 0
        for (msg_subject, _, msg_data), verdict in zip(decided.msgs, checked, strict=True):
            last = self._store(run, msg_subject, msg_data, verdict, "", now) or last
        if reply:
            ack = self._batch_ack % (
                stream.name_bytes,
                last,
                json.dumps(decided.batch_id).encode(),
                len(decided.msgs),
            )
            run.acks.append((reply, ack))

    def _batch_timed_out(self, key: tuple[str, str]) -> None:
        abandoned = self.batches.expire(*key, now_ns())
        if abandoned is not None:
            self._announce(abandoned)

    def _announce(self, abandoned: Abandoned) -> None:
        """The BATCH_ABANDONED advisory, at once: it speaks of nothing stored."""
        body = batch_abandoned(abandoned.stream, abandoned.batch_id, abandoned.reason, self._domain, now_ns())
        self.leaf.publish(*body)

    def close(self) -> None:
        """No batch times out after this."""
        if self._batch_idle is not None:
            self._batch_idle.close()

    def _fast(self, run: _Run, subject: str, msg: Msg, ref: FastRef | errors.ApiError, now: int) -> None:
        """A message of a fast batch: checked and stored as an ordinary publish, while the batch
        decides what to answer (``gateway.engine.fast_batch``). Every answer waits in the run for
        its commit (or for the stream's last commit in flight), so none leaves before the
        messages it speaks for are durable, and all leave in the order they were decided. The
        answers go to the message's reply subject even on a ``no_ack`` stream, as the server's do,
        but for the first message's flow ack and the refusals of a message the stream never took."""
        stream, reply = run.stream, msg.reply
        cfg = stream.config
        refused = (
            (errors.STREAM_SEALED if cfg.sealed else None)
            or (errors.STREAM_MESSAGE_EXCEEDS_MAXIMUM if exceeds_size(cfg, msg.hdrs, msg.data) else None)
            or (None if cfg.allow_batched else errors.BATCH_PUBLISH_DISABLED)
        )
        if refused is None and isinstance(ref, FastRef):
            begun = self.fast.begin(stream.name, ref, msg.hdrs, stream.no_ack, now)
            answers = [a for a in begun.answers if not (stream.no_ack and type(a) is Refused)]
            if begun.store:
                answers += self._fast_store(run, subject, begun.hdrs, msg.data, ref, now)
            self._answer(run, reply, ref, answers)
        elif not stream.no_ack:
            self._answer(run, reply, ref, [Refused(refused or _as_error(ref))])

    def _fast_store(
        self, run: _Run, subject: str, hdrs: bytes | None, data: bytes, ref: FastRef, now: int
    ) -> list[Answer]:
        stream, name = run.stream, run.stream.name
        verdict = check_in_batch(stream, subject, hdrs, data, now)
        if type(verdict) is Duplicate:
            return self.fast.refused(name, ref, None, verdict.seq)
        if isinstance(verdict, errors.ApiError):
            return self.fast.refused(name, ref, verdict)
        assert type(verdict) is Accepted
        stored = self._try_store(run, subject, data, verdict, "", now)
        if isinstance(stored, errors.ApiError):
            return self.fast.refused(name, ref, stored)
        return self.fast.stored(name, ref, stored)

    def _answer(self, run: _Run, reply: str, ref: FastRef | errors.ApiError, answers: list[Answer]) -> None:
        """Queue a fast batch message's answers in the run, rendered as the server words them."""
        if not answers:
            return
        name = run.stream.name_bytes
        for a in answers:
            if type(a) is FlowAck:
                body = b'{"type":"ack","seq":%d,"msgs":%d}' % (a.seq, a.msgs)
            elif type(a) is FlowGap:
                body = b'{"type":"gap","last_seq":%d,"seq":%d}' % (a.last_seq, a.seq)
            elif type(a) is FlowErr:
                body = _compact({"type": "err", "seq": a.seq, "error": a.error.render()})
            elif type(a) is BatchDone:
                assert isinstance(ref, FastRef)
                form = self._batch_duplicate_ack if a.duplicate else self._batch_ack
                body = form % (name, a.stream_seq, json.dumps(ref.batch_id).encode(), a.count)
            else:
                assert type(a) is Refused
                self.failed += 1
                body = _error_body(run.stream, a.error)
            run.acks.append((reply, body))
        if isinstance(ref, FastRef):
            run.fast_batches.add(ref.batch_id)

    def accept_queued(self) -> None:
        """Accept every queued publish now: before a message that is not a publish (an ack may
        remove a message), so streams change in the order the link delivered."""
        for run in self._runs.values():
            if run.queued:
                self._accept_queued(run)

    def _accept_queued(self, run: _Run) -> None:
        """Accept a run's queued publishes without headers in one ``accept_run``; each is checked
        (``size_limit``: nothing else can refuse one while the stream ``takes_runs``) and admitted
        as a single publish would be."""
        stream, queued, run.queued = run.stream, run.queued, []
        now = now_ns()
        items: list[tuple[str, bytes | None, bytes]] = []
        replies: list[str] = []
        limit = size_limit(stream.config)
        admit = self.writer.admit
        for subject, data, reply in queued:
            if 0 <= limit < len(data):
                self._reply_error(reply, stream, errors.STREAM_MESSAGE_EXCEEDS_MAXIMUM)
                continue
            try:
                admit(message_bytes(subject, None, data))
            except (WriterOverloaded, WriterClosed) as exc:
                self._reply_error(reply, stream, _store_failed(exc))
                continue
            items.append((subject, None, data))
            replies.append(reply)
        if not items:
            return
        stored = stream.accept_run(items, now)
        last = stored[-1]
        stream.dedup.record("", last.seq, last.ts, now, stream.config.duplicate_window)
        run.msgs += stored
        name = stream.name_bytes
        run.acks += [
            (reply, self._pub_ack % (name, m.seq)) for reply, m in zip(replies, stored, strict=True) if reply
        ]

    def stream_removed(self, stream: Stream) -> None:
        """A deleted stream: its batches, atomic and fast, and its count go (a stream of the name
        starts anew)."""
        self.batches.forget_stream(stream.name)
        self.fast.forget_stream(stream.name)
        self.stored.pop(stream.name, None)

    def stream_updated(self, stream: Stream) -> None:
        """Turning ``allow_batched`` off ends the stream's fast batches, and ``allow_atomic`` its
        held atomic batches, as the server does: turned on again, their next messages are of
        unknown batches (10208, 10176)."""
        if not stream.config.allow_batched:
            self.fast.forget_stream(stream.name)
        if not stream.config.allow_atomic:
            self.batches.forget_stream(stream.name)

    def on_kv_publish(self, msg: Msg) -> None:
        """A ``$KV`` publish, which reaches the gateway through the API domain mapping whether or
        not a bucket captures it: without one, the requester gets the no-responders status the
        hub would have sent (nats-py: ``NoStreamResponseError``)."""
        if self.route(msg.subject) is None:
            if msg.reply:
                self.leaf.publish(msg.reply, b"", hdrs=NO_RESPONDERS)
            return
        self.on_publish(msg)

    def _accept(
        self, stream: Stream, subject: str, hdrs: bytes | None, data: bytes, now: int, rollup: bool = False
    ) -> StoredMessage:
        """Room in the writer first, then a sequence, so a refusal (overload, or a limit with
        ``discard: new``, raised as the error to answer) leaves nothing to take back."""
        size = message_bytes(subject, hdrs, data)
        try:
            self.writer.admit(size)
        except (WriterOverloaded, WriterClosed) as exc:
            raise _store_failed(exc) from None
        try:
            return stream.accept(subject, hdrs, data, now, rollup)
        except errors.ApiError:
            self.writer.unadmit(size)
            raise

    def _run_of(self, stream: Stream) -> _Run:
        run = self._runs.get(stream)
        if run is None:
            run = self._runs[stream] = _Run(stream)
        return run

    def _enqueue(self, run: _Run, stored: StoredMessage, reply: str) -> None:
        run.msgs.append(stored)
        if reply:
            run.acks.append((reply, self._pub_ack % (run.stream.name_bytes, stored.seq)))

    def _store(self, run: _Run, subject: str, data: bytes, verdict: Accepted, reply: str, now: int) -> int:
        """Accept one checked publish into ``run``; its sequence, 0 when a limit refused it."""
        stored = self._try_store(run, subject, data, verdict, reply, now)
        if isinstance(stored, errors.ApiError):
            self._reply_error(reply, run.stream, stored)
            return 0
        return stored

    def _try_store(
        self, run: _Run, subject: str, data: bytes, verdict: Accepted, reply: str, now: int
    ) -> int | errors.ApiError:
        """Accept one checked publish into ``run``: its sequence, or the error a limit (or the
        writer's room) refused it with."""
        stream, hdrs = run.stream, verdict.hdrs
        previous = stream.last_seq_for(subject) if stream.republish else 0
        try:
            stored = self._accept(stream, subject, hdrs, data, now, bool(verdict.rollup))
        except errors.ApiError as err:
            return err
        seq = stored.seq
        stream.dedup.record(verdict.msg_id, seq, stored.ts, now, stream.config.duplicate_window)
        self._enqueue(run, stored, reply)
        if stream.republish and (copy := republished(stream, stored, previous)) is not None:
            run.republish.append(copy)
        if hdrs is None:
            return seq
        if verdict.ttl:
            stream.ttl.add(seq, stored.ts, verdict.ttl)
        if verdict.is_marker:
            stream.ttl.markers.add(seq)
        if verdict.rollup:  # keeps only this message of its subject (sub) or of the stream (all)
            stream.purge(subject=subject if verdict.rollup == "sub" else None, keep=1)
        if verdict.msg_id:
            key = (stream.name, seq)
            self._inflight_ids[key] = run
            run.msg_ids.append(key)
        return seq

    def flush(self) -> None:
        """Submit what was accepted since the last flush: one submit and one future per stream."""
        if not self._runs:
            return
        runs, self._runs = self._runs, {}
        for run in runs.values():
            if run.queued:
                self._accept_queued(run)
            if not run.msgs:
                if run.acks:
                    self._answer_after_tail(run)
                continue
            self._tail[run.stream] = run
            self.writer.submit(run.msgs, admitted=True).add_done_callback(partial(self._committed, run))

    def _answer_after_tail(self, run: _Run) -> None:
        """Answers of a run that stored nothing leave after the stream's last commit in flight."""
        tail = self._tail.get(run.stream)
        if tail is None or tail.settled:
            self.leaf.publish_many(run.acks)
            return
        tail.after.append(partial(self._settle_answers, run))

    def _settle_answers(self, run: _Run, exc: BaseException | None) -> None:
        if exc is None:
            self.leaf.publish_many(run.acks)
        else:
            self._fail_answers(run, exc)

    def _fail_answers(self, run: _Run, exc: BaseException) -> None:
        """Each answer becomes the store error, and the run's fast batches end: what their acks
        would have vouched for is gone with the failed commit. Per-stream ownership: when another
        gateway took the stream over (:class:`StreamFenced`; this one forgot it) the publishers hear
        nothing from here and retry, reaching the new owner, as clients of a JetStream stream whose
        leader changed time out: an error would say the stream failed them."""
        if not isinstance(exc, StreamFenced):
            err = _store_failed(exc)
            for reply, _body in run.acks:
                self._reply_error(reply, run.stream, err)
        for batch_id in run.fast_batches:
            self.fast.drop(run.stream.name, batch_id)

    def store_copies(self, stream: Stream, msgs: list[StoredMessage]) -> asyncio.Future[None]:
        """Submit what a mirror or a source accepted into ``stream`` (``gateway.adapters.sourcing``,
        which made room in the writer for each first): one commit, then everything a committed
        publish run triggers."""
        run = _Run(stream, msgs=msgs)
        fut = self.writer.submit(msgs, admitted=True)
        fut.add_done_callback(partial(self._committed, run))
        return fut

    def place_markers(self, stream: Stream, now: int) -> None:
        """Store the delete markers (ADR-43) for subjects whose last message MaxAge or a TTL removed:
        an empty message with ``Nats-Marker-Reason: MaxAge``, the marker TTL and ``Nats-Rollup: sub``,
        itself removed once that TTL runs out."""
        marker_ns = stream.config.subject_delete_marker_ttl
        hdrs = (
            b"NATS/1.0\r\nNats-Marker-Reason: MaxAge\r\nNats-TTL: %s\r\nNats-Rollup: sub\r\n\r\n"
            % go_duration(marker_ns).encode()
        )
        subjects, stream.markers_due = stream.markers_due, []
        for subject in subjects:
            try:
                stored = self._accept(stream, subject, hdrs, b"", now)
            except errors.ApiError:  # a full discard-new stream has no room for it either
                continue
            stream.ttl.add(stored.seq, stored.ts, marker_ns // 1_000_000_000)
            stream.ttl.markers.add(stored.seq)
            self._enqueue(self._run_of(stream), stored, "")
        self.flush()

    def _duplicate(self, stream: Stream, seq: int, reply: str) -> None:
        if not reply:
            return
        body = self._duplicate_ack % (stream.name_bytes, seq)
        original = self._inflight_ids.get((stream.name, seq))
        if original is None or original.settled:
            self.leaf.publish(reply, body)
            return

        def answer(exc: BaseException | None) -> None:
            if isinstance(exc, StreamFenced):
                pass  # silent, as the run's own publishers (_fail_answers)
            elif exc is not None:
                self._reply_error(reply, stream, _store_failed(exc))
            else:
                self.leaf.publish(reply, body)

        original.after.append(answer)

    def _committed(self, run: _Run, fut: asyncio.Future[None]) -> None:
        """Answer a run's publishers (in sequence order) and the duplicates that waited on it."""
        exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
        run.settled = True
        if self._tail.get(run.stream) is run:
            del self._tail[run.stream]
        if exc is None:
            run.stream.committed(run.msgs[-1].seq)
        for key in run.msg_ids:
            if self._inflight_ids.get(key) is run:
                del self._inflight_ids[key]
        if exc is None:
            for subject, hdrs, data in run.republish:  # before the PubAcks, as the server sends them
                self.leaf.publish(subject, data, hdrs=hdrs)
            if run.acks:
                self.leaf.publish_many(run.acks)
                self.puback_seconds.observe(time.monotonic() - run.opened, len(run.acks))
            name = run.stream.name
            self.stored[name] = self.stored.get(name, 0) + len(run.msgs)
        else:
            self._fail_answers(run, exc)
        for answer in run.after:
            answer(exc)
        if exc is None:
            self._on_stored(run.stream)
            stream = run.stream
            if self.files_added:
                self.files_added.emit(stream)
            if self.expiring and (stream.limits.max_age or stream.ttl.next_ns() is not None):
                self.expiring.emit(stream, run.msgs[0].ts)

    def _reply_error(self, reply: str, stream: Stream, err: errors.ApiError) -> None:
        """An error PubAck as JetStream sends it: the error, the stream's name and sequence 0."""
        self.failed += 1
        if reply:
            self.leaf.publish(reply, _error_body(stream, err))


def _as_error(ref: FastRef | errors.ApiError) -> errors.ApiError:
    assert isinstance(ref, errors.ApiError)
    return ref


def _compact(body: object) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _error_body(stream: Stream, err: errors.ApiError) -> bytes:
    return _compact({"error": err.render(), "stream": stream.name, "seq": 0})


def _store_failed(exc: BaseException) -> errors.ApiError:
    return errors.STREAM_STORE_FAILED.format(err=f"message not stored: {exc}")
