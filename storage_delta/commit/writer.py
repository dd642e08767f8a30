"""The group-commit writer: everything that arrived while a commit was in flight forms the next one.

Invariants (docs/storage.md):
* a message is acknowledged only after the Delta version holding it is committed;
* every commit carries the txn ``(app_id, version)``; before retrying a failed commit the writer
  reloads the table and checks ``transaction_version``, so a commit that reported an error but
  landed is never stored twice;
* memory is bounded: past ``max_pending_bytes`` a submit is refused (:class:`WriterOverloaded`) and
  the publisher gets an error instead of a queue that grows without end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_left
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import groupby
from operator import attrgetter

import pyarrow as pa
from deltalake.transaction import AddAction

from storage_delta.commit.deltalog import LocalLogAppender, UnsupportedTable
from storage_delta.commit.stats import BATCH_SIZE_BUCKETS, COMMIT_SECONDS_BUCKETS, Histogram
from storage_delta.commit.store import (
    CommitConflict,
    StoreRoot,
    blind_appends_allowed,
    commit_adds,
    open_or_create,
    retry_listing,
    write_data_file,
)
from storage_delta.format import schema as sch

log = logging.getLogger(__name__)

APP_ID = "jetlake-gateway"


def _notify(waiters: list[asyncio.Future[None]], outcome: BaseException | None) -> None:
    for w in waiters:
        if w.done():
            continue
        if outcome is None:
            w.set_result(None)
        else:
            w.set_exception(outcome)


class WriterOverloaded(Exception):
    """More bytes are waiting for a commit than the writer may hold."""


class WriterClosed(Exception):
    """The writer is shutting down or has failed; nothing more is accepted."""


@dataclass(slots=True)
class StoredMessage:
    """One message as it is stored: what a publish becomes once its stream gave it a sequence."""

    stream: str
    block_size: int
    seq: int
    ts: int
    subject: str
    hdrs: bytes | None
    data: bytes

    @property
    def nbytes(self) -> int:
        return message_bytes(self.subject, self.hdrs, self.data)


def message_bytes(subject: str, hdrs: bytes | None, data: bytes) -> int:
    """What a message counts for against the writer's (and the tail cache's) byte bounds."""
    return len(subject) + len(data) + (len(hdrs) if hdrs else 0) + 48


def _groups(batch: list[StoredMessage]) -> dict[tuple[str, int], list[StoredMessage]]:
    """The batch split by (stream, block). A stream's messages come in long ascending runs, so the
    split works on runs and block boundaries rather than message by message."""
    by_stream: dict[str, list[StoredMessage]] = {}
    for stream, run in groupby(batch, key=_STREAM):
        rows = by_stream.get(stream)
        if rows is None:
            by_stream[stream] = list(run)
        else:
            rows.extend(run)
    groups: dict[tuple[str, int], list[StoredMessage]] = {}
    for stream, rows in by_stream.items():
        size = rows[0].block_size
        seqs = [r.seq for r in rows]
        if seqs == sorted(seqs):  # one Stream's messages (always, but for a name deleted and reused)
            first, last = sch.block_of(seqs[0], size), sch.block_of(seqs[-1], size)
            for block in range(first, last + 1):
                lo, hi = bisect_left(seqs, block * size), bisect_left(seqs, (block + 1) * size)
                if hi > lo:
                    groups[(stream, block)] = rows[lo:hi]
            continue
        for r in rows:
            groups.setdefault((stream, sch.block_of(r.seq, size)), []).append(r)
    return groups


_STREAM = attrgetter("stream")
#: The data file's columns (``MESSAGE_FILE_SCHEMA``): name, how to read it off a message, Arrow type.
_COLUMNS = [(f.name, attrgetter(f.name), f.type) for f in sch.MESSAGE_FILE_SCHEMA]


class MessageTable:
    """The ``messages`` table and its commit routine; runs on a worker thread, never the event loop.

    On a local store root commits go through :class:`LocalLogAppender` (a blind append, no table
    state: its cost does not grow with the table); on an object store through one live delta-rs
    handle. Checkpoints and log cleanup run every ``checkpoint_every`` commits on a thread of their
    own, so a commit never waits for one.
    """

    def __init__(self, root: StoreRoot, checkpoint_every: int = 100) -> None:
        self.root = root
        self.dt = open_or_create(root, sch.MESSAGES, sch.MESSAGE_TABLE_SCHEMA, sch.MESSAGE_PARTITIONS)
        local = root.local_path()
        self._appender = (
            LocalLogAppender(f"{local}/{sch.MESSAGES}", self.dt.version() + 1)
            if local is not None and blind_appends_allowed(self.dt)
            else None
        )
        self._checkpoint_every = checkpoint_every
        self._commits = 0
        self._hygiene_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jetlake-hygiene")
        self._hygiene_running: Future[None] | None = None

    def last_txn_version(self) -> int:
        if self._appender is not None:
            retry_listing(self.dt.update_incremental)
        return self.dt.transaction_version(APP_ID) or 0

    def commit(self, batch: list[StoredMessage], version: int, retries: int = 5) -> None:
        actions = []
        for (stream, block), rows in _groups(batch).items():
            table = pa.table(
                {name: pa.array(list(map(get, rows)), typ) for name, get, typ in _COLUMNS},
                schema=sch.MESSAGE_FILE_SCHEMA,
            )
            actions.append(
                write_data_file(self.root, sch.MESSAGES, {"stream": stream, "block": str(block)}, table)
            )
        if self._appender is not None:
            self._append_local(actions, version)
        else:
            self._commit_delta_rs(actions, version, retries)
        self._commits += 1
        if self._commits % self._checkpoint_every == 0:
            self._start_hygiene()

    def _append_local(self, actions: list[AddAction], version: int) -> None:
        assert self._appender is not None
        try:
            self._appender.append(actions, (APP_ID, version))
        except UnsupportedTable:
            # Someone changed the table's metadata: look again before appending blindly again.
            retry_listing(self.dt.update_incremental)
            if not blind_appends_allowed(self.dt):
                raise
            self._appender.append(actions, (APP_ID, version))

    def _commit_delta_rs(self, actions: list[AddAction], version: int, retries: int) -> None:
        for attempt in range(retries + 1):
            try:
                commit_adds(
                    self.dt, actions, sch.MESSAGE_TABLE_SCHEMA, sch.MESSAGE_PARTITIONS, (APP_ID, version)
                )
                # The handle does not advance past its own commit; without this the next commit
                # would conflict with this one (same app id) and pay for a reload and a retry.
                retry_listing(self.dt.update_incremental)
                return
            except CommitConflict:
                retry_listing(self.dt.update_incremental)
                if self.last_txn_version() >= version:
                    return  # it landed although the call reported an error (delta-rs #2509)
                if attempt == retries:
                    raise

    def _start_hygiene(self) -> None:
        if self._hygiene_running is not None and not self._hygiene_running.done():
            return  # the previous round is still at it; the next interval tries again
        self._hygiene_running = self._hygiene_pool.submit(self._hygiene)

    def _hygiene(self) -> None:
        """Checkpoint and drop expired log files through a fresh handle (a long-lived
        ``DeltaTable`` grows slower with every commit made through it)."""
        try:
            dt = open_or_create(self.root, sch.MESSAGES, sch.MESSAGE_TABLE_SCHEMA, sch.MESSAGE_PARTITIONS)
            dt.create_checkpoint()
            dt.cleanup_metadata()
        except Exception:  # hygiene is best effort; the next interval tries again
            log.exception("checkpoint of messages failed")
            return
        if self._appender is None:
            self.dt = dt

    def close(self) -> None:
        self._hygiene_pool.shutdown(wait=True)


class GroupCommitWriter:
    """Owns the commit loop task; publishers ``await submit(...)`` and are answered after the commit."""

    def __init__(
        self,
        table: MessageTable,
        executor: Executor,
        max_pending_bytes: int,
        on_failure: Callable[[set[str]], None],
    ) -> None:
        self._table = table
        self._on_failure = on_failure
        self._executor = executor
        self._max_pending_bytes = max_pending_bytes
        self._pending: list[StoredMessage] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._pending_bytes = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._in_flight: tuple[list[StoredMessage], list[asyncio.Future[None]]] = ([], [])
        self._closed = False
        self._version = 0
        self.commits = 0
        self.messages_committed = 0
        self.commit_seconds = Histogram(COMMIT_SECONDS_BUCKETS)
        self.batch_messages = Histogram(BATCH_SIZE_BUCKETS)
        self.refused = 0  # messages turned away because too many bytes were waiting

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._version = await loop.run_in_executor(self._executor, self._table.last_txn_version)
        self._task = asyncio.create_task(self._run(), name="group-commit")

    def admit(self, size: int, count: int = 1) -> None:
        """Make room for ``count`` messages of ``size`` bytes in all before their stream gives them
        sequences, so a refusal leaves nothing to undo. The caller submits them
        (``admitted=True``) before it next yields to the event loop."""
        if self._closed:
            raise WriterClosed("writer closed")
        if self._pending_bytes + size > self._max_pending_bytes and self._pending_bytes:
            # Counted here because a core publish has no reply to carry the error.
            self.refused += count
            raise WriterOverloaded(f"{self._pending_bytes} bytes waiting for commit")
        self._pending_bytes += size

    def unadmit(self, size: int) -> None:
        """Give back the room of an admitted message that was not accepted after all."""
        self._pending_bytes -= size

    def submit(self, messages: list[StoredMessage], admitted: bool = False) -> asyncio.Future[None]:
        """Queue messages for the next commit; the future resolves once they are durable."""
        if not admitted:
            self.admit(sum(m.nbytes for m in messages), len(messages))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.extend(messages)
        self._waiters.append(fut)
        if not self._wakeup.is_set():
            self._wakeup.set()
        return fut

    async def _run(self) -> None:
        """The commit loop; should it ever end by an error (or be cancelled), everything it holds
        fails and its streams roll back, so no publisher and nothing waiting on a stream's durable
        sequence waits for a commit that cannot come."""
        try:
            await self._commit_loop()
        except BaseException as exc:
            self._abandon(exc)
            raise

    def _abandon(self, exc: BaseException) -> None:
        """Fail what the dead loop held. Whether the batch in flight landed is unknown; the streams
        still roll back, which is safe because nothing is accepted any more (no sequence can be
        given again) and the next start reads what landed from the table. ``running`` is False
        before ``on_failure`` runs, so it can tell this rollback from a failed commit's."""
        self._closed = True
        batch = self._in_flight[0] + self._pending
        waiters = self._in_flight[1] + self._waiters
        self._in_flight, self._pending, self._waiters, self._pending_bytes = ([], []), [], [], 0
        log.error("the commit loop ended (%r); %d messages fail", exc, len(batch))
        try:
            if batch:
                self._on_failure({m.stream for m in batch})
        finally:
            _notify(waiters, WriterClosed(f"commit loop ended: {exc!r}"))

    async def _commit_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                if self._closed:
                    return
                await self._wakeup.wait()
                self._wakeup.clear()
                continue
            batch, waiters = self._pending, self._waiters
            self._pending, self._waiters, self._pending_bytes = [], [], 0
            self._in_flight = (batch, waiters)
            self._version += 1
            started = time.perf_counter()
            try:
                await loop.run_in_executor(self._executor, self._table.commit, batch, self._version)
            except Exception as exc:
                log.exception("commit of %d messages failed", len(batch))
                landed = await loop.run_in_executor(self._executor, self._table.last_txn_version)
                if landed >= self._version:  # the error came after the commit landed (delta-rs #2509)
                    self._in_flight = ([], [])
                    self._resolve(batch, waiters, time.perf_counter() - started)
                    continue
                # What was queued behind the failed batch holds later sequences of the same streams:
                # storing it would leave a gap, so it fails too and the streams fall back to what is
                # durable.
                batch.extend(self._pending)
                waiters.extend(self._waiters)
                self._pending, self._waiters, self._pending_bytes = [], [], 0
                self._version = await loop.run_in_executor(self._executor, self._table.last_txn_version)
                self._in_flight = ([], [])
                self._on_failure({m.stream for m in batch})
                _notify(waiters, exc)
                continue
            self._in_flight = ([], [])
            self._resolve(batch, waiters, time.perf_counter() - started)

    def _resolve(
        self, batch: list[StoredMessage], waiters: list[asyncio.Future[None]], seconds: float
    ) -> None:
        self.commits += 1
        self.messages_committed += len(batch)
        self.commit_seconds.observe(seconds)
        self.batch_messages.observe(len(batch))
        _notify(waiters, None)

    @property
    def running(self) -> bool:
        """The commit loop is alive and takes submissions (the store is open)."""
        return not self._closed and self._task is not None and not self._task.done()

    async def close(self) -> None:
        """Finish what was submitted, then stop."""
        self._closed = True
        self._wakeup.set()
        if self._task:
            await self._task
        await asyncio.get_running_loop().run_in_executor(self._executor, self._table.close)
