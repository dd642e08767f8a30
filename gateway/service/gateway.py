"""The gateway: the parts of the service built bottom-up in one place and started in order.

``start`` builds every part complete (tables, the two commit loops, the registry and its recovery
from the tables, the publish and delivery paths, the API router, the dispatcher) and only then
starts the leaf link, handing what it reads to the one ordered dispatcher
(:mod:`gateway.service.dispatcher`). Owns the background tasks (API worker, consumer timer,
per-consumer delivery, removals, index snapshots, the sync flusher, compaction) and cancels and
awaits them on ``close``. Blocking work (delta-rs, parquet) runs on ``executor``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from gateway.adapters.ack_recorder import AckRecorder
from gateway.adapters.archives import Archives
from gateway.adapters.coldread import ColdReader
from gateway.adapters.compactor import Compactor
from gateway.adapters.delivery import Delivery
from gateway.adapters.loader import MessageLoader
from gateway.adapters.publish import PublishPath
from gateway.adapters.registry import Registry
from gateway.adapters.removals import RemovalRecorder
from gateway.adapters.snapshots import Snapshots
from gateway.adapters.sourcing import Sourcing
from gateway.api import advisories
from gateway.api.configs import ConsumerConfig, StreamConfig, from_json
from gateway.api.responses import Gateways
from gateway.api.timefmt import now_ns
from gateway.engine.consumer import Consumer
from gateway.engine.publish_state import headers_since, replay_headers
from gateway.engine.stream import Stream
from gateway.handlers.router import Api
from gateway.handlers.streams import Others, StreamApi, Usage
from gateway.runtime.settings import Settings
from gateway.runtime.tasks import TaskOwner
from gateway.service.dispatcher import LinkDispatcher
from gateway.service.gathering import Gathering
from gateway.service.gathering import digest as gathering_digest
from gateway.service.ownership import Ownership, StreamClaims
from gateway.wire import protocol
from gateway.wire.leaf import LeafConnection
from gateway.wire.leafauth import LeafTarget
from gateway.wire.protocol import Msg
from storage_delta.commit.durable import Unsynced, flush_every
from storage_delta.commit.owner import StreamFenced
from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import GroupCommitWriter, MessageTable
from storage_delta.read import index_snapshot
from storage_delta.read.consumer_log import reduce
from storage_delta.read.index_snapshot import DamagedSnapshot
from storage_delta.read.reader import FileDamage, MessageReader, StoredIndex
from storage_delta.tables.acklog import AckLog, AckLogTable, AckLogWriter
from storage_delta.tables.catalog import CatalogTable
from storage_delta.tables.removals import RemovalLog
from storage_delta.tables.repair import check_at_start
from storage_delta.tables.scope import StoreState, load_store_state

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Core:
    """The parts of a started gateway, each complete once built (the monitor reads them)."""

    leaf: LeafConnection
    writer: GroupCommitWriter
    acklog: AckLogWriter
    registry: Registry
    publish: PublishPath
    delivery: Delivery
    dispatcher: LinkDispatcher
    api: Api
    recorder: RemovalRecorder
    snapshots: Snapshots
    compactor: Compactor | None  # None with compaction off (compact_min_files 0)


class Gateway:
    def __init__(self, settings: Settings, ownership: Ownership | None = None) -> None:
        """``ownership``: the store's leases, under whose name this gateway serves only the
        streams it claims (:meth:`claim`, and a create), each fenced on its own in every table
        (#19, docs/architecture.md, *Several gateways on one store*); the store lease makes its
        holder the meta owner (:attr:`meta`). None: it serves the whole store, unfenced (a
        gateway that owns its root alone, as in-process tests and tools open one)."""
        self.settings = settings
        self.ownership = ownership
        sync_s = settings.sync_seconds
        local = StoreRoot(settings.data_root).local_path() is not None
        #: Seconds between two flushes of what the commits of a local root wrote without syncing
        #: (None: they sync, or the root is an object store, where a completed PUT is durable).
        self.flush_s = sync_s if local else None
        self.root = StoreRoot(
            settings.data_root,
            settings.storage_options or None,
            fsync=sync_s is None,
            unsynced=Unsynced() if self.flush_s is not None else None,
            log_retention_s=settings.log_retention_ms / 1000,
        )
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="jetlake-io")
        #: Per stream: a claim's fences and read back, one commit or read per table side by side,
        #: on threads of their own: queued behind the other streams' commits and reads on
        #: :attr:`executor`, a move's fences went one or two at a time (0.3 s of a move on S3).
        self.claiming = ThreadPoolExecutor(max_workers=6, thread_name_prefix="jetlake-claims")
        claims = None
        if ownership is not None:
            claims = StreamClaims(ownership.lease, ownership.name, self.root, self.claiming)
            ownership.listening = True
        #: Per stream: the stream leases this gateway holds (None: it serves the whole store).
        self.claims = claims
        #: Per stream: whether this gateway holds the store lease, which makes it the answerer of
        #: the account-wide API and of streams placed on no gateway (``gateway.service.placing``).
        self.meta = False
        #: Per stream: the meta epoch of the newest placement this gateway followed (claimed what
        #: it placed here). A meta owner answers nothing account-wide before it followed its own:
        #: ``$JS.API.INFO`` answered means the streams are served, as a restarted JetStream
        #: answers once it recovered them.
        self.followed = 0
        #: Per stream: the placement last followed (stream → gateway name).
        self.placement: dict[str, str] = {}
        #: Per stream, the meta owner: the gateway a new stream of this config is placed on
        #: (``Placing.place_new``; None: not known yet, this gateway creates it).
        self.place_new: Callable[[str, dict[str, Any]], str | None] | None = None
        #: Per stream, the meta owner: the new streams whose create it forwarded (stream →
        #: gateway, when), until a placement records them (or ``placing.FORWARD_LEASES`` passed);
        #: it does not answer them meanwhile.
        self.forwarded: dict[str, tuple[str, float]] = {}
        self._leases_checked = 0.0  # time.monotonic() of the last look at the held streams' leases
        #: Per stream: the streams being recovered after a claim, answered by no one meanwhile.
        self._recovering: set[str] = set()
        #: Per stream: the streams moving here from a live gateway (``Placement.handovers``),
        #: which answers them until it lets them go.
        self.handovers: dict[str, str] = {}
        #: Per stream: set once the stream's claim is over (an API request waits for it).
        self._served: dict[str, asyncio.Event] = {}
        #: Per stream: the streams of the claims under way.
        self._claiming: set[str] = set()
        #: Per stream: the account-wide answers, forwarded creates and presence on the hub.
        self.gathering: Gathering | None = None
        self.tasks = TaskOwner()
        self.reader = MessageReader(self.root)
        self.cold = ColdReader(self.reader, self.executor)
        #: Damage found at start (damaged checkpoints are set aside, not kept here; ``messages`` files
        #: are the reader's).
        self.store_damage: list[str] = []
        #: Set once :meth:`start` has built and started every part.
        self.core: Core | None = None
        self.sourcing: Sourcing | None = None
        #: Per-stream ownership: the tables a claim fences (every table a stream's rows go to).
        self._tables: tuple[MessageTable, CatalogTable, RemovalLog, AckLogTable] | None = None
        self._stop_dropping: Callable[[], None] | None = None
        self._stop_watching: Callable[[], None] | None = None

    # ---- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Build the parts from the bottom up (tables, writers, registry, recovery, the paths,
        the dispatcher), then start the link: nothing is read before everything can answer."""
        loop = asyncio.get_running_loop()
        settings = self.settings
        phases = [time.monotonic()]  # what a start (a takeover) spends where, logged at the end
        check = await loop.run_in_executor(self.executor, check_at_start, self.root)
        phases.append(time.monotonic())
        self.store_damage = check.problems
        held = self.claims.held if self.claims is not None else None
        #: None: every stream of the store; per stream, none until claimed
        only: set[str] | None = set() if self.claims is not None else None
        try:
            # The tables are fenced and loaded side by side: on an object store each is a few
            # round trips, which a takeover would otherwise wait for one table after another.
            table, catalog, removal_log, acks = await asyncio.gather(
                loop.run_in_executor(self.executor, partial(MessageTable, self.root, streams=held)),
                loop.run_in_executor(self.executor, partial(CatalogTable, self.root, streams=held)),
                loop.run_in_executor(self.executor, RemovalLog, self.root, held),
                loop.run_in_executor(self.executor, partial(AckLogTable, self.root, streams=held)),
            )
        except Exception:
            if self.store_damage:  # e.g. a damaged checkpoint whose log entries have expired
                log.error("cannot open the tables: %s", "; ".join(self.store_damage))
            raise
        phases.append(time.monotonic())
        # The streams' logical state loads while the ack log does (both only read, after the fence).
        stored = loop.run_in_executor(
            self.executor, partial(load_store_state, self.root, check.offline, only=only)
        )
        try:
            history = await loop.run_in_executor(self.executor, acks.load, only)
        except Exception:
            stored.cancel()
            if self.store_damage:  # a damaged file of the ack log that delta-rs cannot decode
                log.error("cannot load the ack log: %s", "; ".join(self.store_damage))
            raise
        acklog = AckLogWriter(
            acks,
            self.executor,
            history.max_lsn,
            settings.ack_flush_interval_ms / 1000,
            settings.acklog_max_pending,
            settings.acklog_compact_rows,
            history.rows,
        )
        leaf = LeafConnection(LeafTarget.from_settings(settings), name=settings.leaf_name)
        ack_recorder = AckRecorder(acklog)
        registry = Registry(catalog, self.executor, settings.tail_cache_bytes, ack_recorder, leaf)
        recorder = RemovalRecorder(registry, removal_log, self.executor)
        snapshots = Snapshots(
            registry,
            recorder,
            self.root,
            self.executor,
            settings.index_snapshot_interval_ms / 1000,
            settings.index_snapshot_min_new,
            prune=self.claims is None,  # per stream, the other streams' snapshots are their owners'
        )
        await acklog.start()
        await registry.start()
        phases.append(time.monotonic())
        state = await stored
        if self.claims is not None:  # which names a store from before per-stream ownership has
            self.claims.at_start = state
            self.claims.offline = check.offline
        await self._recover(registry, snapshots, history, state)
        phases.append(time.monotonic())
        log.info("recovered %d streams in %.2f s", len(registry.streams), phases[-1] - phases[-2])
        log.info("leaf link hot path: %s (JETLAKE_NO_EXTENSIONS selects python)", protocol.IMPLEMENTATION)
        writer = GroupCommitWriter(table, self.executor, settings.max_pending_bytes, registry.rollback)
        await writer.start()
        delivery = Delivery(
            registry, leaf, self.cold, self.tasks, self._expire_consumer, ack_recorder, self._publish_event
        )
        registry.consumer_removed.connect(delivery.consumer_gone)
        publish = PublishPath(registry, writer, leaf, delivery.kick_stream, settings.domain)
        registry.stream_removed.connect(publish.stream_removed)
        registry.stream_updated.connect(publish.stream_updated)
        sourcing = Sourcing(registry, publish, self.cold, table, self.executor, self.tasks, leaf)
        archives = Archives(
            registry,
            publish,
            recorder,
            ack_recorder,
            self.reader,
            self.executor,
            self.tasks,
            leaf,
            self._publish_event,
        )
        stream_api = StreamApi(
            registry,
            MessageLoader(self.reader, self.executor),
            recorder,
            self._publish_event,
            settings.domain,
            archives,
            lambda: writer.running,
            sourcing.info,
            self._gateways,
        )
        api = Api(
            registry,
            stream_api,
            self.cold.first_seq_at,
            self._publish_event,
            leaf.interest,
            settings.domain,
        )
        dispatcher = LinkDispatcher(
            settings.domain, leaf, registry, publish, delivery, api, sourcing, archives
        )
        leaf.subscribe(dispatcher.api_prefix + ">")
        leaf.subscribe("$JS.ACK.>")
        leaf.subscribe("$JS.FC.>")
        compactor = None
        if settings.compact_min_files:
            compactor = Compactor(
                registry,
                self.root,
                self.executor,
                settings.compact_min_files,
                settings.compact_max_file_bytes,
                settings.compact_interval_ms / 1000,
                settings.compact_idle_ms / 1000,
                table.checkpoint_if_newer,
            )
        core = Core(
            leaf, writer, acklog, registry, publish, delivery, dispatcher, api, recorder, snapshots, compactor
        )
        self.tasks.own(dispatcher.api_worker(), "api-worker")
        self.tasks.own(delivery.ticker(), "consumer-timer")
        self.tasks.own(recorder.run(publish), "removals")
        self.tasks.own(snapshots.run(), "index-snapshots")
        if self.flush_s is not None and self.root.unsynced is not None:
            self.tasks.own(flush_every(self.flush_s, self.executor, self.root.unsynced), "sync-flusher")
        if compactor is not None:
            self.tasks.own(compactor.run(publish), "compaction")
        self.core = core
        self.sourcing = sourcing
        if self.claims is not None:  # per stream: a fenced commit drops its streams, not the store
            self._tables = (table, catalog, removal_log, acks)
            for fenced_by in (writer.loop, acklog.loop, registry.catalog_loop, recorder):
                fenced_by.on_stream_fenced = self.claims.drop
            self._stop_dropping = self.claims.dropped.connect(self._dropped)
            registry.claim = self._claim_new
            registry.let_go = self._let_go
            dispatcher.answers = self.answers
            dispatcher.awaits = self.awaits
            dispatcher.served = self.served
            leaf.admits = self._admits
            assert self.ownership is not None
            self.gathering = Gathering(
                settings.domain,
                self.ownership.name,
                leaf,
                lambda: {**stream_api.summary(), "pending": self._pending()},
            )
            self.gathering.subscribe()
            self._stop_watching = self.gathering.presence.connect(self._presence)
            dispatcher.on_gathering = self.gathering.on_msg
            self.gathering.on_forwarded = dispatcher.forwarded
            dispatcher.forwards = self.forwards
            stream_api.others = self._others
        sourcing.start()
        await leaf.start(dispatcher)
        phases.append(time.monotonic())
        # A crash may have left the newest checkpoint far behind (#22): every start would replay it.
        await loop.run_in_executor(self.executor, table.checkpoint_if_behind)
        took = [f"{b - a:.2f}" for a, b in itertools.pairwise(phases)]
        log.info(
            "started in %.2f s (check, tables, ack log, recovery, serving: %s s)",
            phases[-1] - phases[0],
            ", ".join(took),
        )

    async def claim(self, names: Collection[str]) -> frozenset[str]:
        """Per-stream ownership: take streams ``names`` over and serve them; returns those taken.
        Their next epochs are claimed and fenced in every table before anything of them is read
        (:meth:`StreamClaims.claim`, one commit per table and one read of each for all of them:
        a restart takes its streams back as fast as a start reads a whole store), then they are
        recovered from what was read as at a start (:meth:`_recover`) and their subjects are
        subscribed. A stream another gateway claimed first, or fenced meanwhile, or claimed by
        a newer one while it recovered, is not taken (nor served)."""
        self._claiming |= set(names)
        try:
            return await self._take(names)
        finally:
            self._claiming -= set(names)
            for name in names:  # the requests that waited for them: served now, or not at all
                if (served := self._served.pop(name, None)) is not None:
                    served.set()

    async def _take(self, names: Collection[str]) -> frozenset[str]:
        """:meth:`claim`, the claim and the recovery."""
        core, claims, tables = self.core, self.claims, self._tables
        assert core is not None, "started"
        assert claims is not None, "per stream"
        assert tables is not None, "per stream, started"
        began = time.monotonic()
        claimed = await claims.claim(names, tables, tables[3])
        read_at = time.monotonic()
        taken = frozenset(claimed.epochs)
        # the previous owners' rows of the streams' consumers stay below this writer's
        core.acklog.continue_above(claimed.acks.max_lsn)
        self._recovering |= taken
        try:
            recovered = await self._recover(core.registry, core.snapshots, claimed.acks, claimed.state)
        finally:
            self._recovering -= taken
        for stream in recovered:
            if claims.held.epoch(stream.name) != claimed.epochs.get(stream.name):
                # a newer owner claimed it while it recovered (the drop found nothing installed
                # yet): served here it would take publishes that no commit may store
                core.registry.forget_stream(stream)
                taken -= {stream.name}
                continue
            core.registry.listen(stream)  # its publishes from now on
            core.recorder.changed(stream)  # its expiry timer and delete markers
            core.registry.stream_added.emit(stream)  # its mirror or sources, its compaction
            for consumer in core.registry.consumers.get(stream.name, {}).values():
                core.registry.consumer_changed.emit(consumer)  # its timer looks at it now
        read = {stream.name for stream in recovered} & taken  # none for a stream just created
        if read:  # what recovery read from the files: merged and snapshotted at once, as at a start
            core.snapshots.recovered()
            if core.compactor is not None:
                core.compactor.recovered(read)
        if taken:  # a move's time, where an operator (and bench/several_gateways.py) can see it
            log.info(
                "took over %s in %.2f s (claims, fences and reads %.2f s, recovery %.2f s)",
                ", ".join(sorted(taken)),
                time.monotonic() - began,
                read_at - began,
                time.monotonic() - read_at,
            )
        return taken

    def answers(self, stream: str | None) -> bool:
        """Per stream: whether this gateway answers what names ``stream`` (None: the account-wide
        API). Every gateway hears every API request, ack and flow-control reply, so exactly one
        must answer: the stream's owner; the meta owner answers the account-wide API and names no
        gateway is placed on (a create, a stream that does not exist). A stream placed on a
        gateway that has not claimed it yet gets no answer: its clients time out and ask again."""
        core, claims = self.core, self.claims
        if stream in self._recovering:
            return False  # claimed, not yet recovered
        if stream is not None and core is not None and stream in core.registry.streams:
            return True
        if (
            stream is not None
            and claims is not None
            and stream not in self._claiming
            and claims.held.epoch(stream) is not None
            and self.ownership is not None
            and self.placement.get(stream) == self.ownership.name
        ):
            return True  # deleted here, still placed here: its "not found" is this gateway's
        if not self.meta or self.ownership is None or self.followed < self.ownership.epoch:
            return False
        return stream is None or (stream not in self.placement and stream not in self.forwarded)

    def forwards(self, name: str, msg: Msg) -> bool:
        """``LinkDispatcher.forwards``: the meta owner hands a create of a stream that exists
        nowhere to the gateway :attr:`place_new` puts it on, unless that is this one. A request
        whose config does not parse is answered here (its error is the same everywhere)."""
        ownership = self.ownership
        if self.place_new is None or self.gathering is None or self.core is None or ownership is None:
            return False
        if not self.meta or self.followed < ownership.epoch:
            return False
        registry = self.core.registry
        if name in registry.streams or name in registry.quarantine.streams or name in self.placement:
            return False  # it exists (or is offline here): its gateway answers
        try:
            config = json.loads(msg.data) if msg.data else {}
            target = self.place_new(name, config if isinstance(config, dict) else {})
        except (ValueError, TypeError, KeyError, AttributeError):
            return False
        if target is None or target == ownership.name:
            return False
        self.forwarded[name] = (target, time.monotonic())
        self.gathering.forward(target, msg)
        return True

    def awaits(self, stream: str) -> bool:
        """Per stream, ``LinkDispatcher.awaits``: a stream placed on this gateway and not served
        yet (its claim and recovery to come or under way) will be served here in a moment, unless
        a live gateway still serves it (a handover: that one answers until it lets it go)."""
        ownership, claims = self.ownership, self.claims
        assert ownership is not None, "per stream"
        assert claims is not None, "per stream"
        if self.placement.get(stream) != ownership.name or stream in self.handovers:
            return False
        # held and not claiming: served, or deleted here (then answered "not found" at once)
        return stream in self._claiming or claims.held.epoch(stream) is None

    async def served(self, stream: str) -> bool:
        """Per stream, ``LinkDispatcher.served``: wait until ``stream`` is served here (its claim
        is over, or a lease passed without one); whether it is. A claim that does not come, or
        does not take the stream, leaves the request unanswered."""
        core, ownership = self.core, self.ownership
        assert core is not None, "started"
        assert ownership is not None, "per stream"
        if stream in core.registry.streams and stream not in self._recovering:
            return True
        waiting = self._served.setdefault(stream, asyncio.Event())
        while True:
            try:
                await asyncio.wait_for(waiting.wait(), ownership.lease_s)
                break
            except TimeoutError:
                if stream not in self._claiming:  # no claim came within a lease
                    if self._served.get(stream) is waiting:
                        del self._served[stream]
                    break
        return stream in core.registry.streams and stream not in self._recovering

    def _admits(self) -> bool:
        """Per stream, ``LeafConnection.admits``: what the link reads is served while this
        gateway's last announcement is less than a lease old (no meta owner can have placed its
        streams elsewhere). Older (a pause, a stalled loop), the held streams' leases are looked
        at first (on this slow path only) and those another gateway claimed meanwhile are dropped,
        so nothing is answered from a state their new owner has moved on from. A stream whose
        lease is still this gateway's may be served: no other gateway has written it."""
        ownership, claims = self.ownership, self.claims
        assert ownership is not None, "per stream"
        assert claims is not None, "per stream"
        now = time.monotonic()
        if now - max(ownership.announced_at, self._leases_checked) < ownership.lease_s:
            return True
        held = claims.held
        current = ownership.lease.streams_current(held.streams())
        taken = frozenset(s for s, epoch in current.items() if epoch != held.epoch(s))
        if taken:
            claims.drop(taken)
        self._leases_checked = now
        return True

    async def _others(self) -> Others:
        """Per stream, ``StreamApi.others``: the other live gateways' streams and usage, gathered;
        the streams placed on a gateway that did not answer in time are ``missing``."""
        assert self.gathering is not None, "per stream, started"
        assert self.ownership is not None, "per stream"
        answers = await self.gathering.gather([name for name, _ in self.ownership.gateways().standbys])
        streams: dict[str, Mapping[str, Any]] = {}
        usage = Usage()
        pending = set(self._pending())
        for answer in answers.values():
            usage += Usage(**answer["usage"])
            pending.update(answer.get("pending", ()))
            for info in answer["streams"]:
                streams.setdefault(str(info["config"]["name"]), info)  # one moving: either view
        me, registry = self.ownership.name, self.core.registry if self.core is not None else None
        here = set(registry.streams) | set(registry.quarantine.streams) if registry is not None else set()
        # placed on a gateway that did not answer, or on one that has yet to serve it (moving)
        missing = sorted(
            s
            for s, g in self.placement.items()
            if s not in streams and s not in here and ((g != me and g not in answers) or s in pending)
        )
        return Others(tuple(streams.values()), usage, tuple(missing))

    def _pending(self) -> list[str]:
        """Per stream: the streams placed here that this gateway does not serve yet (their claim
        to come or under way, a handover awaited): a gathering lists them as ``missing``, not as
        gone."""
        claims, ownership = self.claims, self.ownership
        assert claims is not None, "per stream"
        assert ownership is not None, "per stream"
        return sorted(
            s
            for s, g in self.placement.items()
            if g == ownership.name
            and (s in self._claiming or s in self._recovering or claims.held.epoch(s) is None)
        )

    async def follow_tables(self) -> None:
        """Per stream, on an object store: bring the tables forward, the writers (a GET per entry
        since, :meth:`TableAppender.follow`), the message reader's handle (a listing of the log
        and a GET per entry since) and the rows a claim reads back (:attr:`StreamClaims.kept`),
        so that a claim fences and recovers from them rather than catching up on every other
        gateway's commits first (the writers'), replaying the log since its checkpoint (the
        reader's first load: 0.3 s in the S3 takeover test) or fetching every file of the
        catalog, the removal and the ack log (0.3 to 0.4 s). A lease's work
        (``Placing._keep_warm``)."""
        kept = self.claims.kept if self.claims is not None else None
        if self._tables is None or kept is None:  # a local root (or not per stream)
            return
        tables, reader = self._tables, self.reader

        def follow() -> None:
            for table in tables:
                table.follow()
            reader.stream_files("")
            kept.follow()

        await asyncio.get_running_loop().run_in_executor(self.executor, follow)

    async def release(self, name: str) -> None:
        """Per stream: hand stream ``name`` over (placement moved it): its removals recorded, then
        it is no longer served, what was queued for it is committed (its publishers answered),
        and its lease let go (``Lease.release_stream``: the next owner need not wait a lease). The
        next owner's claim fences it in any case."""
        core, claims = self.core, self.claims
        assert core is not None, "started"
        assert claims is not None, "per stream"
        stream = core.registry.streams.get(name)
        if stream is not None:
            try:
                await core.recorder.flush()
            except Exception:  # the next owner applies the limits again at its recovery
                log.exception("recording removals before handing %s over failed", name)
            core.registry.forget_stream(stream)
        for loop in (core.writer.loop, core.acklog.loop, core.registry.catalog_loop):
            try:
                await loop.flush()
            except Exception as exc:  # their waiters heard it; the fence keeps the table right
                log.warning("the %s commits before handing %s over failed: %s", loop.name, name, exc)
        await self._let_go(name)
        log.info("stream %s handed over", name)

    async def _let_go(self, name: str) -> None:
        """Per stream: stream ``name`` no longer held, and its lease released
        (``Lease.release_stream``: the next owner need not wait a lease); also ``Registry.let_go``,
        for a create refused after its claim."""
        claims = self.claims
        assert claims is not None, "per stream"
        epoch = claims.held.epoch(name)
        claims.held.drop(name)
        if epoch is not None and self.ownership is not None:  # the next owner claims at once
            await asyncio.to_thread(self.ownership.lease.release_stream, name, epoch)

    async def drop_passed(self, names: Collection[str]) -> None:
        """Per stream: of the streams ``names`` placed here, those held but not served (deleted
        here, whose held epoch stays) whose lease another gateway has claimed since (the name
        made again there) are no longer held (``StreamClaims.drop``), so that the follower claims
        them again: found held, a stream that came back (its gateway killed before a tick
        recorded where it went) was not claimed and was answered "not found" (#19). One read of
        the lease for them all; none for the streams served here."""
        core, claims, ownership = self.core, self.claims, self.ownership
        assert core is not None, "started"
        assert claims is not None, "per stream"
        assert ownership is not None, "per stream"
        registry = core.registry
        idle = {  # served first: most are, and a dict look-up is cheaper than the epoch's call
            s: epoch
            for s in names
            if s not in registry.streams
            and (epoch := claims.held.epoch(s)) is not None
            and s not in registry.quarantine.streams
            and s not in self._claiming
            and s not in self._recovering
        }
        if not idle:
            return
        lease = ownership.lease
        current = await asyncio.to_thread(lease.streams_current, idle)
        passed = frozenset(s for s, epoch in idle.items() if current[s] > epoch)
        if passed:
            claims.drop(passed)

    async def _claim_new(self, name: str) -> bool:
        """``Registry.claim``: this gateway owns a stream before the catalog commit creating it
        (a no-op for a stream held: False). Another gateway claiming it at once leaves the request
        unanswered (the client times out and asks again), as :class:`StreamFenced`."""
        assert self.claims is not None
        if self.claims.held.epoch(name) is not None:
            return False
        if name not in await self.claim([name]):
            raise StreamFenced(frozenset({name}))
        return True

    def _presence(self, digest: str, present: bool) -> None:
        """``Gathering.presence``: which of the gateways this one heard of came or went."""
        assert self.ownership is not None, "per stream"
        for name in self.ownership.heard():
            if gathering_digest(name) == digest:
                self.ownership.on_hub(name, present)

    def _dropped(self, names: frozenset[str]) -> None:
        """``StreamClaims.dropped``: a newer owner fenced these streams; they leave this gateway
        (registry, subjects, timers, consumers) without a trace in the tables, which are theirs."""
        if self.core is None:
            return
        for name in names:
            stream = self.core.registry.streams.get(name)
            if stream is not None:
                self.core.registry.forget_stream(stream)

    async def _recover(
        self, registry: Registry, snapshots: Snapshots, history: AckLog, recovered: StoreState
    ) -> list[Stream]:
        """Rebuild streams and consumers from the catalog, and stream state from the messages and
        removals tables; then the limits apply again (they remove what they removed before a crash
        that came before the removal was recorded). Consumers' state comes from the ack log,
        ephemeral ones' too: as on the real server with file storage, they come back and go after
        their ``inactive_threshold`` unless someone uses them. Returns the streams installed (all
        of them at a start; per stream, the one claimed, if it is live)."""
        registry.quarantine.streams.update(recovered.quarantine.streams)
        registry.quarantine.ranges += recovered.quarantine.ranges
        installed: list[Stream] = []
        self.store_damage += recovered.problems
        for problem in recovered.problems:
            log.error("%s", problem)
        for name, why in sorted(recovered.quarantine.streams.items()):
            log.error("stream %s is offline: %s", name, why)
        logical = recovered.streams
        for entry in recovered.entries:
            if entry.kind == "stream":
                config = from_json(StreamConfig, entry.body["config"])
                # claimed mid-life: its publishes reach it once it is recovered (``claim``)
                stream = registry.install_stream(config, int(entry.body["created"]), self.claims is None)
                installed.append(stream)
        # the streams' files read side by side (a takeover of five streams on S3 read them one
        # stream after another: 0.8 to 1.2 s), then each restored in the catalog's order
        now = now_ns()
        # one listing for all of them, not a newer one for each read (``MessageReader.stream_files``)
        at_least = await asyncio.get_running_loop().run_in_executor(self.executor, self.reader.version)
        reads = await asyncio.gather(*(self._read_stream(stream, now, at_least) for stream in installed))
        for stream, (stored, through, damage, lost) in zip(installed, reads, strict=True):
            stream.restore_stored(stored)
            snapshots.restored(stream, through, damage)
            state = logical.get(stream.name)
            if state is not None and state.created == stream.created_ns:
                for first, last in state.removed:
                    stream.restore_removed(first, last)
                stream.restore_last_seq(state.last_seq)
            for d in lost:
                if d.file.max_ts >= stream.created_ns:  # not a file of an earlier stream of this name
                    stream.restore_lost(d.file.min_seq, d.file.max_seq)
            replay_headers(stream, stored.headers, now)
            stream.enforce_limits(time.time_ns())
        for entry in recovered.entries:
            if entry.kind == "consumer" and entry.stream in registry.streams:
                # The catalog's entry is the definition (its commit answered the create or the
                # update); the ack log gives the state, and the start only when its create row
                # was cut off (no incarnation of this creation: a fresh state).
                created = int(entry.body["created"])
                cstate = reduce(history.consumers.get((entry.stream, entry.name), []), created)
                logged = cstate.config is not None
                consumer = registry.install_consumer(
                    registry.streams[entry.stream],
                    from_json(ConsumerConfig, entry.body["config"]),
                    created,
                    entry.name,
                    cstate.start_after if logged else int(entry.body.get("start_after") or 0),
                    cstate.skip if logged else list(entry.body.get("skip") or ()),
                )
                consumer.restore(cstate)
        return installed

    async def _read_stream(
        self, stream: Stream, now: int, at_least: int
    ) -> tuple[StoredIndex, int, DamagedSnapshot | None, list[FileDamage]]:
        """What recovery reads of ``stream``: its index (snapshot and the files above it), and its
        damaged files, whose messages are lost as JetStream's file store loses the records of a
        corrupt block (``Stream.restore_lost``): the files below the snapshot are checked here
        (the scan checked the others). Both as of version ``at_least`` of the table or newer."""
        loop = asyncio.get_running_loop()
        since = headers_since(stream.config, stream.created_ns, now)
        stored, through, damage = await loop.run_in_executor(
            self.executor,
            index_snapshot.load_index,
            self.root,
            self.reader,
            stream.name,
            stream.created_ns,
            since,
            stream.record_overhead,
            at_least,
        )
        lost = await loop.run_in_executor(self.executor, self.reader.verify, stream.name, at_least)
        return stored, through, damage, lost

    def _gateways(self) -> Gateways:
        """The store's live gateways (this one alone when it holds no lease)."""
        if self.ownership is None:
            return Gateways(self.settings.leaf_name)
        return self.ownership.gateways()

    async def close(self) -> None:
        """Stop taking work, finish the commit in flight and answer what is owed, then stop."""
        core = self.core
        self._stop_taking()
        if core is not None:
            for stream in core.registry.streams.values():
                for subject in stream.subjects:
                    core.leaf.unsubscribe(subject)
            core.publish.close()
            await core.writer.close()
            await self._leave_state(core)
            await core.registry.close()
            await core.acklog.close()
            await asyncio.sleep(0)  # let the PubAck callbacks of the last commit write
        await self.tasks.close()
        if self.root.unsynced is not None:  # a clean stop leaves nothing unsynced, whatever the interval
            await asyncio.get_running_loop().run_in_executor(self.executor, self.root.unsynced.flush)
        if core is not None:
            await core.leaf.close()
        self.executor.shutdown(wait=True)
        self.claiming.shutdown(wait=True)

    def _stop_taking(self) -> None:
        """No stream comes or goes and no copy starts from here on (the copies in flight finish
        or fail)."""
        if self._stop_dropping is not None:
            self._stop_dropping()
        if self._stop_watching is not None:
            self._stop_watching()
        if self.gathering is not None:
            self.gathering.close()
        if self.sourcing is not None:
            self.sourcing.close()

    @staticmethod
    async def _leave_state(core: Core) -> None:
        """At a clean stop of the owner: the removals and index snapshots the next start reads."""
        try:
            await core.recorder.flush()  # limit removals; recovery would re-derive them anyway
        except Exception:
            log.exception("recording removals at shutdown failed")
        try:
            await core.snapshots.take(every_changed=True)  # the next start reads little
        except Exception:
            log.exception("writing index snapshots at shutdown failed")

    def health(self) -> list[str]:
        """What is broken inside a running gateway (empty: nothing): a background task that died,
        a commit loop that stopped. ``/healthz`` reports it; the log has said it already."""
        problems = [f"task {name} died: {exc!r}" for name, exc in self.tasks.failures.items()]
        problems += [
            f"damaged data file messages/{d.file.path} (stream {d.file.stream}, sequences "
            f"{d.file.min_seq}-{d.file.max_seq}), not served: {d.reason}; see jetlake repair"
            for d in self.reader.damage()
        ]
        problems += self.store_damage
        if self.core is not None:
            problems += [
                f"stream {name} is offline: {why}"
                for name, why in sorted(self.core.registry.quarantine.streams.items())
            ]
            problems += [
                f"damaged index snapshot of stream {name}: {why}; not read (recovered from the "
                "message files), written again at the next snapshot round"
                for name, why in sorted(self.core.snapshots.damaged.items())
            ]
            for loop in (self.core.writer.loop, self.core.acklog.loop, self.core.registry.catalog_loop):
                if not loop.running:
                    problems.append(f"the {loop.name} commit loop has stopped")
        return problems

    # ---- what the components ask of the service ---------------------------------------------

    def _publish_event(self, event: tuple[str, bytes]) -> None:
        """An advisory, as a server in the gateway's JetStream domain publishes it."""
        if self.core is not None:
            self.core.leaf.publish(event[0], advisories.in_domain(event[1], self.settings.domain))

    async def _expire_consumer(self, consumer: Consumer) -> None:
        """A consumer past its ``inactive_threshold`` goes, as on the real server."""
        if self.core is not None and await self.core.registry.remove_consumer(consumer):
            self._publish_event(
                advisories.consumer_action(consumer.stream.name, consumer.name, "delete", time.time_ns())
            )
