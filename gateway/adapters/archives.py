"""Stream snapshots and restores over the server's chunked protocol (``$JS.API.STREAM.SNAPSHOT``
and ``STREAM.RESTORE``), with jetlake's own archive (:mod:`storage_delta.format.archive`).

A snapshot takes the stream's live committed messages (its index at one instant: every row they
name is immutable in Delta) and its consumers' state at that instant on the loop, then reads the
rows on the executor span by span and sends the archive to the deliver subject in chunks, each
with a reply subject for its ack; a window of unacked chunks bounds what is in flight, as on the
server (``streamSnapshot``: chunk size 1 KiB..1 MiB, window 1 KiB..32 MiB, 5 s for an ack, an
empty closing message with status 204, or 408/500 and the reason).

A restore answers with a deliver subject; each chunk the client sends there (with a reply) is
written to a spool file and acknowledged with an empty message; an archive that is not
jetlake's is refused at its first chunk (500/10062 on that chunk's reply). The closing empty
message rebuilds the stream through the commit primitive (messages at their sequences, the
removed ones recorded, consumers through the ack log), durable before its stream info answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gateway.adapters.ack_recorder import AckRecorder
from gateway.adapters.publish import PublishPath
from gateway.adapters.registry import Registry
from gateway.adapters.removals import RemovalRecorder
from gateway.api import advisories, errors
from gateway.api.configs import ConsumerConfig, StreamConfig, from_json, to_json
from gateway.api.timefmt import now_ns, rfc3339
from gateway.engine.consumer import Consumer
from gateway.engine.publish_state import replay_headers
from gateway.engine.stream import Stream
from gateway.runtime.tasks import TaskOwner
from gateway.wire.leaf import LeafConnection
from gateway.wire.protocol import Msg
from storage_delta.commit.writer import StoredMessage, WriterOverloaded, message_bytes
from storage_delta.format import archive
from storage_delta.read.consumer_log import ConsumerState, PendingState, reduce
from storage_delta.read.reader import MessageReader

log = logging.getLogger(__name__)

PREFIX = "$JS.SNAPSHOT."
#: The server's defaults and bounds (``streamSnapshot``).
CHUNK_SIZE = 128 * 1024
WINDOW_SIZE = 8 * 1024 * 1024
ACK_TIMEOUT_S = 5.0
INTEREST_WAIT_S = 2.0
#: A restore that hears nothing for this long is given up, silently (the server's ``is stalled``).
RESTORE_IDLE_S = 5.0
#: Chunks a restore holds before writing them: clients send one and wait for its ack.
RESTORE_QUEUE = 64
#: Sequences read from Delta at a time for a snapshot, and messages committed at a time by a restore.
READ_SPAN = 8192
RESTORE_BATCH = 1024
SPOOL_MEMORY = 8 * 1024 * 1024

Events = Callable[[tuple[str, bytes]], None]


def clamp_window(chunk_size: int, window_size: int) -> tuple[int, int]:
    """The chunk size and the number of chunks in flight, as the server bounds them."""
    chunk = min(max(1024, chunk_size or CHUNK_SIZE), 1024 * 1024)
    window = max(min(max(1024, window_size or WINDOW_SIZE), 32 * 1024 * 1024), chunk)
    return chunk, window // chunk


@dataclass(slots=True)
class Restore:
    """One restore in progress: the chunks its subject received, waiting to be written."""

    stream: str
    config: StreamConfig
    subject: str
    queue: asyncio.Queue[Msg] = field(default_factory=lambda: asyncio.Queue(RESTORE_QUEUE))
    #: More chunks came than the queue holds: the restore failed (that chunk was told), it ends.
    overrun: bool = False


class Archives:
    def __init__(
        self,
        registry: Registry,
        publish: PublishPath,
        recorder: RemovalRecorder,
        acks: AckRecorder,
        reader: MessageReader,
        executor: Executor,
        tasks: TaskOwner,
        leaf: LeafConnection,
        events: Events,
    ) -> None:
        self.reg = registry
        self.publish = publish
        self.recorder = recorder
        self.acks = acks
        self.reader = reader
        self.executor = executor
        self.tasks = tasks
        self.leaf = leaf
        self.events = events
        self._restores: dict[str, Restore] = {}
        #: A snapshot's ack subject prefix -> its free window slots.
        self._windows: dict[str, asyncio.Queue[None]] = {}

    def on_msg(self, msg: Msg) -> None:
        """A chunk of a restore, or the ack of a snapshot's chunk (``$JS.SNAPSHOT.``)."""
        restore = self._restores.get(msg.subject)
        if restore is not None:
            if restore.overrun:
                return
            try:
                restore.queue.put_nowait(msg)
            except asyncio.QueueFull:
                # a client that does not wait for its acks: the archive would have a hole
                restore.overrun = True
                if msg.reply:
                    why = "chunks sent faster than they are acknowledged"
                    self.leaf.publish(msg.reply, json.dumps(_restore_failed(why)).encode())
            return
        window = self._windows.get(msg.subject.rsplit(".", 2)[0])
        if window is not None and not window.full():
            window.put_nowait(None)

    # ---- snapshot ---------------------------------------------------------------------------------

    def snapshot(
        self, stream: Stream, deliver: str, no_consumers: bool, chunk_size: int, window_size: int
    ) -> dict[str, Any]:
        """Capture the stream now and start sending its archive; the state to answer with."""
        through, stored = stream.stored_snapshot()
        state = stream.info_state(len(self.reg.listed_consumers(stream.name)))
        consumers = [] if no_consumers else self._consumers(stream)
        header = {
            "stream": stream.name,
            "config": to_json(stream.config),
            "state": {"first_seq": stream.state.first_seq, "last_seq": through},
            "consumers": consumers,
        }
        token = uuid.uuid4().hex
        self.tasks.own(
            self._send(stream, header, stored.seq, deliver, state, chunk_size, window_size, token),
            f"snapshot-{stream.name}-{token}",
        )
        return state

    def _consumers(self, stream: Stream) -> list[dict[str, Any]]:
        out = []
        for consumer in self.reg.listed_consumers(stream.name):
            saved = consumer.saved_state()
            out.append(
                {
                    "name": consumer.name,
                    "config": to_json(consumer.config),
                    "start_after": saved.start_after,
                    "skip": saved.skip,
                    "delivered": [saved.delivered_cseq, saved.delivered_sseq],
                    "ack_floor": [saved.floor_cseq, saved.floor_sseq],
                    "pending": [
                        [s, p.cseq, p.deliveries, p.since_ns] for s, p in sorted(saved.pending.items())
                    ],
                    "redelivered": sorted(saved.redelivered),
                }
            )
        return out

    def _pieces(self, stream: Stream, header: dict[str, Any], seqs: np.ndarray) -> Iterator[bytes]:
        """The archive's bytes, read span by span (on the executor, one ``next`` at a time)."""

        def spans() -> Iterator[pa.Table]:
            for i in range(0, len(seqs), READ_SPAN):
                part = seqs[i : i + READ_SPAN]
                first, last = int(part[0]), int(part[-1])
                rows = self.reader.read_range(stream.name, first, last, stream.block_size, stream.created_ns)
                rows = rows.filter(pc.is_in(rows["seq"], pa.array(part, pa.int64())))
                if rows.num_rows != len(part):
                    raise RuntimeError(f"{len(part) - rows.num_rows} messages could not be read")
                yield rows

        return archive.encode(header, spans())

    async def _send(
        self,
        stream: Stream,
        header: dict[str, Any],
        seqs: np.ndarray,
        deliver: str,
        state: dict[str, Any],
        chunk_size: int,
        window_size: int,
        token: str,
    ) -> None:
        name = stream.name
        start = now_ns()
        self.events(advisories.archive_event("snapshot_create", name, start, state=state))
        chunk, slots = clamp_window(chunk_size, window_size)
        window: asyncio.Queue[None] = asyncio.Queue(slots)
        for _ in range(slots):
            window.put_nowait(None)
        ack = f"{PREFIX}ACK.{name}.{token}"
        self._windows[ack] = window
        self.leaf.subscribe(ack + ".>")
        status: bytes | None = None
        error = ""
        loop = asyncio.get_running_loop()
        pieces = self._pieces(stream, header, seqs)
        listening = False

        def interest_changed() -> None:
            # the receiver went away: wake a wait for a slot, which then ends the snapshot
            if listening and not self.leaf.interest.has(deliver) and not window.full():
                window.put_nowait(None)

        disconnect = self.leaf.interest.changed.connect(interest_changed)
        try:
            listening = await self._listener(deliver)
            buffered, index, ended = bytearray(), 1, False
            while True:
                # as the server: a free slot of the window before each chunk, the last one too
                try:
                    await asyncio.wait_for(window.get(), ACK_TIMEOUT_S)
                except TimeoutError:
                    error, status = "no flow response", b"NATS/1.0 408 No Flow Response\r\n\r\n"
                    break
                if listening and not self.leaf.interest.has(deliver):
                    error, status = "no interest", b"NATS/1.0 408 No Interest\r\n\r\n"
                    break
                while len(buffered) < chunk and not ended:
                    piece = await loop.run_in_executor(self.executor, next, pieces, None)
                    ended = piece is None
                    buffered += piece or b""
                if len(buffered) < chunk:  # the last, short chunk goes without a reply
                    if buffered:
                        self.leaf.publish(deliver, bytes(buffered))
                    break
                part = bytes(buffered[:chunk])
                del buffered[:chunk]
                self.leaf.publish(deliver, part, f"{ack}.{len(part)}.{index}")
                status = status or b"NATS/1.0 204\r\n\r\n"
                index += 1
        except Exception as exc:
            log.exception("snapshot of %s failed", name)
            error = str(exc)
            status = b"NATS/1.0 500 %s\r\n\r\n" % error.encode()
        finally:
            disconnect()
            self.leaf.unsubscribe(ack + ".>")
            del self._windows[ack]
        self.leaf.publish(deliver, b"", hdrs=status)
        extra = {"error": error} if error else {}
        end = now_ns()
        self.events(advisories.archive_event("snapshot_complete", name, end, start=start, end=end, **extra))

    async def _listener(self, deliver: str) -> bool:
        """Whether someone listens on ``deliver``, given up to ``INTEREST_WAIT_S`` to come, as the
        server waits (a snapshot to nobody goes on, and ends for want of acks)."""
        interest = self.leaf.interest
        if interest.has(deliver):
            return True
        came = asyncio.Event()

        def changed() -> None:
            if interest.has(deliver):
                came.set()

        disconnect = interest.changed.connect(changed)
        try:
            await asyncio.wait_for(came.wait(), INTEREST_WAIT_S)
        except TimeoutError:
            return False
        finally:
            disconnect()
        return True

    # ---- restore ----------------------------------------------------------------------------------

    def restore(self, config: StreamConfig) -> str:
        """Start a restore of ``config``'s stream; the subject its chunks go to."""
        subject = f"{PREFIX}RESTORE.{config.name}.{uuid.uuid4().hex}"
        restore = Restore(config.name, config, subject)
        self._restores[subject] = restore
        self.leaf.subscribe(subject)
        self.tasks.own(self._receive(restore), f"restore-{config.name}")
        return subject

    async def _receive(self, restore: Restore) -> None:
        name, loop = restore.stream, asyncio.get_running_loop()
        start = now_ns()
        self.events(advisories.archive_event("restore_create", name, start))
        spool = tempfile.SpooledTemporaryFile(SPOOL_MEMORY)  # noqa: SIM115 (closed below)
        total, reply, head, stalled = 0, "", b"", False
        answer: dict[str, Any] | None = None
        try:
            while True:
                try:
                    msg = await asyncio.wait_for(restore.queue.get(), RESTORE_IDLE_S)
                except TimeoutError:  # given up without an answer or advisory, as the server
                    log.warning("restore of %s stalled: no chunk for %.0f s", name, RESTORE_IDLE_S)
                    stalled = True
                    return
                reply = msg.reply
                if restore.overrun:
                    reply = ""
                    break
                if not reply:
                    log.warning("restore of %s: a chunk without a reply subject", name)
                    break
                if not msg.data:
                    answer = await self._rebuild(restore.config, spool, total)
                    break
                if len(head) < len(archive.MAGIC):
                    head = (head + msg.data)[: len(archive.MAGIC)]
                    try:
                        archive.check_magic(head)
                    except archive.NotAnArchive as exc:
                        answer = _restore_failed(str(exc))
                        break
                try:
                    await loop.run_in_executor(self.executor, spool.write, msg.data)
                except OSError as exc:  # the spool's disk is full or failing
                    answer = _restore_failed(str(exc))
                    break
                total += len(msg.data)
                self.leaf.publish(reply, b"")
        finally:
            del self._restores[restore.subject]
            self.leaf.unsubscribe(restore.subject)
            await loop.run_in_executor(self.executor, spool.close)
            end = now_ns()
            if not stalled:
                self.events(
                    advisories.archive_event("restore_complete", name, end, start=start, end=end, bytes=total)
                )
        if answer is not None and reply:
            self.leaf.publish(reply, json.dumps(answer, separators=(",", ":")).encode())

    async def _rebuild(self, config: StreamConfig, spool: IO[bytes], total: int) -> dict[str, Any]:
        """The stream of the archive in ``spool``, durable; its create answer or the error."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.executor, spool.seek, 0)
            if not total:
                raise archive.NotAnArchive("the archive is empty")
            header = await loop.run_in_executor(self.executor, archive.read_header, spool)
        except archive.NotAnArchive as exc:
            return _restore_failed(str(exc))
        if config.name in self.reg.streams:
            return {"type": TYPE, "error": errors.STREAM_NAME_EXIST_RESTORE_FAILED.render()}
        try:
            stream = await self.reg.add_stream(config, now_ns())
        except Exception as exc:  # the catalog's commit failed: nothing was created
            log.exception("restore of %s failed", config.name)
            return _restore_failed(str(exc))
        self.events(advisories.stream_action(config.name, "create", now_ns()))
        try:
            # The consumers come first, so an interest stream keeps what they still want (with
            # none, it would keep nothing); they take up their state again once the messages are
            # there, which counts what they still have to deliver.
            consumers = [await self._consumer(stream, entry) for entry in header["consumers"]]
            await self._messages(stream, archive.read_batches(spool))
            stream.skip_to(int(header["state"]["last_seq"]))
            await self.recorder.flush()
            for consumer, state in consumers:
                consumer.restore(state)
                self.reg.consumer_changed.emit(consumer)
        except Exception as exc:
            log.exception("restore of %s failed", config.name)
            if config.name in self.reg.streams:
                await self.reg.remove_stream(stream)
            return _restore_failed(str(exc))
        return {"type": TYPE, **self._info(stream)}

    async def _messages(self, stream: Stream, batches: Iterator[pa.RecordBatch]) -> None:
        """Commit the archive's messages at their sequences, a batch at a time, each durable
        before the next is read (a mirror's path: the holes between them are removed messages);
        then what their headers ask (TTLs, delete markers) as at a restart, but the duplicate
        window, which the server's restore leaves empty too."""
        loop = asyncio.get_running_loop()
        writer = self.publish.writer
        headers: list[tuple[int, int, bytes | None]] = []

        def next_rows() -> list[dict[str, Any]] | None:
            batch = next(batches, None)
            return None if batch is None else batch.to_pylist()

        while (rows := await loop.run_in_executor(self.executor, next_rows)) is not None:
            for i in range(0, len(rows), RESTORE_BATCH):
                copies: list[StoredMessage] = []
                for row in rows[i : i + RESTORE_BATCH]:
                    subject, hdrs, data = row["subject"], row["hdrs"], row["data"]
                    while True:
                        try:
                            writer.admit(message_bytes(subject, hdrs, data))
                            break
                        except WriterOverloaded:  # others' messages wait too: ours first, then room
                            if copies:
                                await self.publish.store_copies(stream, copies)
                                copies = []
                            await writer.loop.flush()
                    copy = stream.accept_mirrored(int(row["seq"]), int(row["ts"]), subject, hdrs, data)
                    copies.append(copy)
                    if hdrs:
                        headers.append((copy.seq, copy.ts, hdrs))
                if copies:
                    await self.publish.store_copies(stream, copies)
        replay_headers(stream, headers, now_ns(), dedup=False)
        self.recorder.changed(stream)  # the TTLs' expiry timed

    async def _consumer(self, stream: Stream, entry: dict[str, Any]) -> tuple[Consumer, ConsumerState]:
        """One consumer of the archive, durable (catalog and ack log) before it is installed
        with the state the ack log's reducer rebuilds from its rows, as at a restart."""
        config = from_json(ConsumerConfig, entry["config"])
        name, created = str(entry["name"]), now_ns()
        (dc, ds), (fc, fs) = entry["delivered"], entry["ack_floor"]
        saved = ConsumerState(
            created_ns=created,
            config=entry["config"],
            start_after=int(entry["start_after"]),
            skip=[int(s) for s in entry["skip"]],
            delivered_cseq=dc,
            delivered_sseq=ds,
            floor_cseq=fc,
            floor_sseq=fs,
            pending={int(s): PendingState(int(c), int(n), int(t)) for s, c, n, t in entry["pending"]},
            redelivered={int(s) for s in entry["redelivered"]},
        )
        await self.reg.persist_consumer(stream, config, created, name, saved.start_after)
        rows = await self.acks.restored(stream.name, name, saved)
        state = reduce(rows, created)
        state.delivered_ns = state.floor_ns = 0  # the server keeps no last_active across a restore
        consumer = self.reg.install_consumer(stream, config, created, name, state.start_after, state.skip)
        consumer.restore(state)
        return consumer, state

    def _info(self, stream: Stream) -> dict[str, Any]:
        """The restored stream as the server's restore answer shows it (no domain, no cluster)."""
        return {
            "config": to_json(stream.config),
            "created": rfc3339(stream.created_ns),
            "state": stream.info_state(len(self.reg.listed_consumers(stream.name))),
            "ts": rfc3339(time.time_ns()),
        }


TYPE = "io.nats.jetstream.api.v1.stream_create_response"


def _restore_failed(why: str) -> dict[str, Any]:
    return {"type": TYPE, "error": errors.STREAM_RESTORE_FAILED.format(err=why).render()}
