"""The ``ackfloors`` table: what the ack-floor job found about every consumer, one row per consumer
per run, appended (commits tagged ``(jetlake-ackfloors, n)``, n the run number), so the notebook
and the monitor can plot a consumer's floor, pending and lag over time without replaying the ack
log themselves. docs/storage.md has the schema.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from storage_delta.commit.append import Part, TableAppender, TableSpec
from storage_delta.commit.store import StoreRoot, open_existing
from storage_delta.commit.txns import app_version
from storage_delta.format import schema as sch
from storage_delta.maintenance.files import live_files
from storage_delta.tables.catalog import CatalogTable
from storage_delta.tables.removals import StreamLogicalState

APP_ID = "jetlake-ackfloors"
ACKFLOORS_TABLE = TableSpec(sch.ACKFLOORS, sch.ACKFLOORS_SCHEMA)


@dataclass(frozen=True, slots=True)
class AckFloorRow:
    """One consumer at one run; fields in the table's column order."""

    run_ts: int
    stream: str
    consumer: str
    floor_seq: int
    floor_cseq: int
    delivered_seq: int
    delivered_cseq: int
    num_ack_pending: int
    num_redelivered: int
    stream_last_seq: int
    lag: int


@dataclass(frozen=True, slots=True)
class LatestRun:
    """The newest run in the table: its number (the txn version), time and rows."""

    runs: int
    run_ts: int
    rows: list[dict[str, Any]]


def live_consumers(root: StoreRoot) -> dict[tuple[str, str], int]:
    """(stream, consumer) → created time (ns) of every consumer the catalog has (none, and no table
    created, in a store without a catalog)."""
    if open_existing(root, sch.CATALOG) is None:
        return {}
    return {
        (e.stream, e.name): int(e.body["created"]) for e in CatalogTable(root).load() if e.kind == "consumer"
    }


def stream_last_seqs(root: StoreRoot, states: dict[str, StreamLogicalState]) -> dict[str, int]:
    """Each live stream's last sequence: the highest stored in its current incarnation (from the
    files' statistics, no data read) or covered by a removal (a purge leaves no stored message)."""
    out = {name: state.last_seq for name, state in states.items()}
    for f in live_files(root):
        state = states.get(f.stream)
        if state is None or f.max_seq is None or (f.max_ts is not None and f.max_ts < state.created):
            continue
        out[f.stream] = max(out[f.stream], f.max_seq)
    return out


def append_run(root: StoreRoot, rows: list[AckFloorRow]) -> int:
    """Commit one run's rows as one version; returns the run number. Only the job writes here and
    runs one at a time, so the run number is one past the table's newest."""
    appender = TableAppender(root, ACKFLOORS_TABLE, APP_ID)
    run = appender.next_version()
    parts: list[Part] = []
    if rows:
        columns = zip(*(astuple(r) for r in rows), strict=True)
        table = pa.table(
            {f.name: list(col) for f, col in zip(sch.ACKFLOORS_SCHEMA, columns, strict=True)},
            schema=sch.ACKFLOORS_SCHEMA,
        )
        parts = [({}, table)]
    try:
        appender.append(parts, run)
    finally:
        appender.close()
    return run


def latest_run(root: StoreRoot) -> LatestRun | None:
    """The newest run's rows, or None before the first run."""
    dt = open_existing(root, sch.ACKFLOORS)
    if dt is None:
        return None
    runs = app_version(root, sch.ACKFLOORS, dt, APP_ID)
    table = dt.to_pyarrow_table()
    if table.num_rows == 0:
        return LatestRun(runs, 0, [])
    newest = pc.max(table["run_ts"]).as_py()
    rows = table.filter(pc.equal(table["run_ts"], newest)).sort_by(
        [("stream", "ascending"), ("consumer", "ascending")]
    )
    return LatestRun(runs, int(newest), rows.to_pylist())
