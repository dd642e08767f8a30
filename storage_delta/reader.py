"""Reading messages back: by sequence range, and the scan that rebuilds stream state on start.

Reads prune by the ``stream``/``block`` partitions first and by the ``seq`` row-group statistics
second, so the cost of a read follows its range, not the table's size.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable

from storage_delta import schema as sch
from storage_delta.tables import StoreRoot, open_existing


class MessageReader:
    """Reads the ``messages`` table; every method blocks and belongs on a worker thread."""

    def __init__(self, root: StoreRoot) -> None:
        self.root = root
        self._dt: DeltaTable | None = None

    def _table(self) -> DeltaTable | None:
        if self._dt is None:
            self._dt = open_existing(self.root, sch.MESSAGES)
        else:
            self._dt.update_incremental()
        return self._dt

    def _dataset(self, stream: str, blocks: list[int] | None = None) -> ds.Dataset | None:
        dt = self._table()
        if dt is None:
            return None
        parts: list[tuple[str, str, str | list[str]]] = [("stream", "=", stream)]
        if blocks is not None:
            parts.append(("block", "in", [str(b) for b in blocks]))
        try:
            return dt.to_pyarrow_dataset(partitions=parts)
        except Exception as exc:  # no file matches the partition filter
            if "partition" in str(exc).lower():
                return None
            raise

    def read_range(self, stream: str, first: int, last: int, block_size: int, min_ts: int = 0) -> pa.Table:
        """Messages with ``first <= seq <= last`` of one stream, ordered by sequence; ``min_ts`` (the
        stream's created time) leaves out rows of an earlier stream of the same name."""
        blocks = list(range(sch.block_of(first, block_size), sch.block_of(last, block_size) + 1))
        dset = self._dataset(stream, blocks)
        if dset is None:
            return sch.MESSAGE_FILE_SCHEMA.empty_table()
        expr = (ds.field("seq") >= first) & (ds.field("seq") <= last) & (ds.field("ts") >= min_ts)
        table = dset.to_table(filter=expr, columns=sch.MESSAGE_FILE_SCHEMA.names)
        return table.sort_by("seq")

    def scan_index(self, stream: str, min_ts: int = 0) -> list[tuple[int, int, str, int]]:
        """(seq, ts, subject, stored size) of every stored message of a stream stored at or after
        ``min_ts``, in sequence order: what the gateway needs to rebuild its state. Sizes come from
        the binary offsets."""
        dset = self._dataset(stream)
        if dset is None:
            return []
        table = dset.to_table(
            columns=["seq", "ts", "subject", "hdrs", "data"], filter=ds.field("ts") >= min_ts
        )
        if table.num_rows == 0:
            return []
        table = table.sort_by("seq")
        hdrs = table.column("hdrs")
        hdr_len = pc.add(pc.fill_null(pc.binary_length(hdrs), -4), 4)
        size = pc.add(
            pc.add(pc.binary_length(table.column("subject")), pc.binary_length(table.column("data"))),
            pc.add(hdr_len, 30),
        )
        return list(
            zip(
                table.column("seq").to_pylist(),
                table.column("ts").to_pylist(),
                table.column("subject").to_pylist(),
                size.to_pylist(),
                strict=True,
            )
        )

    def scan_headers_since(self, stream: str, since_ts: int) -> list[tuple[int, int, bytes | None]]:
        """(seq, ts, header block) of a stream's messages stored at or after ``since_ts``, in
        sequence order: the gateway rebuilds its ``Nats-Msg-Id`` duplicate window from them."""
        dset = self._dataset(stream)
        if dset is None:
            return []
        table = dset.to_table(filter=ds.field("ts") >= since_ts, columns=["seq", "ts", "hdrs"])
        table = table.sort_by("seq")
        return list(
            zip(
                table.column("seq").to_pylist(),
                table.column("ts").to_pylist(),
                table.column("hdrs").to_pylist(),
                strict=True,
            )
        )
