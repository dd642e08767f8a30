"""The gateway: the leaf link, the publish path, the API worker and pull delivery, wired together.

Owns every background task (API worker, commit loop, consumer timer, per-consumer delivery) and
cancels and awaits them on ``close``. Blocking work (delta-rs, parquet) runs on ``executor``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from gateway.adapters.ack_recorder import AckRecorder
from gateway.adapters.coldread import ColdReader
from gateway.adapters.delivery import Delivery
from gateway.adapters.loader import MessageLoader
from gateway.adapters.publish import PublishPath
from gateway.adapters.registry import Registry
from gateway.adapters.removals import RemovalRecorder
from gateway.adapters.snapshots import Snapshots
from gateway.api import advisories
from gateway.api.timefmt import now_ns
from gateway.engine.consumer import Consumer
from gateway.engine.publish_state import headers_since, replay_headers
from gateway.engine.stream import Stream
from gateway.handlers.router import Api, split_api_subject
from gateway.handlers.streams import StreamApi
from gateway.runtime.settings import Settings
from gateway.runtime.tasks import TaskOwner
from gateway.wire.leaf import LeafConnection
from gateway.wire.leafauth import LeafTarget
from gateway.wire.protocol import Msg
from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import GroupCommitWriter, MessageTable
from storage_delta.read import index_snapshot
from storage_delta.read.consumer_log import reduce
from storage_delta.read.reader import MessageReader
from storage_delta.tables.acklog import AckLog, AckLogTable, AckLogWriter
from storage_delta.tables.catalog import CatalogTable
from storage_delta.tables.removals import RemovalLog, load_stream_states

log = logging.getLogger(__name__)

API_QUEUE_SIZE = 4096


class Gateway:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.root = StoreRoot(settings.data_root, settings.storage_options or None)
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="jetlake-io")
        self.api_prefix = f"$JS.{settings.domain}.API."
        self._kv_prefix = self.api_prefix + "$KV."
        self._api_queue: asyncio.Queue[tuple[list[str], str, bytes]] = asyncio.Queue(API_QUEUE_SIZE)
        self.tasks = TaskOwner()
        self.leaf: LeafConnection | None = None
        self.writer: GroupCommitWriter | None = None
        self.acklog: AckLogWriter | None = None
        self.registry: Registry | None = None
        self.publish: PublishPath | None = None
        self.delivery: Delivery | None = None
        self.api: Api | None = None  # the router, once the API worker runs (the monitor asks it too)
        self.recorder: RemovalRecorder | None = None
        self.snapshots: Snapshots | None = None
        self.reader = MessageReader(self.root)
        self.cold = ColdReader(self.reader, self.executor)
        self.api_dropped = 0
        self.started = False

    # ---- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        table, catalog, removal_log, acks = await loop.run_in_executor(
            self.executor,
            lambda: (
                MessageTable(self.root),
                CatalogTable(self.root),
                RemovalLog(self.root),
                AckLogTable(self.root),
            ),
        )
        history = await loop.run_in_executor(self.executor, acks.load)
        self.acklog = AckLogWriter(
            acks,
            self.executor,
            history.max_lsn,
            self.settings.ack_flush_interval_ms / 1000,
            self.settings.acklog_max_pending,
            self.settings.acklog_compact_rows,
            history.rows,
        )
        ack_recorder = AckRecorder(self.acklog)
        self.registry = Registry(
            catalog,
            self.executor,
            self.settings.tail_cache_bytes,
            self._stream_added,
            ack_recorder,
            self._subjects_changed,
        )
        self.recorder = RemovalRecorder(self.registry, removal_log, self.executor)
        self.snapshots = Snapshots(
            self.registry,
            self.recorder,
            self.root,
            self.executor,
            self.settings.index_snapshot_interval_ms / 1000,
            self.settings.index_snapshot_min_new,
        )
        await self.acklog.start()
        t0 = time.monotonic()
        await self._recover(catalog, history)
        log.info("recovered %d streams in %.2f s", len(self.registry.streams), time.monotonic() - t0)
        self.writer = GroupCommitWriter(
            table, self.executor, self.settings.max_pending_bytes, self.registry.rollback
        )
        await self.writer.start()
        self.leaf = LeafConnection(
            LeafTarget.from_settings(self.settings),
            name=self.settings.leaf_name,
            on_msg=self._on_msg,
            on_connected=self._on_connected,
            on_read_done=self._on_read_done,
            on_acks=self._on_acks,
        )
        self.delivery = Delivery(
            self.registry, self.leaf, self.cold, self.tasks, self._expire_consumer, ack_recorder
        )
        self.registry.on_consumer_removed = self.delivery.consumer_gone
        self.publish = PublishPath(self.registry, self.writer, self.leaf, self.delivery.kick_stream)
        self.leaf.subscribe(self.api_prefix + ">")
        self.leaf.subscribe("$JS.ACK.>")
        self.leaf.subscribe("$JS.FC.>")
        for stream in self.registry.streams.values():
            for subject in stream.subjects:
                self.leaf.subscribe(subject)
        self.tasks.own(self._api_worker(), "api-worker")
        self.tasks.own(self.delivery.ticker(), "consumer-timer")
        self.tasks.own(self.recorder.run(self.publish), "removals")
        self.tasks.own(self.snapshots.run(), "index-snapshots")
        await self.leaf.start()
        self.started = True

    async def _recover(self, catalog: CatalogTable, history: AckLog) -> None:
        """Rebuild streams and consumers from the catalog, and stream state from the messages and
        removals tables; then the limits apply again (they remove what they removed before a crash
        that came before the removal was recorded). Durable consumers' state comes from the ack
        log; ephemeral consumers end with the process."""
        assert self.registry is not None
        assert self.snapshots is not None
        loop = asyncio.get_running_loop()
        entries = await loop.run_in_executor(self.executor, catalog.load)
        logical = await loop.run_in_executor(self.executor, load_stream_states, self.root)
        for entry in entries:
            if entry.kind == "stream":
                stream = self.registry.install_stream(entry.body["config"], int(entry.body["created"]))
                now = now_ns()
                since = headers_since(stream.config, stream.created_ns, now)
                stored, through = await loop.run_in_executor(
                    self.executor,
                    index_snapshot.load_index,
                    self.root,
                    self.reader,
                    stream.name,
                    stream.created_ns,
                    since,
                )
                stream.restore_stored(stored)
                self.snapshots.restored(stream, through)
                state = logical.get(stream.name)
                if state is not None and state.created == stream.created_ns:
                    for first, last in state.removed:
                        stream.restore_removed(first, last)
                    stream.restore_last_seq(state.last_seq)
                replay_headers(stream, stored.headers, now)
                stream.enforce_limits(time.time_ns())
            elif entry.kind == "consumer" and entry.stream in self.registry.streams:
                created = int(entry.body["created"])
                cstate = reduce(history.consumers.get((entry.stream, entry.name), []), created)
                consumer = self.registry.install_consumer(
                    self.registry.streams[entry.stream],
                    cstate.config or entry.body["config"],
                    created,
                    entry.name,
                    cstate.start_after if cstate.config else int(entry.body.get("start_after") or 0),
                    cstate.skip,
                )
                consumer.restore(cstate)
                if not entry.body["config"].get("durable_name"):
                    await self.registry.remove_consumer(consumer)  # ephemeral: ends with the process

    def _on_connected(self, info: dict[str, object]) -> None:
        if self.registry is not None and info.get("version"):
            self.registry.server_version = str(info["version"])

    async def close(self) -> None:
        """Stop taking work, finish the commit in flight and answer what is owed, then stop."""
        if self.leaf is not None:
            for stream in self.registry.streams.values() if self.registry else []:
                for subject in stream.subjects:
                    self.leaf.unsubscribe(subject)
        if self.writer is not None:
            await self.writer.close()
        if self.recorder is not None:
            try:
                await self.recorder.flush()  # limit removals; recovery would re-derive them anyway
            except Exception:
                log.exception("recording removals at shutdown failed")
        if self.snapshots is not None:
            try:
                await self.snapshots.take(every_changed=True)  # the next start reads little
            except Exception:
                log.exception("writing index snapshots at shutdown failed")
        if self.acklog is not None:
            await self.acklog.close()
        await asyncio.sleep(0)  # let the PubAck callbacks of the last commit write
        await self.tasks.close()
        if self.leaf is not None:
            await self.leaf.close()
        self.executor.shutdown(wait=True)

    # ---- inbound ----------------------------------------------------------------------------

    def _on_msg(self, msg: Msg) -> None:
        delivery = self.delivery
        assert delivery is not None
        assert self.publish is not None
        subject = msg.subject
        if delivery.queued_acks:
            delivery.apply_acks()  # what this message sees or changes comes after them
        if subject[:1] != "$":  # none of the prefixes below: a publish (most messages)
            self.publish.on_publish(msg)
            return
        is_api = subject.startswith(self.api_prefix)
        if is_api and subject.startswith(self._kv_prefix):
            # A KV publish: leaf links may not carry $KV.>, so the hub maps it into the API
            # domain (DESIGN); it is stored under its $KV subject.
            msg.subject = subject[len(self.api_prefix) :]
            self.publish.on_kv_publish(msg)
            return
        self.publish.accept_queued()  # what this message sees or changes comes after them
        if is_api:
            toks = split_api_subject(subject, self.api_prefix) or []
            if toks[:3] == ["CONSUMER", "MSG", "NEXT"] and len(toks) == 5:
                delivery.pull_request(toks[3], toks[4], msg.reply, msg.data)
                return
            try:
                self._api_queue.put_nowait((toks, msg.reply, msg.data))
            except asyncio.QueueFull:
                self.api_dropped += 1
            return
        if subject.startswith("$JS.ACK."):
            delivery.on_ack(subject, msg.reply, msg.data)
            return
        if subject.startswith("$JS.FC."):
            delivery.on_flow_control(subject)
            return
        self.publish.on_publish(msg)

    def _on_acks(self, found: list[tuple[bytes, bytes, bytes, bytes]]) -> None:
        """Plain acks from the leaf link: queued, applied before the next message or at the end
        of the read (:meth:`Delivery.apply_acks`), so every change happens in link order."""
        assert self.delivery is not None
        assert self.publish is not None
        if not self.delivery.queued_acks:
            self.publish.accept_queued()  # what these acks see or change comes after them
        self.delivery.queued_acks += found

    def _on_read_done(self) -> None:
        if self.delivery is not None:
            self.delivery.apply_acks()
        if self.publish is not None:
            self.publish.flush()

    async def _api_worker(self) -> None:
        assert self.registry is not None
        assert self.leaf is not None
        assert self.recorder is not None
        loader = MessageLoader(self.reader, self.executor)
        self.api = api = Api(
            self.registry,
            StreamApi(
                self.registry,
                loader,
                self.recorder,
                self._publish_event,
                lambda: self.writer is not None and self.writer.running,
            ),
            self.cold.first_seq_at,
            self._publish_event,
        )
        while True:
            toks, reply, body = await self._api_queue.get()
            try:
                answer = await api.handle(toks, body)
            except Exception:
                log.exception("API request %s failed", ".".join(toks))
                continue
            if answer is None:
                continue
            if not reply:
                continue
            if isinstance(answer, list):
                for raw in answer:
                    self.leaf.publish(reply, raw.data, hdrs=raw.hdrs or None)
                continue
            self.registry.api_total += 1
            if "error" in answer:
                self.registry.api_errors += 1
            self.leaf.publish(reply, json.dumps(answer, separators=(",", ":")).encode())

    def _publish_event(self, event: tuple[str, bytes]) -> None:
        if self.leaf is not None:
            self.leaf.publish(event[0], event[1])

    async def _expire_consumer(self, consumer: Consumer) -> None:
        """A consumer past its ``inactive_threshold`` goes, as on the real server."""
        assert self.registry is not None
        if await self.registry.remove_consumer(consumer):
            self._publish_event(
                advisories.consumer_action(consumer.stream.name, consumer.name, "delete", time.time_ns())
            )

    def _stream_added(self, stream: Stream) -> None:
        self._subjects_changed([], stream.subjects)

    def _subjects_changed(self, old: list[str], new: list[str]) -> None:
        """A stream was added, updated or deleted: route its subjects anew and tell the server which
        subjects the gateway listens to (a deleted stream's subjects get no responders again)."""
        if self.publish is not None:
            self.publish.streams_changed()
        if self.leaf is not None:
            for subject in old:
                if subject not in new:
                    self.leaf.unsubscribe(subject)
            for subject in new:
                if subject not in old:
                    self.leaf.subscribe(subject)
