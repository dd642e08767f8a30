"""The group-commit writer: everything that arrived while a commit was in flight forms the next one.

Invariants (docs/storage.md):
* a message is acknowledged only after the Delta version holding it is committed;
* every commit carries the txn ``(app_id, version)`` and goes through the one commit loop
  (:mod:`storage_delta.commit.loop`), whose failure policy checks the table before giving up, so a
  commit that reported an error but landed is never stored twice;
* memory is bounded: past ``max_pending_bytes`` a submit is refused (:class:`WriterOverloaded`) and
  the publisher gets an error instead of a queue that grows without end.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from itertools import groupby
from operator import attrgetter

import pyarrow as pa

from storage_delta.commit.append import TableSpec, WriterTable
from storage_delta.commit.loop import CommitLoop
from storage_delta.commit.owner import commit_without_fenced
from storage_delta.format import schema as sch

APP_ID = "jetlake-gateway"
#: Entries of ``messages``' log kept below its newest checkpoint at most, whatever
#: ``log_retention_ms`` says: delta-rs lists all of ``_delta_log`` on every load, and an hour of a
#: stream written one message per commit (300,000 entries) cost each load of the table (every
#: restart, takeover, cold read's catch-up and independent reader) about a second. Nothing of
#: jetlake reads an older version of ``messages`` (queries plan from the newest; the change feed's
#: offsets are the ``removals`` table's), so only time travel further back than this is lost.
LOG_KEEP_ENTRIES = 10_000
MESSAGES_TABLE = TableSpec(sch.MESSAGES, sch.MESSAGE_TABLE_SCHEMA, tuple(sch.MESSAGE_PARTITIONS))


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
    #: For a message copied from another stream by a stream source: the source's app id and the
    #: origin sequence, recorded as an app transaction in the commit that stores it, so the Delta
    #: log says how far each source got (exactly once across restarts).
    origin: tuple[str, int] | None = None

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


class MessageTable(WriterTable):
    """The ``messages`` table's commit routine; runs on a worker thread, never the event loop.

    One file per (stream, block) touched, all in one Delta version tagged ``(jetlake-gateway, n)``,
    through the one append primitive (:class:`~storage_delta.commit.append.TableAppender`).
    """

    SPEC = MESSAGES_TABLE
    APP_ID = APP_ID
    LOG_KEEP_ENTRIES = LOG_KEEP_ENTRIES
    #: A checkpoint every 100 commits, but at most one a second unless 1,000 commits came: under
    #: a synchronous publisher (hundreds of one-message commits a second) a restart then replays
    #: at most about a second's entries (0.2 ms each through delta-rs), and the checkpoints, the
    #: writer's fresh handle after each, cost a third to a quarter of what they did (#23).
    CHECKPOINT_MIN_INTERVAL_S = 1.0

    def last_txn_version(self) -> int:
        return self._appender.committed_version()

    def position(self, app_id: str) -> int:
        """How far the commits recorded for ``app_id`` (a stream source) got; 0 before any.
        Blocking: belongs on a worker thread."""
        return self._appender.transaction_version(app_id)

    def commit(self, batch: list[StoredMessage], version: int) -> frozenset[str]:
        """Commit ``batch`` as version ``version``; returns the streams found fenced (per-stream
        ownership), whose rows were left out while the others' were committed. When every stream
        was fenced nothing is committed and ``version`` stays unused: txn versions only need to
        grow, not to be contiguous."""

        def attempt(left_out: frozenset[str]) -> None:
            rows = [m for m in batch if m.stream not in left_out] if left_out else batch
            if rows:
                self._append(rows, version)

        return commit_without_fenced(attempt)

    def _append(self, batch: list[StoredMessage], version: int) -> None:
        positions: dict[str, int] = {}
        for m in batch:
            if m.origin is not None:
                positions[m.origin[0]] = max(positions.get(m.origin[0], 0), m.origin[1])
        groups = _groups(batch)
        self._appender.append(
            [
                (
                    {"stream": stream, "block": str(block)},
                    pa.table(
                        {name: pa.array(list(map(get, rows)), typ) for name, get, typ in _COLUMNS},
                        schema=sch.MESSAGE_FILE_SCHEMA,
                    ),
                )
                for (stream, block), rows in groups.items()
            ],
            version,
            sorted(positions.items()),
            {stream for stream, _ in groups},
        )

    def checkpoint_if_behind(self) -> bool:
        """See :meth:`TableAppender.checkpoint_if_behind`. Blocking (a file read)."""
        return self._appender.checkpoint_if_behind()

    def checkpoint_if_newer(self) -> bool:
        """See :meth:`TableAppender.checkpoint_if_newer`. Blocking (a listing of the log's tail)."""
        return self._appender.checkpoint_if_newer()

    def close(self) -> None:
        self._appender.close()


class GroupCommitWriter:
    """The messages' front of the commit loop: publishers ``submit`` and are answered after the
    commit. A failed commit is not retried (``retry_s`` 0): the publisher gets JetStream's
    store-failed error at once and may retry with its ``Nats-Msg-Id``; the streams of the failed
    rows fall back to what is durable (``on_failure``)."""

    def __init__(
        self,
        table: MessageTable,
        executor: Executor,
        max_pending_bytes: int,
        on_failure: Callable[[set[str]], None],
    ) -> None:
        self._table = table
        self._executor = executor
        self._max_pending_bytes = max_pending_bytes
        self._pending_bytes = 0
        #: The commit loop: its counters (commits, rows, latency and batch histograms) are the
        #: writer's.
        self.loop: CommitLoop[StoredMessage] = CommitLoop(
            "messages",
            executor,
            table.commit,
            table.last_txn_version,
            lambda rows, _exc: on_failure({m.stream for m in rows}),
            drained=self._drained,
            stream_of=_STREAM,
        )
        self._per_stream = table.per_stream
        self.refused = 0  # messages turned away because too many bytes were waiting

    async def start(self) -> None:
        await self.loop.start()

    def _drained(self, _rows: list[StoredMessage]) -> None:
        """The bound counts what waits for the next commit, not the commit in flight."""
        self._pending_bytes = 0

    def admit(self, size: int, count: int = 1) -> None:
        """Make room for ``count`` messages of ``size`` bytes in all before their stream gives them
        sequences, so a refusal leaves nothing to undo. The caller submits them
        (``admitted=True``) before it next yields to the event loop."""
        if not self.loop.running:
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
        self.loop.pending.extend(messages)
        # per stream: a submit of one stream's messages (a publish, a batch) fails only with it
        stream = messages[0].stream if self._per_stream and messages else None
        if stream is not None and any(m.stream != stream for m in messages):
            stream = None
        fut = self.loop.queued(sync=True, added=len(messages), stream=stream)
        assert fut is not None
        return fut

    @property
    def running(self) -> bool:
        """The commit loop is alive and takes submissions (the store is open)."""
        return self.loop.running

    async def close(self) -> None:
        """Finish what was submitted, then stop."""
        await self.loop.close()
        await asyncio.get_running_loop().run_in_executor(self._executor, self._table.close)
