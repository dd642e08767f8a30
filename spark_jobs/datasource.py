"""The ``jetlake`` PySpark data source: a stream's messages read straight from the Delta table.

There are no delta-spark JARs on our machines, so Spark cannot read the ``messages`` table itself.
This source lists the table's files with delta-rs on the planner and reads the parquet files with
pyarrow on the executors, one task per block::

    spark.read.format("jetlake").option("root", "/data/store").option("stream", "ORDERS").load()

Options: ``root`` and ``stream`` (required); ``start_seq`` / ``end_seq`` (an inclusive range, as
JetStream's ranges are); ``subject`` (a NATS subject filter with ``*`` and ``>``); ``storage.<KEY>``
(a delta-rs storage option for an object-store root, e.g. ``storage.AWS_REGION``).

:func:`list_blocks` and :func:`read_block` hold all the work so that a stream reader can plan
micro-batches from sequence offsets with the same two calls.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from storage_delta import schema as sch
from storage_delta.natsfmt import parse_headers, subject_matches
from storage_delta.tables import StoreRoot, open_existing

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

#: Rows per yielded batch: bounds what one Arrow batch sent to the JVM holds when payloads are large.
BATCH_ROWS = 2048

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


@dataclass(frozen=True)
class ReadOptions:
    """The parsed options of one read; parsed once so that bad options fail at ``load()``."""

    root: StoreRoot
    stream: str
    first_seq: int | None = None
    last_seq: int | None = None
    subject: str | None = None

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
        return cls(
            root=StoreRoot(root, storage or None),
            stream=stream,
            first_seq=_int_option(options, "start_seq"),
            last_seq=_int_option(options, "end_seq"),
            subject=options.get("subject") or None,
        )


def _int_option(options: Mapping[str, str], key: str) -> int | None:
    value = options.get(key)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"jetlake option {key!r} must be an integer, got {value!r}") from None


def list_blocks(
    root: StoreRoot, stream: str, first_seq: int | None = None, last_seq: int | None = None
) -> list[BlockPartition]:
    """The partitions holding ``first_seq..last_seq`` of a stream, from the Delta log's ``add`` actions.

    Files are dropped by their ``seq`` statistics, so a narrow range plans few tasks. The log is read
    through delta-rs because it alone knows which files are live; the executors never touch it.
    """
    dt = open_existing(root, sch.MESSAGES)
    if dt is None:
        return []
    actions = pa.table(dt.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return []
    actions = actions.filter(pc.equal(actions["partition.stream"], stream))
    files: dict[int, list[tuple[int | None, str]]] = {}
    for row in actions.to_pylist():
        lo, hi = row.get("min.seq"), row.get("max.seq")
        if first_seq is not None and hi is not None and hi < first_seq:
            continue
        if last_seq is not None and lo is not None and lo > last_seq:
            continue
        # The log holds paths URL-encoded (a stream "A B" lives under "stream=A%20B").
        files.setdefault(int(row["partition.block"]), []).append((lo, unquote(row["path"])))
    return [
        BlockPartition(
            stream=stream,
            block=block,
            files=tuple(path for _, path in sorted(entries, key=lambda e: (e[0] is None, e[0] or 0, e[1]))),
            first_seq=first_seq,
            last_seq=last_seq,
        )
        for block, entries in sorted(files.items())
    ]


def read_block(
    root: StoreRoot, partition: BlockPartition, subject: str | None, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """The partition's messages as batches of ``schema``, one file at a time, each file by sequence.

    Memory follows the largest file (one commit's rows of a block), not the block. The subject
    filter is evaluated once per distinct subject, not per row.
    """
    fs, base = root.filesystem()
    verdicts: dict[str, bool] = {}
    expr: pc.Expression | None = None
    if partition.first_seq is not None:
        expr = pc.field("seq") >= partition.first_seq
    if partition.last_seq is not None:
        upper = pc.field("seq") <= partition.last_seq
        expr = upper if expr is None else expr & upper
    for rel in partition.files:
        table = pq.read_table(
            f"{base}/{sch.MESSAGES}/{rel}",
            filesystem=fs,
            columns=sch.MESSAGE_FILE_SCHEMA.names,
            filters=expr,
            partitioning=None,
        )
        if subject and table.num_rows:
            distinct = pc.unique(table["subject"]).to_pylist()
            for s in distinct:
                if s not in verdicts:
                    verdicts[s] = subject_matches(subject, s)
            keep = pa.array([s for s in distinct if verdicts[s]], pa.string())
            table = table.filter(pc.is_in(table["subject"], value_set=keep))
        if table.num_rows == 0:
            continue
        yield from to_output(partition.stream, table.sort_by("seq"), schema).to_batches(
            max_chunksize=BATCH_ROWS
        )


def to_output(stream: str, table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Rows of the parquet file layout turned into ``schema``, which must be Spark's Arrow form of
    :data:`MESSAGE_SCHEMA`: Spark checks the first batch's schema for equality, nullability and the
    map's field names included."""
    n = table.num_rows
    ts_ns = table["ts"].combine_chunks()
    headers_type = schema.field("headers").type
    offsets: list[int] = [0]
    keys: list[str] = []
    values: list[str] = []
    for block in table["hdrs"].to_pylist():
        parsed = parse_headers(block)
        keys.extend(parsed)
        values.extend(parsed.values())
        offsets.append(len(keys))
    headers = pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()),
        pa.array(keys, pa.string()),
        pa.array(values, pa.string()),
        type=headers_type,
    )
    arrays = [
        pa.array([stream] * n, pa.string()),
        table["seq"].combine_chunks(),
        pc.divide(ts_ns, pa.scalar(1000, pa.int64())).cast(schema.field("ts").type),
        ts_ns,
        table["subject"].combine_chunks(),
        headers,
        table["data"].combine_chunks(),
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark will demand of our batches for ``schema`` (the one a read was planned
    with, which may be a user's ``.schema(...)``): it must carry our columns, in our order."""
    got = [(f.name, f.dataType.simpleString()) for f in schema.fields]
    want = [(f.name, f.dataType.simpleString()) for f in MESSAGE_SCHEMA.fields]
    if got != want:
        raise ValueError(
            f"the jetlake data source reads {MESSAGE_SCHEMA.simpleString()}, not {schema.simpleString()}"
        )
    return to_arrow_schema(schema, timezone="UTC")


class JetlakeDataSource(DataSource):
    """``spark.read.format("jetlake")``; see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        ReadOptions.parse(self.options)
        return MESSAGE_SCHEMA

    def reader(self, schema: StructType) -> JetlakeReader:
        return JetlakeReader(ReadOptions.parse(self.options), schema)


class JetlakeReader(DataSourceReader):
    """Plans one task per block on the planner and reads the blocks on the executors.

    ``pushFilters`` is deliberately not implemented: Spark refuses a reader that has it unless
    ``spark.sql.python.filterPushdown.enabled`` is set, so ranges come in as options instead.
    """

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.arrow_schema = arrow_schema(schema)

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        return list(list_blocks(o.root, o.stream, o.first_seq, o.last_seq))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # Spark substitutes a bare InputPartition(None) when there are no blocks at all.
        if not isinstance(partition, BlockPartition):
            return iter(())
        return read_block(self.options.root, partition, self.options.subject, self.arrow_schema)
