"""The ``acks`` table: every consumer state change, appended in group commits, folded by compaction.

Invariants (docs/storage.md):
* rows are ordered by ``lsn``, which grows with every row the gateway submits; a commit holds a
  contiguous run of them, and commits land in submission order;
* every row carries the consumer's positions after its change (last delivered stream and consumer
  sequence, ack floor), so a consumer's positions are those of its newest row;
* an incarnation of a consumer starts at its ``create`` row and ends at a ``delete`` row; rows before
  the last ``create`` or ``delete`` belong to an earlier consumer of the same name;
* compaction replaces a consumer's rows at or below its ack floor (and its ``create``/``config``/older
  ``state`` rows) by one ``state`` row with the lsn of the newest row it folds; rows above the floor
  are kept as they are. Replaying the folded table gives the same state as replaying the original.

Compaction commits a Delta overwrite built from the snapshot it read: the files of that snapshot are
removed and the folded rows added, while files another writer appended meanwhile stay (their lsns
are higher than any folded row), so the gateway may keep appending while an offline job compacts.
"""

from __future__ import annotations

import asyncio
import json
import logging
from array import array
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from storage_delta.commit.append import TableSpec, WriterTable
from storage_delta.commit.loop import CommitLoop
from storage_delta.commit.owner import commit_without_fenced
from storage_delta.commit.store import CheckedRows, StoreRoot, read_checked, write_data_file
from storage_delta.format import schema as sch
from storage_delta.format.integrity import DamagedFile
from storage_delta.maintenance.files import delete_unreferenced, removes_of, swap_actions
from storage_delta.tables.catalog import CatalogTable

log = logging.getLogger(__name__)

APP_ID = "jetlake-acklog"
ACKS_TABLE = TableSpec(sch.ACKS, sch.ACK_SCHEMA, tuple(sch.ACK_PARTITIONS))

CREATE = "create"
CONFIG = "config"
DELETE = "delete"
STATE = "state"
#: CONSUMER.RESET: the consumer starts again at ``start_after``; nothing before it stays pending.
RESET = "reset"
DELIVER = "deliver"
ACK = "ack"
NAK = "nak"
TERM = "term"
WPI = "wpi"
#: A message left the pending set without an ack (its deliveries ran out); the floor stays.
DROP = "drop"
#: Kinds that concern one stream sequence (``seq``): folded once the floor has passed it.
MESSAGE_KINDS = frozenset({DELIVER, ACK, NAK, TERM, WPI, DROP})


@dataclass(slots=True)
class AckRecord:
    """One row of the ack log. ``body`` is JSON for the kinds that carry more than numbers."""

    stream: str
    consumer: str
    kind: str
    seq: int = 0
    cseq: int = 0
    deliveries: int = 0
    ts: int = 0
    delivered_seq: int = 0
    delivered_cseq: int = 0
    floor_seq: int = 0
    floor_cseq: int = 0
    body: str | None = None
    lsn: int = 0

    def body_json(self) -> dict[str, Any]:
        return json.loads(self.body) if self.body else {}


#: AckRecord's fields in declaration order, for positional construction.
_FIELD_ORDER = [
    "stream",
    "consumer",
    "kind",
    "seq",
    "cseq",
    "deliveries",
    "ts",
    "delivered_seq",
    "delivered_cseq",
    "floor_seq",
    "floor_cseq",
    "body",
    "lsn",
]


#: A number column of an :class:`AckRun`: one value for all its rows, or one per row (a tuple, as
#: ``zip`` transposes a run's tuples, or any buffer of int64).
Numbers = int | Sequence[int]


@dataclass(slots=True)
class AckRun:
    """Rows as the writer queues them: ``n`` rows of one consumer and kind whose number columns
    hold one value per row or one for all, so that a run of deliveries or acks is a few columns,
    not a Python object per row (#23). Their lsns are consecutive from the batch's first."""

    stream: str
    consumer: str
    kind: str
    n: int
    seq: Numbers
    cseq: Numbers
    deliveries: Numbers
    ts: Numbers
    delivered_seq: Numbers
    delivered_cseq: Numbers
    floor_seq: Numbers
    floor_cseq: Numbers
    body: str | None = None


#: AckRun's number columns, in ``ACK_SCHEMA`` order.
_NUMBER_COLUMNS = [f.name for f in sch.ACK_SCHEMA if pa.types.is_integer(f.type) and f.name != "lsn"]


def to_arrow(records: list[AckRecord]) -> pa.Table:
    return pa.table(
        {name: [getattr(r, name) for r in records] for name in sch.ACK_SCHEMA.names},
        schema=sch.ACK_SCHEMA,
    )


def runs_to_arrow(runs: list[AckRun], first_lsn: int) -> pa.Table:
    """Queued runs (lsns from ``first_lsn`` on) as one Arrow table: each number column is one
    ``array('q')`` that a run's values or its single value repeated extend in C, each string column
    the runs' values taken per row by Arrow, so the cost per row is no Python object's."""
    sizes = [r.n for r in runs]
    total = sum(sizes)
    of_run = np.repeat(np.arange(len(runs)), sizes)
    columns: dict[str, pa.Array] = {"lsn": pa.array(np.arange(first_lsn, first_lsn + total, dtype=np.int64))}
    for name in ("stream", "consumer", "kind", "body"):
        columns[name] = pa.array([getattr(r, name) for r in runs], pa.string()).take(of_run)
    for name in _NUMBER_COLUMNS:
        col = array("q")
        for r in runs:
            v = getattr(r, name)
            col += array("q", (v,)) * r.n if type(v) is int else array("q", v)
        columns[name] = pa.array(np.frombuffer(col, np.int64))
    return pa.Table.from_arrays([columns[name] for name in sch.ACK_SCHEMA.names], schema=sch.ACK_SCHEMA)


def _as_run(r: AckRecord) -> AckRun:
    return AckRun(
        r.stream,
        r.consumer,
        r.kind,
        1,
        r.seq,
        r.cseq,
        r.deliveries,
        r.ts,
        r.delivered_seq,
        r.delivered_cseq,
        r.floor_seq,
        r.floor_cseq,
        r.body,
    )


def _column(table: pa.Table, name: str) -> list[Any]:
    """A column as Python values, fast: numbers through numpy, the few distinct strings (stream,
    consumer and kind names) decoded once through a dictionary."""
    col = table.column(name).combine_chunks()
    if pa.types.is_integer(col.type):
        return col.to_numpy().tolist()  # type: ignore[no-any-return]
    if name == "body":
        return col.to_pylist()  # type: ignore[no-any-return]
    encoded = col.dictionary_encode()
    words = encoded.dictionary.to_pylist()
    return [words[i] for i in encoded.indices.to_numpy().tolist()]


def from_arrow(table: pa.Table) -> list[AckRecord]:
    cols = {name: _column(table, name) for name in sch.ACK_SCHEMA.names}
    order = [cols[name] for name in _FIELD_ORDER]
    return [AckRecord(*values) for values in zip(*order, strict=True)]


def incarnation(records: list[AckRecord]) -> list[AckRecord]:
    """The rows of a consumer's current incarnation (from its last ``create``), or [] after a
    ``delete``. ``records`` are one consumer's rows in lsn order."""
    start = 0
    for i in range(len(records) - 1, -1, -1):
        if records[i].kind == DELETE:
            return []
        if records[i].kind == CREATE:
            start = i
            break
    return records[start:]


def redelivered_after(records: list[AckRecord], start: Iterable[int], ack_all: bool) -> set[int]:
    """The stream sequences counted as redelivered after ``records``: delivered more than once and
    not settled by an ack or term since (one whose deliveries ran out stays counted)."""
    out = set(start)
    pending: set[int] = set()
    for r in records:
        if r.kind == DELIVER:
            pending.add(r.seq)
            if r.deliveries > 1:
                out.add(r.seq)
        elif r.kind == DROP:
            pending.discard(r.seq)
        elif r.kind == RESET:
            out.clear()
            pending.clear()
        elif r.kind in (ACK, TERM):
            settled = {s for s in pending if s <= r.seq} if ack_all else {r.seq}
            pending -= settled
            out -= settled
    return out


def fold(records: list[AckRecord]) -> list[AckRecord]:
    """One consumer's rows (lsn order) after compaction: a ``state`` row for everything at or below
    the ack floor, then the rows above it, unchanged."""
    rows = incarnation(records)
    if not rows:
        return []
    floor_seq = rows[-1].floor_seq
    reset = max((r.lsn for r in rows if r.kind == RESET), default=0)
    rows = [r for r in rows if r.kind not in MESSAGE_KINDS or r.lsn > reset]
    folded = [r for r in rows if r.kind not in MESSAGE_KINDS or r.seq <= floor_seq]
    kept = [r for r in rows if r.kind in MESSAGE_KINDS and r.seq > floor_seq]
    if not folded:
        return kept
    body: dict[str, Any] = {"delivered_ts": 0, "ack_ts": 0}
    earlier: list[int] = []
    for r in folded:
        extra = r.body_json() if r.kind in (CREATE, CONFIG, STATE, RESET) else {}
        for key in ("created", "config", "start_after", "skip"):
            if extra.get(key) is not None:
                body[key] = extra[key]
        body["delivered_ts"] = max(body["delivered_ts"], extra.get("delivered_ts", 0))
        body["ack_ts"] = max(body["ack_ts"], extra.get("ack_ts", 0))
        earlier = [] if r.kind == RESET else extra.get("redelivered", earlier)
        if r.kind == DELIVER:
            body["delivered_ts"] = max(body["delivered_ts"], r.ts)
        if r.kind in (ACK, TERM):
            body["ack_ts"] = max(body["ack_ts"], r.ts)
    last = folded[-1]
    # At or below the floor nothing is pending: a message still counts as redelivered only if it
    # was delivered more than once and then dropped (an ack or term would have settled it).
    redelivered = {r.seq for r in folded if r.kind == DELIVER and r.deliveries > 1}
    body["redelivered"] = sorted(set(earlier) | (redelivered & {r.seq for r in folded if r.kind == DROP}))
    body["skip"] = [s for s in body.get("skip") or [] if s > last.delivered_seq]
    state = AckRecord(
        stream=last.stream,
        consumer=last.consumer,
        kind=STATE,
        ts=max(r.ts for r in folded),
        delivered_seq=last.delivered_seq,
        delivered_cseq=last.delivered_cseq,
        floor_seq=last.floor_seq,
        floor_cseq=last.floor_cseq,
        body=json.dumps(body, separators=(",", ":")),
        lsn=last.lsn,
    )
    return sorted([state, *kept], key=lambda r: r.lsn)


def _last_per_consumer(cid: np.ndarray, mask: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Row indices, one per consumer, of the largest ``values`` among the rows in ``mask``."""
    idx = np.nonzero(mask)[0]
    if not len(idx):
        return idx
    ordered = idx[np.lexsort((values[idx], cid[idx]))]
    return ordered[np.r_[np.nonzero(np.diff(cid[ordered]))[0], len(ordered) - 1]]


def _needed_rows(table: pa.Table) -> pa.Table:
    """The rows :func:`fold` needs to give its result: all but the bulk of message rows at or below
    each consumer's floor, of which it keeps only the ones that decide something (the newest, the
    latest delivery and ack, and those of messages that were redelivered and then dropped, which
    stay counted as redelivered). Vectorised, so a log of millions of rows folds in seconds."""
    n = table.num_rows
    if n == 0:
        return table
    key = pc.binary_join_element_wise(table["stream"], table["consumer"], "\x1f").combine_chunks()
    consumers = key.dictionary_encode()
    cid = consumers.indices.to_numpy()
    kinds = table["kind"].combine_chunks().dictionary_encode()
    words = kinds.dictionary.to_pylist()
    kcode = kinds.indices.to_numpy()

    def of(*names: str) -> np.ndarray:
        return np.isin(kcode, [words.index(k) for k in names if k in words])

    lsn, seq, ts, deliveries, floor_seq = (
        table[c].to_numpy() for c in ("lsn", "seq", "ts", "deliveries", "floor_seq")
    )
    floor = np.zeros(len(consumers.dictionary), np.int64)
    newest = _last_per_consumer(cid, np.ones(n, bool), lsn)
    floor[cid[newest]] = floor_seq[newest]
    start = np.zeros(len(consumers.dictionary), np.int64)
    lifecycle = of(CREATE, DELETE, RESET)
    np.maximum.at(start, cid[lifecycle], lsn[lifecycle])
    message = of(*MESSAGE_KINDS)
    current = lsn >= start[cid]
    bulk = message & current & (seq <= floor[cid])
    keep = ~message | (message & current & ~bulk)
    for rows in (
        _last_per_consumer(cid, bulk, lsn),
        _last_per_consumer(cid, bulk, ts),
        _last_per_consumer(cid, bulk & of(DELIVER), ts),
        _last_per_consumer(cid, bulk & of(ACK, TERM), ts),
    ):
        keep[rows] = True
    redelivered = bulk & of(DELIVER) & (deliveries > 1)
    dropped = bulk & of(DROP)
    pair = cid.astype(np.int64) * (1 << 40) + seq
    both = np.intersect1d(pair[redelivered], pair[dropped])
    keep |= (redelivered | dropped) & np.isin(pair, both)
    return table.filter(pa.array(keep))


def fold_table(table: pa.Table) -> list[AckRecord]:
    """:func:`fold` of every consumer in an ack log table, in lsn order."""
    needed = from_arrow(_needed_rows(table))
    return sorted((r for rows in group(needed).values() for r in fold(rows)), key=lambda r: r.lsn)


def group(records: Iterable[AckRecord]) -> dict[tuple[str, str], list[AckRecord]]:
    """Rows per (stream, consumer), each list in lsn order."""
    out: dict[tuple[str, str], list[AckRecord]] = defaultdict(list)
    for r in sorted(records, key=lambda r: r.lsn):
        out[(r.stream, r.consumer)].append(r)
    return dict(out)


@dataclass(frozen=True, slots=True)
class AckLog:
    """What the loader returns: every consumer's rows, and the highest lsn in the table."""

    consumers: dict[tuple[str, str], list[AckRecord]]
    max_lsn: int
    rows: int


@dataclass(frozen=True, slots=True)
class Compaction:
    rows_before: int
    rows_after: int
    version: int


class AckLogTable(WriterTable):
    """Blocking access to the ``acks`` table; the gateway calls it on a worker thread. Appends go
    through the one append primitive (locally a blind append of about a millisecond, where a
    delta-rs transaction with its reload costs ~11 ms of CPU: a fifth of the delivery path's CPU
    under load at ten commits a second)."""

    SPEC = ACKS_TABLE
    APP_ID = APP_ID

    @property
    def dt(self) -> DeltaTable:
        return self._appender.fresh()

    def last_txn_version(self) -> int:
        return self._appender.committed_version()

    def append(self, records: list[AckRecord] | pa.Table, version: int) -> frozenset[str]:
        """Commit rows as one Delta version tagged ``(jetlake-acklog, version)``; a version that
        already landed (a retry after an error that hid a success) is not stored again. Fenced
        per stream, the rows of streams a newer owner holds are left out; returns those streams."""
        table = records if isinstance(records, pa.Table) else to_arrow(records)
        if not self.per_stream:
            self._appender.append([({}, table)], version)
            return frozenset()
        streams = set(pc.unique(table["stream"]).to_pylist())

        def attempt(left_out: frozenset[str]) -> None:
            rows = table.filter(pc.invert(pc.is_in(table["stream"], pa.array(sorted(left_out), pa.string()))))
            if rows.num_rows:
                self._appender.append([({}, rows)], version, streams=streams - left_out)

        return commit_without_fenced(attempt)

    def load(self, only: Collection[str] | None = None, kept: CheckedRows | None = None) -> AckLog:
        """Every consumer's rows in lsn order, folded as compaction would (which replays to the
        same state, and keeps a restart fast however long the log grew since its last compaction).
        ``only``: the consumers of these streams (a gateway that just took them over); the highest
        lsn is still the whole table's, as the writer's count goes on above every row. ``kept``:
        the table's rows read through it (at its newest version), not through this writer's
        handle."""
        table, damaged = (
            kept.read() if kept is not None else read_checked(self.root, self.dt, sch.ACKS, sch.ACK_SCHEMA)
        )
        for bad in damaged:  # its rows are lost: consumers restart from what the others say
            log.error(
                "damaged data file %s/%s left out of the ack log; see jetlake repair",
                sch.ACKS,
                bad.path,
            )
        max_lsn = int(pc.max(table["lsn"]).as_py() or 0) if table.num_rows else 0
        if only is not None:
            table = table.filter(pc.is_in(table["stream"], pa.array(sorted(only), pa.string())))
        return AckLog(group(fold_table(table)), max_lsn, table.num_rows)

    def compact(self, live: Callable[[], set[tuple[str, str]]] | None = None) -> Compaction:
        """Fold every consumer's rows at or below its ack floor into one ``state`` row (deleted
        consumers and earlier incarnations disappear), swapping the files read for one file.
        ``live`` names the consumers that exist (read after the snapshot, so it knows every
        consumer with rows in it); the rows of others, such as a deleted stream's, are dropped.

        The swap removes exactly the files it read, so the gateway's appends made meanwhile are new
        files that stay, with lsns above every folded row. It is the jobs' swap
        (:func:`storage_delta.maintenance.swap_actions`): a delta-rs overwrite would conflict with
        every such append (delta-rs #3890) and, under steady acking, never land. It gives way,
        deleting its file, only when another compaction removed the same files first."""
        dt = self.dt
        files = pa.table(dt.get_add_actions(flatten=True))
        table, damaged = read_checked(self.root, dt, sch.ACKS, sch.ACK_SCHEMA)
        if damaged:  # folding around them would drop them for good: that is jetlake repair's call
            raise DamagedFile(
                f"{sch.ACKS}/{damaged[0].path}", "damaged; the ack log is not compacted until repaired"
            )
        out = fold_table(table)
        if live is not None:
            keep = live()
            out = [r for r in out if (r.stream, r.consumer) in keep]
        removes = removes_of(files)
        adds = [write_data_file(self.root, sch.ACKS, {}, to_arrow(out))] if out else []
        if not swap_actions(self.root, sch.ACKS, sch.ACK_SCHEMA, sch.ACK_PARTITIONS, removes, adds):
            delete_unreferenced(self.root, adds, sch.ACKS)
            return Compaction(table.num_rows, table.num_rows, self.dt.version())
        self.hygiene()
        return Compaction(table.num_rows, len(out), self.dt.version())

    def hygiene(self) -> None:
        """Checkpoint, drop expired log files and start over with a fresh handle, so opening the
        table (a restart) stays fast however many commits it has seen."""
        self._appender.hygiene()

    def close(self) -> None:
        self._appender.close()


def compact_store(root: StoreRoot) -> Compaction:
    """Compact the ack log of a store: what a scheduled (Spark) job calls. Safe beside a running
    gateway: its appends land in new files, which the overwrite leaves in place."""

    def live() -> set[tuple[str, str]]:
        return {(e.stream, e.name) for e in CatalogTable(root).load() if e.kind == "consumer"}

    return AckLogTable(root).compact(live)


def _run_stream(run: AckRun) -> str:
    return run.stream


def _run_rows(run: AckRun) -> int:
    return run.n


def _rows(runs: list[AckRun]) -> int:
    return sum(r.n for r in runs)


class AckLogWriter:
    """The ack log's front of the commit loop: rows become durable in submission order.

    A row submitted with ``sync`` is committed at once (with whatever queued before it); other rows
    wait at most ``flush_interval_s`` so that plain acks share commits. A commit that fails is
    retried with the same txn version for up to ``RETRY_S`` (rows are small and their callers,
    ``AckSync`` and lifecycle API requests, would rather wait than fail); then it fails as the loop's
    policy says, and its waiters get the error. Callers of the frequent rows (deliveries, acks) hold
    back while :meth:`has_room` says no, which bounds the queue by ``max_pending``; the rare rows
    (lifecycle, drops) are always taken. After ``compact_every`` rows (0: never; ``backlog`` counts
    the rows found at start) the table is compacted beside the commits: the swap keeps the files
    appended meanwhile.
    """

    #: How long a failed ack-log commit is retried before its rows fail.
    RETRY_S = 30.0

    def __init__(
        self,
        table: AckLogTable,
        executor: Executor,
        next_lsn: int,
        flush_interval_s: float,
        max_pending: int,
        compact_every: int,
        backlog: int = 0,
    ) -> None:
        self._table = table
        self._executor = executor
        self._lsn = next_lsn  # the last lsn given to a queued row
        self._taken_lsn = next_lsn  # the last lsn of rows that left the queue
        self._batch_first_lsn = next_lsn + 1
        #: The last lsn of the rows committed (they land in lsn order): a row of lsn at or below
        #: it is durable.
        self.committed_lsn = next_lsn
        self._max_pending = max_pending
        self._compact_every = compact_every
        self._since_compaction = backlog
        self._compaction: asyncio.Task[None] | None = None
        #: The commit loop: its counters (commits, rows) are the ack log's.
        self.loop: CommitLoop[AckRun] = CommitLoop(
            "acklog",
            executor,
            self._append,
            table.last_txn_version,
            self._failed,
            linger_s=flush_interval_s,
            gather_rows=max_pending // 2,
            retry_s=self.RETRY_S,
            committed=self._committed,
            drained=self._drained,
            stream_of=_run_stream,
            rows_of=_run_rows,
        )
        self._per_stream = table.per_stream
        self.compactions = 0

    async def start(self) -> None:
        await self.loop.start()

    def has_room(self) -> bool:
        return not self.loop.closed and self.loop.pending_rows < self._max_pending

    def room(self) -> int:
        """How many more rows :meth:`has_room` would take one after the other."""
        return 0 if self.loop.closed else max(self._max_pending - self.loop.pending_rows, 0)

    def submit(self, record: AckRecord | None, sync: bool = False) -> asyncio.Future[None] | None:
        """Queue a row. With ``sync`` the returned future resolves once it (and every row queued
        before it) is committed; a ``None`` record is such a barrier alone."""
        if record is None:
            return self.loop.queued(sync, 0)
        self._lsn += 1
        record.lsn = self._lsn
        self.loop.pending.append(_as_run(record))
        return self.loop.queued(sync, stream=record.stream if self._per_stream else None)

    def add(
        self,
        stream: str,
        consumer: str,
        kind: str,
        seq: int,
        cseq: int,
        deliveries: int,
        ts: int,
        positions: tuple[int, int, int, int],
        sync: bool = False,
    ) -> asyncio.Future[None] | None:
        """:meth:`submit` for the frequent rows (deliveries, acks) without building a record:
        ``positions`` are the consumer's (delivered seq, delivered cseq, floor seq, floor cseq)."""
        self._lsn += 1
        self.loop.pending.append(AckRun(stream, consumer, kind, 1, seq, cseq, deliveries, ts, *positions))
        return self.loop.queued(sync, stream=stream if self._per_stream else None)

    def add_run(self, run: AckRun) -> None:
        """:meth:`add` for a run of rows in one call (no sync)."""
        self._lsn += run.n
        self.loop.pending.append(run)
        self.loop.queued(False, run.n)

    async def flush(self) -> None:
        """Wait until every row submitted so far is committed."""
        await self.loop.flush()

    def continue_above(self, lsn: int) -> None:
        """Give the rows from now on (and those still queued) lsns above ``lsn``: the table's
        highest when this gateway claimed a stream (per-stream ownership), whose consumers' rows
        of the previous owner must stay below this writer's, or a fold would put its acks before
        theirs. Queued rows keep their order among themselves; the batch in flight keeps its
        lsns, which are below every queued row's still."""
        gap = lsn - self._lsn
        if gap > 0:
            self._lsn += gap
            self._taken_lsn += gap

    def _drained(self, runs: list[AckRun]) -> None:
        """Rows leave the queue in lsn order: a batch's lsns follow the last batch's."""
        self._batch_first_lsn = self._taken_lsn + 1
        self._taken_lsn += _rows(runs)

    def _append(self, batch: list[AckRun], version: int) -> frozenset[str]:
        """On the executor: the batch's columns are built there, not on the event loop. Only one
        batch is in flight, so its first lsn is the one noted when it was taken."""
        return self._table.append(runs_to_arrow(batch, self._batch_first_lsn), version)

    def _failed(self, runs: list[AckRun], exc: BaseException) -> None:
        """The rows are not in the log: the consumers' state in memory is ahead of it, which a
        restart repairs by redelivering what the log does not show acknowledged."""
        log.error("%d ack log rows were not committed: %r", _rows(runs), exc)

    @property
    def last_lsn(self) -> int:
        """The lsn of the row queued last."""
        return self._lsn

    def _committed(self, batch: list[AckRun]) -> None:
        rows = _rows(batch)
        self.committed_lsn = self._batch_first_lsn + rows - 1
        self._since_compaction += rows
        due = self._compact_every and self._since_compaction >= self._compact_every
        if due and self._compaction is None and not self.loop.closed:
            self._compaction = asyncio.create_task(self._compact(), name="acklog-compact")

    async def _compact(self) -> None:
        counted = self._since_compaction
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(self._executor, compact_store, self._table.root)
        except Exception:  # the log stays correct uncompacted; a later round tries again
            log.exception("ack log compaction failed")
            return
        finally:
            self._compaction = None
        self._since_compaction -= counted
        self.compactions += 1
        log.info("ack log compacted: %d rows to %d", result.rows_before, result.rows_after)

    async def close(self) -> None:
        """Commit what was submitted, wait for a compaction in progress, then stop."""
        await self.loop.close()
        if self._compaction is not None:
            await self._compaction
        await asyncio.get_running_loop().run_in_executor(self._executor, self._table.close)
