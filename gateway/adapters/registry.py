"""The gateway's live streams and consumers, and the durable changes that create them.

Every change is committed to the catalog table before it is visible, so an answer the API gave
survives a crash; the leaf is told of new stream subjects only after that.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from operator import attrgetter
from types import TracebackType
from typing import Protocol

from gateway.adapters.ack_recorder import AckRecorder
from gateway.api import errors
from gateway.api.configs import ConsumerConfig, StreamConfig, to_json
from gateway.engine.consumer import Consumer
from gateway.engine.stream import Stream
from gateway.runtime.signals import Signal
from storage_delta.commit.loop import CommitLoop
from storage_delta.format.nats import SubjectIndex
from storage_delta.tables.catalog import CatalogChange, CatalogTable
from storage_delta.tables.scope import Quarantine

#: Subjects whose stream is remembered; past it the memory starts over (publishers to many
#: distinct subjects, most of them captured by no stream).
ROUTE_CACHE_SIZE = 100_000

_MISS = object()
_CHANGE_STREAM = attrgetter("stream")


class Subscriptions(Protocol):
    """The subjects the gateway listens to (the leaf link): a stream's subjects while it lives, so
    a publish to a subject no stream captures gets "no responders", as from the real server."""

    def subscribe(self, subject: str) -> None: ...

    def unsubscribe(self, subject: str) -> None: ...


class Registry:
    def __init__(
        self,
        catalog: CatalogTable,
        executor: Executor,
        tail_cache_bytes: int,
        recorder: AckRecorder,
        subscriptions: Subscriptions,
    ) -> None:
        self.recorder = recorder
        self._tail_cache_bytes = tail_cache_bytes
        self._subscriptions = subscriptions
        self._route_cache: dict[str, Stream | None] = {}
        self.streams: dict[str, Stream] = {}
        #: The live streams' subjects, for routing a publish and the API's overlap checks.
        self.subject_index = SubjectIndex()
        #: Streams set aside at start because a damaged catalog or removals file may hold rows of
        #: theirs (``storage_delta.tables.scope``): not installed, answered as offline streams.
        self.quarantine = Quarantine()
        self.consumers: dict[str, dict[str, Consumer]] = {}
        #: The configs of streams whose create or update is being committed: the API's checks
        #: across streams (overlapping subjects, sources) see them, as other streams' requests
        #: run meanwhile (#23).
        self.in_flight: dict[str, StreamConfig] = {}
        #: The lsn of each consumer's create row in the ack log, until an update has seen it
        #: durable: until then a consumer's start is in its catalog entry alone, which an update
        #: must not replace (#23).
        self._create_rows: dict[Consumer, int] = {}
        self.server_version = "2.15.1"
        self.api_total = 0
        self.api_errors = 0
        #: Catalog changes become durable through the one group-commit loop: the changes of
        #: requests that arrive while a commit is in flight share the next one. A failed commit
        #: fails its requests; nothing was changed in memory before it, so nothing rolls back.
        self.catalog_loop: CommitLoop[CatalogChange] = CommitLoop(
            "catalog",
            executor,
            catalog.commit,
            catalog.committed_version,
            lambda _rows, _exc: None,
            stream_of=_CHANGE_STREAM,
        )
        self._per_stream = catalog.per_stream
        #: Per-stream ownership (#19): makes this gateway the owner of a stream it is about to
        #: create (its lease claimed and every table fenced, then what the store holds of the
        #: stream installed: another gateway may have created it meanwhile), before the create's
        #: catalog commit, which the appender refuses for a stream not held. A no-op for a stream
        #: held already. Whether this call claimed it (False: held already). None: the gateway
        #: owns the whole store.
        self.claim: Callable[[str], Awaitable[bool]] | None = None
        #: Per-stream ownership: lets go of a stream :attr:`claim` claimed for a create that did
        #: not come about (refused after the claim: 10005, an overlap, a failed commit), so that
        #: the gateway holds no epoch of a stream it does not serve: a later claim of it elsewhere
        #: would pass that epoch, and a move back here would find it held and not claim it again.
        self.let_go: Callable[[str], Awaitable[None]] | None = None
        #: Told of every consumer removed (the API's delete, inactivity): delivery answers its
        #: waiting requests and the advisory goes out.
        self.consumer_removed: Signal[[Consumer]] = Signal()
        #: Told of every consumer created or changed through the API (its timers are set anew).
        self.consumer_changed: Signal[[Consumer]] = Signal()
        #: Told of every stream deleted (its timers go), after the stream has ended.
        self.stream_removed: Signal[[Stream]] = Signal()
        #: Told of every stream created through the API, and of every stream whose config an
        #: update changed (mirrors and sources start, stop or change with them).
        self.stream_added: Signal[[Stream]] = Signal()
        self.stream_updated: Signal[[Stream]] = Signal()
        #: Told when a stream's removals start waiting for the removal log
        #: (``Stream.removal_queued``): the recorder wakes for them.
        self.removal_queued: Signal[[]] = Signal()

    def stream(self, name: str) -> Stream:
        """The live stream of that name, or the API's "stream not found"."""
        stream = self.streams.get(name)
        if stream is None:
            raise errors.STREAM_NOT_FOUND
        return stream

    def stream_config(self, name: str) -> StreamConfig | None:
        """A stream's config as it is about to stand (one being committed), else the live one."""
        config = self.in_flight.get(name)
        if config is None and (stream := self.streams.get(name)) is not None:
            config = stream.config
        return config

    async def _persist_stream(self, config: StreamConfig, body: dict[str, object] | None) -> None:
        """Commit a stream's new config; while in flight the API's cross-stream checks see it."""
        self.in_flight[config.name] = config
        try:
            await self._persist(CatalogChange("stream", config.name, config.name, body))
        finally:
            if self.in_flight.get(config.name) is config:
                del self.in_flight[config.name]

    def route(self, subject: str) -> Stream | None:
        """The stream that captures ``subject`` (None: no stream does)."""
        found = self._route_cache.get(subject, _MISS)
        if found is not _MISS:
            return found  # type: ignore[return-value]
        # Candidates from the index, confirmed against the live streams (one being deleted has
        # left ``streams`` before its subjects leave the index).
        live = [
            stream
            for name in self.subject_index.matching(subject)
            if (stream := self.streams.get(name)) is not None and stream.captures(subject)
        ]
        if len(live) > 1:  # streams that overlap (a catalog from elsewhere): the oldest, as before
            live = [s for s in self.streams.values() if s in live]
        found = live[0] if live else None
        if len(self._route_cache) > ROUTE_CACHE_SIZE:
            self._route_cache.clear()
        self._route_cache[subject] = found
        return found

    def _subjects_changed(
        self, name: str, old: Sequence[str], new: Sequence[str], listen: bool = True
    ) -> None:
        """Stream ``name`` was added, updated or deleted: route its subjects anew and tell the
        server which subjects the gateway listens to (a deleted stream's subjects get no responders
        again; ``listen`` False: not yet, :meth:`listen` will)."""
        self._route_cache.clear()
        for subject in old:
            self.subject_index.remove(subject, name)
            if subject not in new:
                self._subscriptions.unsubscribe(subject)
        for subject in new:
            self.subject_index.add(subject, name)
            if subject not in old and listen:
                self._subscriptions.subscribe(subject)

    def listen(self, stream: Stream) -> None:
        """Subscribe the subjects of a stream installed with ``listen=False`` (a stream claimed
        mid-life: its publishes must not reach it before it is recovered)."""
        for subject in stream.subjects:
            self._subscriptions.subscribe(subject)

    def listed_consumers(self, stream: str) -> list[Consumer]:
        """A stream's consumers as its listings and ``consumer_count`` show them, sorted by name:
        without the ``direct`` ones, which the server keeps out of sight."""
        by_name = self.consumers.get(stream, {})
        return [by_name[n] for n in sorted(by_name) if not by_name[n].config.direct]

    async def start(self) -> None:
        """Start the catalog's commit loop (before anything is persisted)."""
        await self.catalog_loop.start()

    async def close(self) -> None:
        """Commit what was persisted so far, then stop the catalog's commit loop."""
        await self.catalog_loop.close()

    async def _persist(self, *changes: CatalogChange) -> None:
        """Make ``changes`` durable, in one catalog commit with whatever other requests persist
        meanwhile (the commit loop's group commit)."""
        self.catalog_loop.pending.extend(changes)
        # per stream: a request's changes are of one stream, whose fence alone fails them
        stream = changes[0].stream if self._per_stream and changes else None
        done = self.catalog_loop.queued(sync=True, added=len(changes), stream=stream)
        assert done is not None
        await done

    def install_stream(self, config: StreamConfig, created_ns: int, listen: bool = True) -> Stream:
        stream = Stream(config, created_ns, self._tail_cache_bytes)
        self.streams[stream.name] = stream
        self._subjects_changed(stream.name, (), stream.subjects, listen)
        consumers = self.consumers.setdefault(stream.name, {})

        def removed(seq: int, subject: str) -> None:
            for consumer in consumers.values():
                consumer.forget(seq, subject)

        stream.msg_removed.connect(removed)
        stream.removal_queued.connect(self.removal_queued.emit)
        return stream

    def install_consumer(
        self,
        stream: Stream,
        config: ConsumerConfig,
        created_ns: int,
        name: str,
        start_after: int = 0,
        skip: list[int] | None = None,
    ) -> Consumer:
        consumer = Consumer(stream, config, created_ns, start_after, skip, name)
        self.consumers.setdefault(stream.name, {})[consumer.name] = consumer
        return consumer

    def claimed(self, name: str) -> ClaimedForCreate:
        """Per-stream ownership: stream ``name`` owned (:attr:`claim`) for a create made inside
        ``async with``; should the create fail with no stream of that name here, a claim made
        for it is let go (:attr:`let_go`). Nothing to do for a gateway that owns the whole store."""
        return ClaimedForCreate(self, name)

    async def add_stream(self, config: StreamConfig, created_ns: int) -> Stream:
        async with self.claimed(config.name):
            if self.claim is not None and config.name in self.streams:
                raise errors.STREAM_NAME_EXISTS  # created by another gateway before this claim
            await self._persist_stream(config, {"config": to_json(config), "created": created_ns})
        stream = self.install_stream(config, created_ns)
        self.stream_added.emit(stream)
        return stream

    async def add_consumer(
        self,
        stream: Stream,
        config: ConsumerConfig,
        created_ns: int,
        name: str,
        start_after: int,
        skip: list[int],
    ) -> Consumer:
        """One durable commit, the catalog's: its entry holds all a restart needs of a new consumer
        (config, start and the ``last_per_subject`` sequences still to deliver). The ack log's
        create row follows unawaited, ahead of every row of the consumer's (#23): should a crash
        cut it off, the rows after it go with it (the log lands in order) and the restart starts
        the consumer afresh from the catalog's entry, which is where it stood."""
        body: dict[str, object] = {"config": to_json(config), "created": created_ns}
        body["start_after"] = start_after
        if skip:
            body["skip"] = skip
        await self._persist(CatalogChange("consumer", stream.name, name, body))
        consumer = self.install_consumer(stream, config, created_ns, name, start_after, skip)
        self._create_rows[consumer] = self.recorder.created(consumer, start_after, skip)
        self.consumer_changed.emit(consumer)
        return consumer

    async def persist_consumer(
        self, stream: Stream, config: ConsumerConfig, created_ns: int, name: str, start_after: int
    ) -> None:
        """The catalog entry of a consumer restored from an archive (its state goes to the ack log
        before it is installed, as at a restart)."""
        body = {"config": to_json(config), "created": created_ns, "start_after": start_after}
        await self._persist(CatalogChange("consumer", stream.name, name, body))

    async def update_consumer(self, consumer: Consumer, config: ConsumerConfig) -> None:
        """One durable commit, the catalog's, whose config a restart takes over the ack log's; the
        ack log's config row (for the log's readers) follows unawaited (#23). Its entry replaces
        the create's, whose start (``start_after``, ``skip``) a restart needs while the ack log
        lacks the create row: so an update right after a create first waits for that row."""
        row = self._create_rows.get(consumer)
        if row is not None:
            await self.recorder.durable_through(row)
            self._create_rows.pop(consumer, None)
        body = {
            "config": to_json(config),
            "created": consumer.created_ns,
            "start_after": consumer.ack_floor_sseq,
        }
        await self._persist(CatalogChange("consumer", consumer.stream.name, consumer.name, body))
        consumer.reconfigure(config)
        self.recorder.config_changed(consumer)
        self.consumer_changed.emit(consumer)

    async def remove_consumer(self, consumer: Consumer) -> bool:
        """Delete a consumer (durably first); False if it was already gone."""
        by_name = self.consumers.get(consumer.stream.name, {})
        if by_name.get(consumer.name) is not consumer:
            return False
        await self._persist(CatalogChange("consumer", consumer.stream.name, consumer.name, None))
        if by_name.get(consumer.name) is not consumer:
            return False
        del by_name[consumer.name]
        self._create_rows.pop(consumer, None)
        self.consumer_removed.emit(consumer)
        self.recorder.deleted(consumer)
        return True

    async def update_stream(self, stream: Stream, config: StreamConfig) -> None:
        """Store a stream's new config, then make it the live one (subjects re-routed)."""
        await self._persist_stream(config, {"config": to_json(config), "created": stream.created_ns})
        old = stream.subjects
        stream.config = config
        if old != stream.subjects:
            self._subjects_changed(stream.name, old, stream.subjects)
        self.stream_updated.emit(stream)

    async def remove_stream(self, stream: Stream) -> None:
        """End a stream (and its consumers) durably; its messages stay in storage until Spark
        removes them, invisible to a stream created later under the same name (docs/storage.md)."""
        await self._persist(
            *(
                CatalogChange("consumer", stream.name, name, None)
                for name in self.consumers.get(stream.name, {})
            ),
            CatalogChange("stream", stream.name, stream.name, None),
        )
        del self.streams[stream.name]
        stream.end()  # a removal waiting for one of its commits is released
        self.stream_removed.emit(stream)
        for gone in self.consumers.pop(stream.name, {}).values():
            self._create_rows.pop(gone, None)
            self.consumer_removed.emit(gone)
            self.recorder.deleted(gone)
        self._subjects_changed(stream.name, stream.subjects, ())

    def forget_stream(self, stream: Stream) -> None:
        """A stream another gateway now owns (per-stream ownership, #19) leaves this one without a
        trace in the tables (they are the new owner's): its consumers' waiting pull requests are
        dropped unanswered (their clients time out and ask again, reaching the new owner; a
        ``409 Consumer Deleted`` would be a wrong answer), its subjects are unsubscribed."""
        if self.streams.get(stream.name) is not stream:
            return
        del self.streams[stream.name]
        stream.end()
        self.stream_removed.emit(stream)
        for gone in self.consumers.pop(stream.name, {}).values():
            gone.waiting.clear()
            self._create_rows.pop(gone, None)
            self.consumer_removed.emit(gone)
        self._subjects_changed(stream.name, stream.subjects, ())

    def rollback(self, stream_names: set[str]) -> None:
        """A commit failed: these streams go back to what is durable."""
        for name in stream_names:
            stream = self.streams.get(name)
            if stream is not None:
                stream.rollback()


class ClaimedForCreate:
    """:meth:`Registry.claimed`. A class, not ``contextlib.asynccontextmanager``, which sets the
    traceback of the exception it passes on: the API's errors are frozen."""

    def __init__(self, registry: Registry, name: str) -> None:
        self.registry = registry
        self.name = name
        self.fresh = False

    async def __aenter__(self) -> None:
        claim = self.registry.claim
        self.fresh = claim is not None and await claim(self.name)

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        let_go, streams = self.registry.let_go, self.registry.streams
        if isinstance(exc, Exception) and self.fresh and self.name not in streams and let_go is not None:
            await let_go(self.name)
