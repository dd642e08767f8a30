"""The ``jetlake`` PySpark data source: a stream's messages read straight from the Delta table.

There are no delta-spark JARs on our machines, so Spark cannot read the ``messages`` table itself.
This source lists the table's files with delta-rs on the planner and reads the parquet files with
pyarrow on the executors, one task per block::

    spark.read.format("jetlake").option("root", "/data/store").option("stream", "ORDERS").load()

    spark.readStream.format("jetlake").option("root", ...).option("stream", "ORDERS").load()

Options: ``root`` and ``stream`` (required); ``start_seq`` / ``end_seq`` (an inclusive range, as
JetStream's ranges are); ``start_time`` (ISO 8601, UTC when no zone is given: the first message
stored at or after it, as a consumer's ``opt_start_time``); ``subject`` (a NATS subject filter with
``*`` and ``>``); ``view`` (``logical``, the default: what the JetStream API shows, without the
messages removed by limits, purges, deletes, TTL or acks that compaction has not removed yet, and
without a deleted stream's rows; ``raw``: every stored row; ``changes``: the change feed, see
:data:`CHANGE_SCHEMA`); ``max_messages_per_trigger`` (streaming: at most this many sequences per
micro-batch); ``prefetch_bytes`` (streaming: the planner reads a micro-batch of one partition whose
files add up to at most this many bytes itself, :data:`PREFETCH_BYTES` by default, 0: never; see
:class:`JetlakeStreamReader`); ``storage.<KEY>`` (a delta-rs storage option for an object-store root, e.g.
``storage.AWS_REGION``); ``read_offline`` (``true``: read a stream the gateway took offline for
damage, below).

A stream the gateway took offline because a damaged log entry of its table was set aside at start
(``storage_delta.tables.unresolved``: the entry was rewritten without lines nothing could make
again, so the table parses and every Delta reader reads the stream with a hole, silently) is not
read: planning a batch read or a micro-batch fails with :class:`StreamOffline`, which names the
stream, the entry and ``jetlake repair``, until repair has recorded the loss. ``read_offline=true``
reads what the table still holds instead.

:func:`list_blocks` and :func:`read_block` hold all the work; the batch reader and the stream
reader differ only in how they pick the sequence range (options, or micro-batch offsets).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

# pyspark's own wrapper of a SimpleDataSourceStreamReader: the one kind of stream reader whose
# micro-batch rows Spark takes from the planner (see JetlakeStreamReader.getCache). Private, so the
# pyspark pin in pyproject.toml is exact.
from pyspark.sql.datasource_internal import _SimpleStreamReaderWrapper
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from storage_delta.commit.store import StoreRoot
from storage_delta.format import schema as sch
from storage_delta.format.integrity import RowBounds, read_verified
from storage_delta.format.nats import parse_headers, subject_matches
from storage_delta.maintenance.files import LiveFile, live_files, visible
from storage_delta.read.follower import StoreFollower
from storage_delta.tables.removals import StreamLogicalState, recorded_at, recorded_between
from storage_delta.tables.unresolved import taking_offline

NAME = "jetlake"

#: What a read returns. ``ts`` is for people and SQL (Spark timestamps are microseconds); ``ts_ns``
#: keeps JetStream's exact stored time. A message without headers has an empty map, not null, so
#: ``headers['Nats-Msg-Id']`` needs no null guard.
MESSAGE_SCHEMA = StructType(
    [
        StructField("stream", StringType(), nullable=False),
        StructField("seq", LongType(), nullable=False),
        StructField("ts", TimestampType(), nullable=False),
        StructField("ts_ns", LongType(), nullable=False),
        StructField("subject", StringType(), nullable=False),
        StructField("headers", MapType(StringType(), StringType(), valueContainsNull=False), nullable=False),
        StructField("data", BinaryType(), nullable=False),
    ]
)

#: What ``view=changes`` returns: the stream's changes, so that a table downstream can follow its
#: logical state exactly. ``append``: a stored message (``last_seq`` = ``seq``; subject, headers and
#: data as in :data:`MESSAGE_SCHEMA`); ``remove``: sequences ``seq``..``last_seq`` left the stream
#: (an ack on a work-queue or interest stream, a delete, a purge, a limit, a TTL), recorded at ``ts``,
#: with null subject, headers and data. A removal is recorded only once its messages are stored, and
#: a micro-batch takes removals only together with every stored message: applying a micro-batch's
#: appends and then its removals (ranges may repeat or cover sequences never stored) keeps a copy
#: exact.
CHANGE_SCHEMA = StructType(
    [
        StructField("stream", StringType(), nullable=False),
        StructField("op", StringType(), nullable=False),
        StructField("seq", LongType(), nullable=False),
        StructField("last_seq", LongType(), nullable=False),
        StructField("ts", TimestampType(), nullable=False),
        StructField("ts_ns", LongType(), nullable=False),
        StructField("subject", StringType(), nullable=True),
        StructField("headers", MapType(StringType(), StringType(), valueContainsNull=False), nullable=True),
        StructField("data", BinaryType(), nullable=True),
    ]
)
VIEWS = ("logical", "raw", "changes")

#: What one Arrow batch sent to the JVM may hold: batches are cut by bytes, not rows, so small
#: messages travel in few large batches (each batch has a fixed cost on both sides of the socket)
#: and large payloads still never make one batch big.
BATCH_BYTES = 8 << 20
#: Rows per batch at most, however small the messages.
BATCH_ROWS = 65_536
#: The fixed columns of a row (stream, sequence, times, the map's offsets), in bytes.
_ROW_OVERHEAD = 48
#: A streaming micro-batch of one partition whose files add up to at most this many bytes is read
#: by the planner and handed to Spark with the partition (see JetlakeStreamReader.getCache); the
#: default of the ``prefetch_bytes`` option.
PREFETCH_BYTES = 4 << 20

_STORAGE_PREFIX = "storage."


@dataclass(frozen=True)
class BlockPartition(InputPartition):
    """One Spark task: the files of one block of one stream and the sequence range to keep.

    A block, not a file, is the unit because the group-commit writer leaves many small files per
    block; a block is bounded by the stream's block size. Only names and numbers travel to the
    executors, so partitions stay cheap to pickle and plan.
    """

    stream: str
    block: int
    #: Paths relative to the ``messages`` table, URL-decoded, in order of their first sequence.
    files: tuple[str, ...]
    first_seq: int | None = None
    last_seq: int | None = None
    #: The logical view: rows stored before ``created`` (an earlier incarnation of the stream) and
    #: sequences in ``removed`` (ranges clipped to this block's files) are hidden. Raw reads: 0, ().
    created: int = 0
    removed: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class RemovalPartition(InputPartition):
    """The change feed's removals: the rows the removal log gained after version ``after`` up to
    ``through`` (``after`` < 0: every row of version ``through``), of incarnation ``created``."""

    stream: str
    created: int
    after: int
    through: int


@dataclass(frozen=True)
class ReadOptions:
    """The parsed options of one read; parsed once so that bad options fail at ``load()``."""

    root: StoreRoot
    stream: str
    first_seq: int | None = None
    last_seq: int | None = None
    start_time_ns: int | None = None
    subject: str | None = None
    max_per_trigger: int | None = None
    prefetch_bytes: int = PREFETCH_BYTES
    #: One of :data:`VIEWS`.
    view: str = "logical"
    #: Read a stream the gateway took offline for damage (its rows may be missing).
    read_offline: bool = False

    @property
    def schema(self) -> StructType:
        return CHANGE_SCHEMA if self.view == "changes" else MESSAGE_SCHEMA

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        # Spark lower-cases option keys; delta-rs and StoreRoot both take upper-case storage keys.
        storage = {
            k[len(_STORAGE_PREFIX) :].upper(): v for k, v in options.items() if k.startswith(_STORAGE_PREFIX)
        }
        root = options.get("root")
        stream = options.get("stream")
        if not root or not stream:
            raise ValueError("the jetlake data source needs the options 'root' and 'stream'")
        if "://" not in root:
            # Parsed on the driver's node: executors elsewhere would resolve a relative path against
            # their own working directory.
            root = os.path.abspath(root)
        prefetch = _int_option(options, "prefetch_bytes")
        return cls(
            root=StoreRoot(root, storage or None),
            stream=stream,
            first_seq=_int_option(options, "start_seq"),
            last_seq=_int_option(options, "end_seq"),
            start_time_ns=_time_option(options, "start_time"),
            subject=options.get("subject") or None,
            max_per_trigger=_int_option(options, "max_messages_per_trigger"),
            prefetch_bytes=PREFETCH_BYTES if prefetch is None else prefetch,
            view=_view_option(options),
            read_offline=_bool_option(options, "read_offline"),
        )


def _view_option(options: Mapping[str, str]) -> str:
    view = options.get("view", "logical")
    if view not in VIEWS:
        raise ValueError(f"jetlake option 'view' must be one of {', '.join(VIEWS)}, got {view!r}")
    return view


def _bool_option(options: Mapping[str, str], key: str) -> bool:
    value = options.get(key, "false").lower()
    if value not in ("true", "false"):
        raise ValueError(f"jetlake option {key!r} must be true or false, got {value!r}")
    return value == "true"


def _int_option(options: Mapping[str, str], key: str) -> int | None:
    value = options.get(key)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"jetlake option {key!r} must be an integer, got {value!r}") from None


def _time_option(options: Mapping[str, str], key: str) -> int | None:
    value = options.get(key)
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"jetlake option {key!r} must be an ISO 8601 time, got {value!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000


def list_blocks(
    root: StoreRoot,
    stream: str,
    first_seq: int | None = None,
    last_seq: int | None = None,
    files: Sequence[LiveFile] | None = None,
    state: StreamLogicalState | None = None,
) -> list[BlockPartition]:
    """The partitions holding ``first_seq..last_seq`` of a stream (``files``: a listing already made),
    hiding what ``state`` (the logical view) removes; without a state the read is raw.

    Files are dropped by their ``seq`` statistics, so a narrow range plans few tasks.
    """
    if files is None:
        files = live_files(root, stream)
    by_block: dict[int, list[tuple[int | None, str]]] = {}
    for f in files:
        if first_seq is not None and f.max_seq is not None and f.max_seq < first_seq:
            continue
        if last_seq is not None and f.min_seq is not None and f.min_seq > last_seq:
            continue
        by_block.setdefault(f.block, []).append((f.min_seq, f.path))
    out = []
    for block, entries in sorted(by_block.items()):
        paths = tuple(path for _, path in sorted(entries, key=lambda e: (e[0] is None, e[0] or 0, e[1])))
        part = BlockPartition(stream=stream, block=block, files=paths, first_seq=first_seq, last_seq=last_seq)
        if state is not None:
            part = _hide(part, [f for f in (files or []) if f.block == block], state)
        out.append(part)
    return out


def _hide(part: BlockPartition, files: Sequence[LiveFile], state: StreamLogicalState) -> BlockPartition:
    lows = [f.min_seq for f in files if f.min_seq is not None]
    highs = [f.max_seq for f in files if f.max_seq is not None]
    if not lows or not highs:
        # No statistics: every removal might concern the block.
        return replace(part, created=state.created, removed=tuple(state.removed))
    lo, hi = min(lows), max(highs)
    return replace(
        part, created=state.created, removed=tuple((a, b) for a, b in state.removed if a <= hi and b >= lo)
    )


def first_seq_at(root: StoreRoot, files: Sequence[LiveFile], ts_ns: int) -> int:
    """The first sequence stored at or after ``ts_ns`` (one past the last if none is): only files
    whose newest message is late enough are opened, and only their ``seq``/``ts`` columns."""
    fs, base = root.filesystem()
    best: int | None = None
    for f in files:
        if f.max_ts is not None and f.max_ts < ts_ns:
            continue
        if best is not None and f.min_seq is not None and f.min_seq >= best:
            continue
        table = read_verified(fs, f"{base}/{sch.MESSAGES}/{f.path}", ["seq", "ts"], sch.MESSAGE_FILE_SCHEMA)
        seqs = table.filter(pc.greater_equal(table["ts"], ts_ns))["seq"]
        if len(seqs):
            low = pc.min(seqs).as_py()
            best = low if best is None else min(best, low)
    if best is not None:
        return best
    bounds = seq_bounds(files)
    return bounds[1] + 1 if bounds else 1


def seq_bounds(files: Sequence[LiveFile]) -> tuple[int, int] | None:
    """Lowest and highest stored sequence: the writer commits a stream's sequences in order, so every
    sequence up to the highest is durable and a micro-batch may end there."""
    lows = [f.min_seq for f in files if f.min_seq is not None]
    highs = [f.max_seq for f in files if f.max_seq is not None]
    if not lows or not highs:
        return None
    return min(lows), max(highs)


def read_block(
    root: StoreRoot, partition: BlockPartition, subject: str | None, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """The partition's messages as batches of ``schema``, one file at a time, each file by sequence.

    Memory follows the largest file (one commit's rows of a block), not the block. The subject
    filter is evaluated once per distinct subject, not per row.
    """
    fs, base = root.filesystem()
    verdicts: dict[str, bool] = {}
    bounds = RowBounds(first_seq=partition.first_seq, last_seq=partition.last_seq)
    for rel in partition.files:
        # A damaged file fails the task (DamagedFile names it) rather than handing Spark its bytes.
        table = read_verified(
            fs, f"{base}/{sch.MESSAGES}/{rel}", sch.MESSAGE_FILE_SCHEMA.names, sch.MESSAGE_FILE_SCHEMA, bounds
        )
        if partition.created or partition.removed:
            table = table.filter(visible(table, partition.created, partition.removed))
        if subject and table.num_rows:
            distinct = pc.unique(table["subject"]).to_pylist()
            for s in distinct:
                if s not in verdicts:
                    verdicts[s] = subject_matches(subject, s)
            keep = pa.array([s for s in distinct if verdicts[s]], pa.string())
            table = table.filter(pc.is_in(table["subject"], value_set=keep))
        if table.num_rows == 0:
            continue
        yield from batches(to_output(partition.stream, table.sort_by("seq"), schema))


def batches(table: pa.Table) -> Iterator[pa.RecordBatch]:
    """``table`` cut into batches of at most :data:`BATCH_ROWS` rows and, unless one row alone is
    larger, :data:`BATCH_BYTES` of subjects, headers and payloads."""
    n = table.num_rows
    sizes = np.full(n, _ROW_OVERHEAD, np.int64)
    for name in ("subject", "data"):
        sizes += pc.binary_length(table[name]).to_numpy(zero_copy_only=False)
    headers = table["headers"].combine_chunks()
    pairs = np.zeros(len(headers.keys) + 1, np.int64)
    pairs[1:] = np.cumsum(
        pc.binary_length(headers.keys).to_numpy(zero_copy_only=False)
        + pc.binary_length(headers.items).to_numpy(zero_copy_only=False)
    )
    offsets = headers.offsets.to_numpy(zero_copy_only=False)
    sizes += pairs[offsets[1:]] - pairs[offsets[:-1]]
    ends = np.cumsum(sizes)
    start = 0
    while start < n:
        base = int(ends[start - 1]) if start else 0
        stop = int(np.searchsorted(ends, base + BATCH_BYTES, side="right"))
        stop = min(max(stop, start + 1), start + BATCH_ROWS)
        yield from table.slice(start, stop - start).to_batches()
        start = stop


def to_output(stream: str, table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Rows of the parquet file layout turned into ``schema``, which must be Spark's Arrow form of
    :data:`MESSAGE_SCHEMA`: Spark checks the first batch's schema for equality, nullability and the
    map's field names included."""
    n = table.num_rows
    ts_ns = table["ts"].combine_chunks()
    headers_type = schema.field("headers").type
    hdrs = table["hdrs"].combine_chunks()
    # Most messages carry no headers: only the rows that do are parsed in Python.
    counts = np.zeros(n + 1, np.int32)
    keys: list[str] = []
    values: list[str] = []
    for i in pc.indices_nonzero(pc.is_valid(hdrs)).to_numpy():
        parsed = parse_headers(hdrs[i].as_py())
        keys.extend(parsed)
        values.extend(parsed.values())
        counts[i + 1] = len(parsed)
    headers = pa.MapArray.from_arrays(
        pa.array(np.cumsum(counts, dtype=np.int32), pa.int32()),
        pa.array(keys, pa.string()),
        pa.array(values, pa.string()),
        type=headers_type,
    )
    arrays = [
        pa.repeat(pa.scalar(stream, pa.string()), n),
        table["seq"].combine_chunks(),
        pc.divide(ts_ns, pa.scalar(1000, pa.int64())).cast(schema.field("ts").type),
        ts_ns,
        table["subject"].combine_chunks(),
        headers,
        table["data"].combine_chunks(),
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def as_changes(messages: pa.Table, schema: pa.Schema) -> pa.Table:
    """Rows of :data:`MESSAGE_SCHEMA` as the change feed's ``append`` rows of ``schema`` (Spark's
    Arrow form of :data:`CHANGE_SCHEMA`)."""
    n = messages.num_rows
    seq = messages["seq"]
    arrays = [messages["stream"], pa.repeat(pa.scalar("append"), n), seq, seq]
    arrays += [messages[c] for c in ("ts", "ts_ns", "subject", "headers", "data")]
    return pa.Table.from_arrays([pa.chunked_array(a) for a in arrays], schema=schema)


def removal_changes(records: pa.Table, part: RemovalPartition, schema: pa.Schema) -> pa.Table:
    """The removal log's rows of the partition's incarnation as ``remove`` rows of ``schema``."""
    mine = records.filter(
        pc.and_(pc.equal(records["stream"], part.stream), pc.equal(records["created"], part.created))
    ).sort_by([("ts", "ascending"), ("first", "ascending")])
    n = mine.num_rows
    ts_ns = mine["ts"].combine_chunks()
    arrays = [
        mine["stream"].combine_chunks(),
        pa.repeat(pa.scalar("remove"), n),
        mine["first"].combine_chunks(),
        mine["last"].combine_chunks(),
        pc.divide(ts_ns, pa.scalar(1000, pa.int64())).cast(schema.field("ts").type),
        ts_ns,
    ]
    arrays += [pa.nulls(n, schema.field(c).type) for c in ("subject", "headers", "data")]
    return pa.Table.from_arrays(arrays, schema=schema)


def arrow_schema(schema: StructType, ours: StructType = MESSAGE_SCHEMA) -> pa.Schema:
    """The Arrow schema Spark will demand of our batches for ``schema`` (the one a read was planned
    with, which may be a user's ``.schema(...)``): it must carry ``ours`` columns, in our order."""
    got = [(f.name, f.dataType.simpleString()) for f in schema.fields]
    want = [(f.name, f.dataType.simpleString()) for f in ours.fields]
    if got != want:
        raise ValueError(f"the jetlake data source reads {ours.simpleString()}, not {schema.simpleString()}")
    return to_arrow_schema(schema, timezone="UTC")


class JetlakeDataSource(DataSource):
    """``spark.read.format("jetlake")``; see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return ReadOptions.parse(self.options).schema

    def reader(self, schema: StructType) -> JetlakeReader:
        return JetlakeReader(ReadOptions.parse(self.options), schema)

    def streamReader(self, schema: StructType) -> JetlakeStreamReader:
        return JetlakeStreamReader(ReadOptions.parse(self.options), schema)


class StreamOffline(RuntimeError):
    """The stream read is offline for damage (``storage_delta.tables.unresolved``)."""


def refuse_offline(options: ReadOptions) -> None:
    """Raise :class:`StreamOffline` when the gateway took the stream offline for a damaged log
    entry it set aside at start, unless ``read_offline`` was asked for. Only a local root can have
    one (the gateway sets entries aside on local roots only)."""
    local = options.root.local_path()
    if options.read_offline or local is None:
        return
    entries = taking_offline(local, options.stream)
    if entries:
        first = entries[0]
        raise StreamOffline(
            f"stream {options.stream} is offline: log entry {first.table}/{first.entry} was set aside "
            f"at start ({first.reason}; it may concern {first.describe()}), so the table may lack "
            f"rows of it without a word; run `jetlake repair --data-root {local}` (with the gateway "
            "stopped) to record what is lost, or set the option read_offline=true to read what is left"
        )


def _plan(
    options: ReadOptions,
    store: StoreFollower,
    files: Sequence[LiveFile],
    first: int | None,
    last: int | None,
) -> list[BlockPartition]:
    """The partitions of ``first..last`` among ``files`` (the stream's listing, taken by the caller
    before this call: the removals are loaded here, after it, so every listed row's removal is
    already known); in the logical view, with what the API hides (the change feed hides only
    earlier incarnations: its removals are rows of their own)."""
    if options.view == "raw":
        return list_blocks(options.root, options.stream, first, last, files)
    state = store.states().get(options.stream)
    if state is None:
        return []  # no such stream (or a deleted one): the API shows nothing
    blocks = list_blocks(options.root, options.stream, first, last, files, state)
    return [replace(b, removed=()) for b in blocks] if options.view == "changes" else blocks


def _removals(options: ReadOptions, store: StoreFollower, after: int, through: int) -> list[RemovalPartition]:
    """The change feed's removal partition for removal log versions ``after`` + 1 to ``through``."""
    state = store.states().get(options.stream)
    if through <= after or state is None:
        return []
    return [RemovalPartition(options.stream, state.created, after, through)]


def _read(options: ReadOptions, arrow: pa.Schema, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if isinstance(partition, RemovalPartition):
        root, p = options.root, partition
        records = recorded_at(root, p.through) if p.after < 0 else recorded_between(root, p.after, p.through)
        return iter(removal_changes(records, partition, arrow).to_batches(max_chunksize=BATCH_ROWS))
    # Spark substitutes a bare InputPartition(None) when there are no blocks at all.
    if not isinstance(partition, BlockPartition):
        return iter(())
    if options.view != "changes":
        return read_block(options.root, partition, options.subject, arrow)
    messages = read_block(options.root, partition, options.subject, arrow_schema(MESSAGE_SCHEMA))
    return (b for m in messages for b in as_changes(pa.Table.from_batches([m]), arrow).to_batches())


class JetlakeReader(DataSourceReader):
    """Plans one task per block on the planner and reads the blocks on the executors.

    ``pushFilters`` is deliberately not implemented: Spark refuses a reader that has it unless
    ``spark.sql.python.filterPushdown.enabled`` is set, so ranges come in as options instead.
    """

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.arrow_schema = arrow_schema(schema, options.schema)

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        refuse_offline(o)
        store = StoreFollower(o.root)
        # The change feed's removals first: each covers messages already stored, so listed below.
        removals = store.removals_version() if o.view == "changes" else -1
        files = store.files(o.stream)
        first = o.first_seq
        if o.start_time_ns is not None:
            at = first_seq_at(o.root, files, o.start_time_ns)
            first = at if first is None else max(first, at)
        return [*_plan(o, store, files, first, o.last_seq), *_removals(o, store, -1, removals)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, self.arrow_schema, partition)


class JetlakeStreamReader(_SimpleStreamReaderWrapper, SupportsTriggerAvailableNow):
    """Micro-batches over a stream; an offset is ``{"seq": n}``, the next sequence to read, and for
    the change feed also ``"removals"``: the removal log's version read through (-1: none yet).

    A micro-batch ``[start, end)`` only ever covers sequences already committed (the end is one past
    the highest stored sequence), and a committed sequence's message never changes, so replaying a
    batch after a restart reads the same rows: with Spark's checkpoint that is exactly-once. The
    change feed's removals are the log's rows of fixed versions, the same on a replay; a batch takes
    new ones only when it also takes every message stored when they were read (a removal is
    recorded once its messages are stored), so no removal overtakes the message it removes.
    Each batch is planned like a batch read, one task per block.

    Spark keeps this reader in one Python process on the driver for the query's life and asks it for
    the newest offset every ``spark.sql.streaming.pollingDelay`` while idle: the tables are followed
    with warm handles (:class:`StoreFollower`), so an idle poll costs one look for a new commit file
    and a micro-batch plans from what is already loaded. Spark also pickles a fresh reader to the
    executors for :meth:`read`; the handles are made on first use and never travel.

    A small micro-batch (one partition, ``prefetch_bytes`` of files at most: what a query that
    keeps up with its stream plans) is read right here, by the planner, and its rows go to Spark
    with the partition (:meth:`getCache`): Spark keeps them in its block manager and the batch's
    task reads them there, so no Python worker is started or fed for it. That hop was most of a
    small micro-batch's job on a loaded machine (a ``collect`` of its rows: 214-261 ms with it,
    58-73 ms without; bench/RESULTS.md, ``--compare-prefetch``). Spark offers the hand-over
    only to readers that are its ``_SimpleStreamReaderWrapper``, hence the base class; every one of
    the wrapper's methods Spark calls is overridden here (Spark asks a wrapper for no
    ``reportLatestOffset``, so a query's progress shows no ``latestOffset`` for this source). The
    partition handed over is the real one, so a task that cannot find the rows (or a replay after a
    restart, which plans anew) reads it.
    """

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.arrow_schema = arrow_schema(schema, options.schema)
        #: ``Trigger.AvailableNow``: the end fixed when the query started; later messages wait.
        self._target: dict[str, int] | None = None
        self._store: StoreFollower | None = None
        #: The micro-batch :meth:`partitions` just planned, when the planner reads it: its offsets
        #: (as JSON, how Spark compares them) and its one partition.
        self._prefetch: tuple[str, str, BlockPartition] | None = None

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_store": None, "_prefetch": None}

    @property
    def simple_reader(self) -> JetlakeStreamReader:  # type: ignore[override]
        """What Spark asks, as of a wrapper, whether it supports ``Trigger.AvailableNow`` and
        prepares for it: this reader itself."""
        return self

    @property
    def store(self) -> StoreFollower:
        if self._store is None:
            self._store = StoreFollower(self.options.root)
        return self._store

    def _newest(self) -> dict[str, int] | None:
        """One past the highest stored sequence and, for the change feed, the removal log's version
        read before it (so every removal it holds covers stored messages); None: nothing stored."""
        removals = self.store.removals_version() if self.options.view == "changes" else None
        bounds = seq_bounds(self.store.files(self.options.stream))
        if bounds is None:
            return None
        newest = {"seq": bounds[1] + 1, "first": bounds[0]}
        return newest if removals is None else {**newest, "removals": removals}

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._newest() or {"seq": 0, "first": 0, "removals": -1}

    def initialOffset(self) -> dict[str, int]:
        o = self.options
        if o.first_seq is not None:
            seq = o.first_seq
        elif o.start_time_ns is not None:
            seq = first_seq_at(o.root, self.store.files(o.stream), o.start_time_ns)
        else:
            seq = 1
        return {"seq": seq, "removals": -1} if o.view == "changes" else {"seq": seq}

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        newest = self._newest()
        if newest is None:
            return start
        target = newest if self._target is None else self._target
        # Skip what retention removed below the stored range instead of planning empty batches.
        begin = max(start["seq"], newest["first"])
        end = target["seq"]
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.max_rows)
        offset = {"seq": max(end, start["seq"])}
        if "removals" in start:
            # Removals only with every message stored before they were read.
            offset["removals"] = target["removals"] if end >= target["seq"] else start["removals"]
        return offset

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        refuse_offline(self.options)
        # One listing for the plan and the prefetch's sizes: a second one, taken after a commit
        # of the gateway's compaction had swapped the batch's files, lacked them, and the batch went
        # to a Python worker (whose start took 2 s at load 10: the worst micro-batch of a run).
        files = self.store.files(self.options.stream)
        parts: list[InputPartition] = []
        if end["seq"] > start["seq"]:
            parts += _plan(self.options, self.store, files, start["seq"], end["seq"] - 1)
        if "removals" in start:
            parts += _removals(self.options, self.store, start["removals"], end["removals"])
        self._prefetch = None
        limit = self.options.prefetch_bytes
        if limit > 0 and len(parts) == 1 and isinstance(parts[0], BlockPartition):
            sizes = {f.path: f.size for f in files}
            if sum(sizes[p] for p in parts[0].files) <= limit:
                self._prefetch = (json.dumps(start), json.dumps(end), parts[0])
        return parts

    def getCache(self, start: dict[str, int], end: dict[str, int]) -> Iterator[pa.RecordBatch] | None:
        """The rows of the micro-batch :meth:`partitions` just planned, when it is small; None
        (a task per partition reads them) otherwise. Spark calls it right after :meth:`partitions`
        with the same offsets."""
        planned = self._prefetch
        self._prefetch = None
        if planned is None or planned[:2] != (json.dumps(start), json.dumps(end)):
            return None
        return _read(self.options, self.arrow_schema, planned[2])

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the reader keeps no rows between micro-batches."""

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, self.arrow_schema, partition)
