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
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from gateway.adapters.coldread import ColdReader
from gateway.adapters.publish import PublishPath
from gateway.adapters.registry import Registry
from gateway.api import errors
from gateway.api.consumer_config import parse_time_ns
from gateway.api.timefmt import now_ns
from gateway.engine.sourcing import OriginSpec, server_hash, sourced_headers, stream_identity
from gateway.engine.stream import Stream
from gateway.runtime.tasks import TaskOwner
from storage_delta.commit.writer import (
    MessageTable,
    StoredMessage,
    WriterClosed,
    WriterOverloaded,
    message_bytes,
)

log = logging.getLogger(__name__)

#: Origin messages read and committed at a time.
BATCH = 256
#: Pause after a failed batch (the writer refused or failed it) before it is tried again.
RETRY_S = 0.5


@dataclass(slots=True)
class OriginState:
    """What stream info shows of one mirror or source."""

    spec: OriginSpec
    position: int = 0  # the last origin sequence copied
    lag: int = 0
    active_ns: int = 0  # when it last heard from its origin (0: never)
    error: errors.ApiError | None = None
    config: Mapping[str, Any] = field(default_factory=dict)

    def info(self, mirror: bool) -> dict[str, Any]:
        """The server's ``StreamSourceInfo``."""
        out: dict[str, Any] = {"name": self.spec.name, "lag": self.lag}
        if not mirror and self.position:
            out["seq"] = self.position
        out["active"] = now_ns() - self.active_ns if self.active_ns else -1
        # The server fills a mirror's filter in when it sets up the mirror's consumer (its
        # transforms, and a source's filter, when the stream is created).
        if self.config.get("filter_subject") and (not mirror or self.active_ns):
            out["filter_subject"] = self.config["filter_subject"]
        if self.config.get("subject_transforms"):
            out["subject_transforms"] = self.config["subject_transforms"]
        if self.error is not None:
            out["error"] = self.error.render()
        return out


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
    ) -> None:
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
            self.tasks.own(self._run(stream, state, mirror=bool(cfg.mirror)), f"sourcing-{stream.name}-{i}")
            for i, state in enumerate(states)
        ]

    async def _run(self, stream: Stream, state: OriginState, mirror: bool) -> None:
        spec = state.spec
        app_id = source_app_id(stream, spec)
        loop = asyncio.get_running_loop()
        in_flight = stream.last_seq  # copies a follower before this one left in flight land first
        while stream.durable_last_seq < min(in_flight, stream.last_seq) and not stream.ended:
            await _next_commit(stream)
        if mirror:
            state.position = stream.last_seq
        else:
            state.position = await loop.run_in_executor(self.executor, self.table.position, app_id)
        fresh = state.position == 0
        while not stream.ended:
            origin = self.registry.streams.get(spec.name)
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
                state.lag = 0
                await _next_commit(origin)
                continue
            durable = state.position
            copies, state.position = await self._copies(stream, origin, state, seqs, app_id, mirror)
            try:
                if copies:
                    await self.publish.store_copies(stream, copies)
            except Exception as exc:  # a failed commit: the stream rolled back to what is durable
                log.warning("%s: copying from %s failed (%r); trying again", stream.name, spec.name, exc)
                state.position = durable
                await asyncio.sleep(RETRY_S)
                continue
            if state.position < seqs[-1]:  # the writer had no room for the rest: let it commit first
                await asyncio.sleep(RETRY_S)
            state.lag = len(
                origin.seqs_at_or_after(state.position + 1, spec.filters, origin.durable_last_seq, BATCH)
            )

    def _start_after(self, origin: Stream, spec: OriginSpec) -> int:
        """Where a mirror or source that has copied nothing yet starts: its ``opt_start_seq`` or
        ``opt_start_time``, else the origin's beginning."""
        if spec.opt_start_seq > 0:
            return spec.opt_start_seq - 1
        if spec.opt_start_time:
            return origin.seq_at_time(parse_time_ns(spec.opt_start_time)) - 1
        return 0

    async def _copies(
        self, stream: Stream, origin: Stream, state: OriginState, seqs: list[int], app_id: str, mirror: bool
    ) -> tuple[list[StoredMessage], int]:
        """Read the origin's messages and accept their copies into ``stream``, each after the
        writer made room for it (so nothing accepted is left unsubmitted); the copies, and the
        last origin sequence dealt with."""
        out: list[StoredMessage] = []
        identity = stream_identity(origin.created_ns)
        done = state.position
        writer = self.publish.writer
        for seq in seqs:
            msg = origin.tail.get(seq) or await self.cold.read(origin, seq)
            if stream.ended:
                break
            if msg is None:  # removed from the origin meanwhile
                done = seq
                continue
            subject = state.spec.subject_for(msg.subject)
            hdrs = msg.hdrs if mirror else sourced_headers(state.spec, msg.hdrs, seq, msg.subject, identity)
            size = message_bytes(subject, hdrs, msg.data)
            try:
                writer.admit(size)
            except (WriterOverloaded, WriterClosed):
                break
            if mirror:
                out.append(stream.accept_mirrored(seq, msg.ts, subject, hdrs, msg.data))
            else:
                try:
                    copy = stream.accept(subject, hdrs, msg.data, time.time_ns())
                except errors.ApiError as exc:  # a discard-new stream with no room: dropped
                    writer.unadmit(size)
                    log.warning(
                        "%s: copy of %s %d refused: %s", stream.name, origin.name, seq, exc.description
                    )
                    done = seq
                    continue
                copy.origin = (app_id, seq)
                out.append(copy)
            done = seq
        return out, done


async def _next_commit(stream: Stream) -> None:
    """Until the stream's next commit (or its end)."""
    moved = asyncio.Event()
    disconnect = stream.durable_moved.connect(moved.set)
    try:
        await moved.wait()
    finally:
        disconnect()
