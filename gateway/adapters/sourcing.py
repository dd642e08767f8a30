"""Mirrors and stream sources whose origin is another stream of this gateway: one follower task per
origin copies the origin's committed messages, in order, into the stream (``gateway.engine.sourcing``
says what a copy is), each batch in one commit before the next is read.

Exactly once across a ``kill -9``: a mirror resumes after its own last sequence (its sequences are
its origin's); a source resumes after the position recorded as an app transaction in the same
commits as its copies (``StoredMessage.origin``), so the Delta log is the checkpoint. Followers wake
on their origin's commits (``Stream.durable_moved``), not on a timer.

Origins on another JetStream (``external``) are refused at create (``gateway.api.stream_config``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from gateway.adapters.coldread import ColdReader
from gateway.adapters.publish import PublishPath
from gateway.adapters.registry import Registry
from gateway.api import errors
from gateway.api.consumer_config import parse_time_ns
from gateway.api.stream_config import server_hash
from gateway.api.timefmt import now_ns
from gateway.engine.msg_ttl import InvalidTTL, parse_ttl
from gateway.engine.publish_checks import marker_raised_ttl
from gateway.engine.sourcing import OriginSpec, sourced_headers, stream_identity
from gateway.engine.stream import Stream
from gateway.runtime.tasks import TaskOwner
from gateway.wire.leaf import LeafConnection
from gateway.wire.protocol import Msg
from storage_delta.commit.writer import (
    MessageTable,
    StoredMessage,
    WriterClosed,
    WriterOverloaded,
    message_bytes,
)
from storage_delta.format.nats import parse_headers

log = logging.getLogger(__name__)

#: Origin messages read and committed at a time (an origin on this gateway: read from its tail
#: cache or its files; a remote one: what its consumer delivered meanwhile, at most).
BATCH = 256
REMOTE_BATCH = 4096
#: Pause after a failed batch (the writer refused or failed it) before it is tried again.
RETRY_S = 0.5
#: Subjects of the gateway's own consumers on other JetStreams (deliveries ``S.``, replies ``R.``).
LINK_PREFIX = "$JSL."
#: The heartbeat asked of a remote consumer; a follower that hears nothing for ``STALL_S`` makes
#: its consumer again (the server's ``sourceHealthHB`` and ``sourceHealthCheckInterval``).
HEARTBEAT_NS = 1_000_000_000
STALL_S = 10.0
#: Pause before a remote consumer is asked for again (refused, or no answer).
REMOTE_RETRY_S = 2.0
#: Messages a remote follower holds before it falls behind (flow control keeps it far below).
INBOUND_LIMIT = 65536
#: What ``Sourcing._copy`` answers when the writer has no room.
FULL = StoredMessage("", 0, 0, 0, "", None, b"")


@dataclass(slots=True)
class OriginState:
    """What stream info shows of one mirror or source."""

    spec: OriginSpec
    position: int = 0  # the last origin sequence copied
    #: A remote origin's count of what its consumer still has to deliver (from the last delivery).
    lag: int = 0
    #: An origin on this gateway, while followed: the lag is counted in it when info asks.
    origin: Stream | None = None
    active_ns: int = 0  # when it last heard from its origin (0: never)
    #: Caught up with an origin on this gateway and told of its every commit: as current as a
    #: remote copy that just had its heartbeat.
    attached: bool = False
    error: errors.ApiError | None = None
    config: Mapping[str, Any] = field(default_factory=dict)

    def info(self, mirror: bool) -> dict[str, Any]:
        """The server's ``StreamSourceInfo``."""
        out: dict[str, Any] = {"name": self.spec.name}
        if self.config.get("external"):
            out["external"] = self.config["external"]
        origin = self.origin
        out["lag"] = origin.count_matching_after(self.position, self.spec.filters) if origin else self.lag
        if not mirror and self.position:
            out["seq"] = self.position
        out["active"] = -1 if not self.active_ns else 0 if self.attached else now_ns() - self.active_ns
        # The server fills a mirror's filter in when it sets up the mirror's consumer (its
        # transforms, and a source's filter, when the stream is created).
        if self.config.get("filter_subject") and (not mirror or self.active_ns):
            out["filter_subject"] = self.config["filter_subject"]
        if self.config.get("subject_transforms"):
            out["subject_transforms"] = self.config["subject_transforms"]
        if self.error is not None:
            out["error"] = self.error.render()
        return out


@dataclass(slots=True)
class Inbound:
    """A remote follower's subjects and what the link brought for them, bounded."""

    deliver: str
    reply: str
    queue: asyncio.Queue[Msg] = field(default_factory=lambda: asyncio.Queue(INBOUND_LIMIT))
    overrun: bool = False

    def drain(self) -> None:
        while not self.queue.empty():
            self.queue.get_nowait()


@dataclass(frozen=True, slots=True)
class AckMetadata:
    """What a JetStream delivery's ack subject says (``$JS.ACK.[<domain>.<account>.]<stream>.
    <consumer>.<delivered>.<stream seq>.<delivery seq>.<time>.<pending>[.<token>]``)."""

    consumer: str
    stream_seq: int
    delivery_seq: int
    ts: int
    pending: int


def ack_metadata(subject: str) -> AckMetadata | None:
    toks = subject.split(".")
    if toks[:2] != ["$JS", "ACK"] or (len(toks) != 9 and len(toks) < 11):
        return None
    off = 2 if len(toks) == 9 else 4
    try:
        numbers = [int(t) for t in toks[off + 3 : off + 7]]
    except ValueError:
        return None
    return AckMetadata(toks[off + 1], *numbers)


@dataclass(frozen=True, slots=True)
class Copying:
    """One follower's target: the stream, what it copies, the app id its position goes under."""

    stream: Stream
    state: OriginState
    app_id: str
    mirror: bool


def source_app_id(stream: Stream, spec: OriginSpec) -> str:
    """The app id a source's position is recorded under: this stream incarnation's, this source's."""
    return f"jetlake-source:{stream.name}:{stream.created_ns}:{server_hash(spec.key, 16)}"


class Sourcing:
    """Starts, follows and stops the mirror and source followers of every stream."""

    def __init__(
        self,
        registry: Registry,
        publish: PublishPath,
        cold: ColdReader,
        table: MessageTable,
        executor: Executor,
        tasks: TaskOwner,
        leaf: LeafConnection,
    ) -> None:
        self.leaf = leaf
        #: What the link brought for each remote follower (its delivery and reply subjects).
        self._inbound: dict[str, Inbound] = {}
        self.registry = registry
        self.publish = publish
        self.cold = cold
        self.table = table
        self.executor = executor
        self.tasks = tasks
        self._followers: dict[str, list[asyncio.Task[None]]] = {}
        #: Per stream with a mirror or sources: their states, in config order.
        self.states: dict[str, list[OriginState]] = {}
        #: Set when a stream is created: followers waiting for a missing origin look again.
        self._created = asyncio.Event()
        self._disconnect: list[Callable[[], None]] = []

    def start(self) -> None:
        """After recovery: follow every stream that copies others, and every one created later."""
        for stream in list(self.registry.streams.values()):
            self._follow(stream)
        self._disconnect = [
            self.registry.stream_added.connect(self._added),
            self.registry.stream_updated.connect(self._follow),
            self.registry.stream_removed.connect(self._stop),
        ]

    def close(self) -> None:
        for disconnect in self._disconnect:
            disconnect()
        for name in list(self._followers):
            self._stop_tasks(name)

    def info(self, stream: Stream) -> tuple[dict[str, Any] | None, list[dict[str, Any]] | None]:
        """Stream info's ``mirror`` and ``sources``."""
        states = self.states.get(stream.name)
        if not states:
            return None, None
        if stream.config.mirror:
            return states[0].info(mirror=True), None
        return None, [s.info(mirror=False) for s in states]

    def _added(self, stream: Stream) -> None:
        self._created.set()
        self._created = asyncio.Event()
        self._follow(stream)

    def _stop(self, stream: Stream) -> None:
        self._stop_tasks(stream.name)

    def _stop_tasks(self, name: str) -> None:
        for task in self._followers.pop(name, []):
            task.cancel()
        self.states.pop(name, None)

    def _follow(self, stream: Stream) -> None:
        """(Re)start the followers of a stream's mirror or sources, as its config now says (an
        update that leaves them as they were leaves them running)."""
        cfg = stream.config
        configs = [cfg.mirror] if cfg.mirror else list(cfg.sources)
        if [s.config for s in self.states.get(stream.name, [])] == configs and stream.name in self._followers:
            return
        self._stop_tasks(stream.name)
        if not configs:
            return
        states = [OriginState(OriginSpec.of(c), config=c) for c in configs]
        self.states[stream.name] = states
        self._followers[stream.name] = [
            self.tasks.own(
                (self._run_remote if state.config.get("external") else self._run)(
                    stream, state, bool(cfg.mirror)
                ),
                f"sourcing-{stream.name}-{i}",
            )
            for i, state in enumerate(states)
        ]

    def on_link_msg(self, msg: Msg) -> None:
        """A message for a remote follower (``$JSL.``), in link order; one for a follower that is
        gone is dropped. A follower that cannot keep up (its queue full) starts its consumer over."""
        inbound = self._inbound.get(msg.subject)
        if inbound is None:
            return
        try:
            inbound.queue.put_nowait(msg)
        except asyncio.QueueFull:
            inbound.overrun = True

    async def _resume(self, c: Copying) -> bool:
        """Set the position a follower starts after: a mirror's last sequence, a source's recorded
        position (once the copies a follower before this one left in flight have landed). Whether
        nothing was copied yet (the config's start applies)."""
        stream, state = c.stream, c.state
        in_flight = stream.last_seq
        while stream.durable_last_seq < min(in_flight, stream.last_seq) and not stream.ended:
            await _next_commit(stream)
        if c.mirror:
            state.position = stream.last_seq
        else:
            loop = asyncio.get_running_loop()
            state.position = await loop.run_in_executor(self.executor, self.table.position, c.app_id)
        return state.position == 0

    async def _run(self, stream: Stream, state: OriginState, mirror: bool) -> None:
        """Follow an origin on this gateway: read its committed messages, wake on its commits."""
        spec = state.spec
        c = Copying(stream, state, source_app_id(stream, spec), mirror)
        fresh = await self._resume(c)
        while not stream.ended:
            origin = self.registry.streams.get(spec.name)
            state.origin = origin
            if origin is None:
                state.error = errors.STREAM_NOT_FOUND
                await self._created.wait()
                continue
            state.error = None
            if fresh:
                state.position = self._start_after(origin, spec)
                fresh = False
            seqs = origin.seqs_at_or_after(state.position + 1, spec.filters, origin.durable_last_seq, BATCH)
            state.active_ns = now_ns()
            if not seqs:
                state.attached = True
                try:
                    await _next_commit(origin)
                finally:
                    state.attached, state.active_ns = False, now_ns()
                continue
            durable = state.position
            copies: list[StoredMessage] = []
            identity = stream_identity(origin.created_ns)
            for seq in seqs:
                msg = origin.tail.get(seq) or await self.cold.read(origin, seq)
                if stream.ended:
                    break
                if msg is not None:
                    copy = self._copy(c, msg, identity)
                    if copy is FULL:
                        break
                    if copy is not None:
                        copies.append(copy)
                state.position = seq
            if not await self._store(c, copies, durable):
                continue
            if state.position < seqs[-1]:  # the writer had no room for the rest: let it commit first
                await asyncio.sleep(RETRY_S)

    async def _store(self, c: Copying, copies: list[StoredMessage], durable: int) -> bool:
        """Commit accepted copies; False (the position back where it was durable) when it failed."""
        stream, state = c.stream, c.state
        try:
            if copies:
                await self.publish.store_copies(stream, copies)
            return True
        except Exception as exc:  # a failed commit: the stream rolled back to what is durable
            log.warning("%s: copying from %s failed (%r); trying again", stream.name, state.spec.name, exc)
            state.position = durable
            await asyncio.sleep(RETRY_S)
            return False

    async def _run_remote(self, stream: Stream, state: OriginState, mirror: bool) -> None:
        """Follow an origin on another JetStream (``external``) as the server does: a push consumer
        of the origin, created through the external API prefix, delivering with flow control and
        heartbeats over the leaf link; made again after a gap, a stall or an overrun."""
        c = Copying(stream, state, source_app_id(stream, state.spec), mirror)
        fresh = await self._resume(c)
        token = uuid.uuid4().hex[:16]
        inbound = Inbound(f"{LINK_PREFIX}S.{token}", f"{LINK_PREFIX}R.{token}")
        for subject in (inbound.deliver, inbound.reply):
            self._inbound[subject] = inbound
            self.leaf.subscribe(subject)
        try:
            while not stream.ended:
                made = await self._remote_consumer(state, fresh, inbound)
                if made is None:
                    await asyncio.sleep(REMOTE_RETRY_S)
                    continue
                fresh = False
                await self._receive(c, made, inbound)
        finally:
            for subject in (inbound.deliver, inbound.reply):
                self._inbound.pop(subject, None)
                self.leaf.unsubscribe(subject)

    async def _remote_consumer(
        self, state: OriginState, fresh: bool, inbound: Inbound
    ) -> tuple[str, str] | None:
        """Create the consumer that delivers the origin from where the copy stands; its name and
        the origin's identity (when the server says it), or None (the error in the state) when the
        origin's server refused or did not answer."""
        spec, external = state.spec, state.config["external"]
        config: dict[str, Any] = {
            "deliver_policy": "by_start_sequence",
            "opt_start_seq": state.position + 1,
            "ack_policy": "none",
            "ack_wait": 22 * 3600 * 10**9,
            "max_deliver": 1,
            "flow_control": True,
            "deliver_subject": inbound.deliver,
            "idle_heartbeat": HEARTBEAT_NS,
            "inactive_threshold": 10 * HEARTBEAT_NS,
            "direct": True,
        }
        if fresh and spec.opt_start_seq <= 0:
            config.pop("opt_start_seq")
            if spec.opt_start_time:
                config.update(deliver_policy="by_start_time", opt_start_time=spec.opt_start_time)
            else:
                config["deliver_policy"] = "all"
        elif fresh:
            config["opt_start_seq"] = spec.opt_start_seq
        if len(spec.filters) == 1:
            config["filter_subject"] = spec.filters[0]
        elif spec.filters:
            config["filter_subjects"] = list(spec.filters)
        inbound.drain()
        inbound.overrun = False
        request = {"stream_name": spec.name, "config": config, "action": ""}
        prefix = (external.get("api") or "$JS.API").rstrip(".")
        self.leaf.publish(
            f"{prefix}.CONSUMER.CREATE.{spec.name}", json.dumps(request).encode(), inbound.reply
        )
        deadline = asyncio.get_running_loop().time() + REMOTE_RETRY_S
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            try:
                msg = await asyncio.wait_for(inbound.queue.get(), left)
            except TimeoutError:
                break
            if msg.subject != inbound.reply:
                continue  # a delivery of a consumer before this one
            answer = json.loads(msg.data or b"{}")
            if "error" in answer:
                e = answer["error"]
                code, err_code = int(e.get("code", 500)), int(e.get("err_code", 0))
                state.error = errors.ApiError(code, err_code, str(e.get("description", "")))
                return None
            state.error = None
            identity = parse_headers(msg.hdrs).get("Nats-Stream-Identity", "")
            return str(answer.get("name") or ""), identity
        state.error = errors.ApiError(503, 10029, "consumer create request timed out")
        return None

    async def _receive(self, c: Copying, made: tuple[str, str], inbound: Inbound) -> None:
        """Copy what the consumer delivers, in order; return when it must be made again."""
        stream, state = c.stream, c.state
        dseq = 0
        while not stream.ended and not inbound.overrun:
            copies: list[StoredMessage] = []
            durable = state.position
            try:
                msg = await asyncio.wait_for(inbound.queue.get(), STALL_S)
            except TimeoutError:
                return  # stalled: neither messages nor heartbeats
            again = False  # the consumer must be made again (after what was accepted is stored)
            while True:
                state.active_ns = now_ns()
                verdict = self._delivered(c, made, inbound, msg, dseq)
                if verdict is None or verdict[1] is FULL:
                    again = True
                    break
                dseq, copy = verdict
                if copy is not None:
                    copies.append(copy)
                if inbound.queue.empty() or len(copies) >= REMOTE_BATCH:
                    break
                msg = inbound.queue.get_nowait()
            if not await self._store(c, copies, durable) or again:
                return

    def _delivered(
        self, c: Copying, made: tuple[str, str], inbound: Inbound, msg: Msg, dseq: int
    ) -> tuple[int, StoredMessage | None] | None:
        """One message for the follower: a control message answered or checked, a delivery
        copied. The new delivery sequence and the copy (None for none, ``FULL``: the writer had
        no room); None when the consumer must be made again (a gap in its deliveries)."""
        consumer, identity = made
        state = c.state
        if msg.subject != inbound.deliver:
            return dseq, None  # a late answer to an earlier create
        if msg.hdrs is not None and msg.hdrs.startswith(b"NATS/1.0 100"):
            if msg.reply:  # flow control: everything before it has been taken
                self.leaf.publish(msg.reply, b"")
                return dseq, None
            last = parse_headers(msg.hdrs).get("Nats-Last-Consumer", "")
            return None if last.isdigit() and int(last) != dseq else (dseq, None)
        ack, _, subject = msg.reply.partition("@")
        meta = ack_metadata(ack)
        if meta is None or meta.consumer != consumer:
            return dseq, None
        if meta.stream_seq <= state.position:  # already copied (a consumer made again overlaps)
            return (meta.delivery_seq if meta.delivery_seq == dseq + 1 else dseq), None
        if meta.delivery_seq != dseq + 1:
            return None
        hdrs = msg.hdrs or None
        origin = StoredMessage(
            state.spec.name, 0, meta.stream_seq, meta.ts, subject or msg.subject, hdrs, msg.data
        )
        copy = self._copy(c, origin, identity)
        if copy is not FULL:
            state.position = meta.stream_seq
            state.lag = meta.pending
        return meta.delivery_seq, copy

    def _start_after(self, origin: Stream, spec: OriginSpec) -> int:
        """Where a mirror or source that has copied nothing yet starts: its ``opt_start_seq`` or
        ``opt_start_time``, else the origin's beginning."""
        if spec.opt_start_seq > 0:
            return spec.opt_start_seq - 1
        if spec.opt_start_time:
            return origin.seq_at_time(parse_time_ns(spec.opt_start_time)) - 1
        return 0

    def _copy(self, c: Copying, msg: StoredMessage, identity: str) -> StoredMessage | None:
        """Accept the copy of origin message ``msg`` into ``stream``, after the writer made room for
        it (so nothing accepted is left unsubmitted). None when the stream refused it (a discard-new
        stream with no room: the copy is dropped, as the server drops it); ``FULL`` when the writer
        has no room (nothing was accepted)."""
        stream, state, mirror = c.stream, c.state, c.mirror
        seq, subject, hdrs, data = msg.seq, msg.subject, msg.hdrs, msg.data
        stored_subject = state.spec.subject_for(subject)
        if not mirror:
            hdrs = sourced_headers(state.spec, hdrs, seq, subject, identity)
        ttl, hdrs = _copy_ttl(stream, hdrs)
        size = message_bytes(stored_subject, hdrs, data)
        writer = self.publish.writer
        try:
            writer.admit(size)
        except (WriterOverloaded, WriterClosed):
            return FULL
        if mirror:
            copy = stream.accept_mirrored(seq, msg.ts, stored_subject, hdrs, data)
        else:
            try:
                copy = stream.accept(stored_subject, hdrs, data, time.time_ns())
            except errors.ApiError as exc:
                writer.unadmit(size)
                log.warning(
                    "%s: copy of %s %d refused: %s", stream.name, state.spec.name, seq, exc.description
                )
                return None
            copy.origin = (c.app_id, seq)
        if ttl:
            stream.ttl.add(copy.seq, copy.ts, ttl)
        return copy


def _copy_ttl(stream: Stream, hdrs: bytes | None) -> tuple[int, bytes | None]:
    """A copy's ``Nats-TTL`` (ADR-43): a copy is stored whatever the stream allows, but expires
    only in a stream that allows message TTLs (a copy that stays is the audit trail); there it is
    raised to the subject delete marker TTL as a publish's is. The TTL to schedule (0: none) and
    the headers to store."""
    if not stream.config.allow_msg_ttl or not hdrs or b"Nats-TTL" not in hdrs:
        return 0, hdrs
    try:
        ttl = parse_ttl(parse_headers(hdrs).get("Nats-TTL", ""))
    except InvalidTTL:
        return 0, hdrs
    return marker_raised_ttl(stream.config, ttl, hdrs)


async def _next_commit(stream: Stream) -> None:
    """Until the stream's next commit (or its end)."""
    moved = asyncio.Event()
    disconnect = stream.durable_moved.connect(moved.set)
    try:
        await moved.wait()
    finally:
        disconnect()
