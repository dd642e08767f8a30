"""Arrow schemas of jetlake's Delta tables and the block arithmetic they share.

The tables are the durable truth, so their layout is a contract with every other Delta reader
(Spark, DuckDB, Polars): it is written down in docs/storage.md and must change only with it.
"""

from __future__ import annotations

import pyarrow as pa

MESSAGES = "messages"
CATALOG = "catalog"
REMOVALS = "removals"
#: The gateway's index snapshots under the store root: a cache, not a table (read/index_snapshot.py).
INDEX_SNAPSHOTS = "_jetlake_index"

#: Partition columns of ``messages``: a stream's rows never share a file with another stream's, and a
#: block bounds the work of every read and every retention step.
MESSAGE_PARTITIONS = ["stream", "block"]

#: Columns written into the parquet files (partition columns live in the paths only).
MESSAGE_FILE_SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64(), nullable=False),
        # Unix nanoseconds: JetStream's stored time is nanosecond-exact and clients see it in the
        # ack reply token, so a microsecond Delta timestamp would lose information.
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("subject", pa.string(), nullable=False),
        # The raw NATS header block (``NATS/1.0\r\n...``), byte for byte as published, or null.
        pa.field("hdrs", pa.binary(), nullable=True),
        pa.field("data", pa.binary(), nullable=False),
    ]
)

MESSAGE_TABLE_SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string(), nullable=False),
        pa.field("block", pa.int64(), nullable=False),
        *list(MESSAGE_FILE_SCHEMA),
    ]
)

CATALOG_PARTITIONS: list[str] = []

#: One row per change of a stream or consumer definition; the newest ``rev`` per (kind, stream, name)
#: wins, and a row with ``deleted`` set ends the entity.
CATALOG_SCHEMA = pa.schema(
    [
        pa.field("rev", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("stream", pa.string(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("deleted", pa.bool_(), nullable=False),
        pa.field("body", pa.string(), nullable=False),
    ]
)

#: One row per removal from a stream's logical view: sequences ``first..last`` of the stream
#: incarnation created at ``created`` (Unix ns) are gone for every reader (storage_delta/stream_state.py).
REMOVALS_SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string(), nullable=False),
        pa.field("created", pa.int64(), nullable=False),
        pa.field("first", pa.int64(), nullable=False),
        pa.field("last", pa.int64(), nullable=False),
        pa.field("ts", pa.int64(), nullable=False),
    ]
)

DEFAULT_BLOCK_SIZE = 100_000


def block_of(seq: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """The block a stream sequence belongs to."""
    return seq // block_size


#: What a message counts for in stream state beyond its subject, header block and payload, by the
#: stream's ``storage``, as JetStream's stores count a record: (per message, per header block).
#: The file store adds 30 bytes and a header block's own 4-byte length, the memory store 16.
RECORD_OVERHEAD: dict[str, tuple[int, int]] = {"file": (30, 4), "memory": (16, 0)}
FILE_RECORD = RECORD_OVERHEAD["file"]


def stored_size(
    subject: str, hdrs: bytes | None, data: bytes, overhead: tuple[int, int] = FILE_RECORD
) -> int:
    """Bytes a message counts for in stream state (``overhead``: its storage's
    ``RECORD_OVERHEAD``)."""
    per_msg, per_hdrs = overhead
    return per_msg + len(subject) + (len(hdrs) + per_hdrs if hdrs else 0) + len(data)


ACKS = "acks"

ACK_PARTITIONS: list[str] = []

#: The consumer ack log: one row per consumer state change, ordered by ``lsn``. Every row carries
#: the consumer's positions (delivered and ack floor) *after* its change, so the newest row of a
#: consumer gives them directly.
ACK_SCHEMA = pa.schema(
    [
        pa.field("lsn", pa.int64(), nullable=False),
        pa.field("stream", pa.string(), nullable=False),
        pa.field("consumer", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("cseq", pa.int64(), nullable=False),
        pa.field("deliveries", pa.int64(), nullable=False),
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("delivered_seq", pa.int64(), nullable=False),
        pa.field("delivered_cseq", pa.int64(), nullable=False),
        pa.field("floor_seq", pa.int64(), nullable=False),
        pa.field("floor_cseq", pa.int64(), nullable=False),
        pa.field("body", pa.string(), nullable=True),
    ]
)

ACKFLOORS = "ackfloors"

#: What the ack-floor job found, one row per consumer per run (``run_ts``, Unix ns, is the same for
#: every row of a run), so history can be plotted: positions, pending, redelivered and lag.
ACKFLOORS_SCHEMA = pa.schema(
    [
        pa.field("run_ts", pa.int64(), nullable=False),
        pa.field("stream", pa.string(), nullable=False),
        pa.field("consumer", pa.string(), nullable=False),
        pa.field("floor_seq", pa.int64(), nullable=False),
        pa.field("floor_cseq", pa.int64(), nullable=False),
        pa.field("delivered_seq", pa.int64(), nullable=False),
        pa.field("delivered_cseq", pa.int64(), nullable=False),
        pa.field("num_ack_pending", pa.int64(), nullable=False),
        pa.field("num_redelivered", pa.int64(), nullable=False),
        pa.field("stream_last_seq", pa.int64(), nullable=False),
        pa.field("lag", pa.int64(), nullable=False),
    ]
)

JOBRUNS = "jobruns"

#: One row per finished run of a ``jetlake jobs`` job: what the monitor reports about the jobs.
JOBRUNS_SCHEMA = pa.schema(
    [
        pa.field("job", pa.string(), nullable=False),
        pa.field("started", pa.int64(), nullable=False),
        pa.field("seconds", pa.float64(), nullable=False),
        pa.field("rows_removed", pa.int64(), nullable=False),
        pa.field("files_removed", pa.int64(), nullable=False),
        pa.field("files_added", pa.int64(), nullable=False),
        pa.field("bytes_before", pa.int64(), nullable=False),
        pa.field("bytes_after", pa.int64(), nullable=False),
    ]
)

JOBFAILURES = "jobfailures"

#: One row per run of a ``jetlake jobs`` job that ended with an error, and the error's words.
JOBFAILURES_SCHEMA = pa.schema(
    [
        pa.field("job", pa.string(), nullable=False),
        pa.field("started", pa.int64(), nullable=False),
        pa.field("seconds", pa.float64(), nullable=False),
        pa.field("error", pa.string(), nullable=False),
    ]
)
