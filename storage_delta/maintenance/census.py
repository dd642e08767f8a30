"""What the ``messages`` table holds per stream, for the operator: files, bytes, rows, and how much
of it is waiting for the compaction or the seal job.

Read from one long-lived handle caught up incrementally (as the gateway's compaction does), so a
census costs the commits since the last one plus a walk over the live files' ``add`` actions, never
a data file. The plan of what compaction would merge is the compaction's own
(:func:`~storage_delta.maintenance.recent.plan_recent`), so "waiting for compaction" means exactly
the files its next rounds would take.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from deltalake import DeltaTable

from storage_delta.commit.store import StoreRoot, catch_up, open_existing
from storage_delta.format import schema as sch
from storage_delta.maintenance.files import LiveFile, live_files_of
from storage_delta.maintenance.recent import plan_recent


@dataclass(slots=True)
class StreamFiles:
    """One stream's live files in the table's current version."""

    files: int = 0
    bytes: int = 0
    #: Rows of the stream's current incarnation (an earlier one's are ``stale_*``), and those of
    #: them in files wholly at or below the census's ``through`` sequence.
    rows: int = 0
    rows_through: int = 0
    blocks: int = 0
    #: Files of the highest block, where new commits land.
    active_block_files: int = 0
    #: Small files the compaction's plan would merge (active block and full blocks alike).
    compaction_pending_files: int = 0
    #: Full blocks (below the highest) still made of two or more files: the seal job's work.
    unsealed_full_blocks: int = 0
    #: Files of an earlier stream of the same name, which every read skips: the retention job's.
    stale_files: int = 0
    stale_bytes: int = 0


@dataclass(frozen=True, slots=True)
class TableCensus:
    version: int  # -1: no table yet
    streams: dict[str, StreamFiles] = field(default_factory=dict)


def count_files(
    files: list[LiveFile],
    created: Mapping[str, int],
    through: Mapping[str, int],
    fanout: int,
    max_file_bytes: int,
) -> dict[str, StreamFiles]:
    """The per-stream figures of ``files``, for the live streams in ``created`` (name → incarnation);
    ``through`` (name → sequence) sets where ``rows_through`` stops counting: a caller that noted a
    stream's state and durable sequence before the census compares like with like, whatever was
    committed since."""
    out = {name: StreamFiles() for name in created}
    blocks: dict[str, dict[int, int]] = {name: {} for name in created}
    for f in files:
        s = out.get(f.stream)
        if s is None:
            continue
        s.files += 1
        s.bytes += f.size
        if f.max_ts is not None and f.max_ts < created[f.stream]:
            s.stale_files += 1
            s.stale_bytes += f.size
            continue
        s.rows += f.rows or 0
        if f.max_seq is not None and f.max_seq <= through.get(f.stream, 0):
            s.rows_through += f.rows or 0
        per_block = blocks[f.stream]
        per_block[f.block] = per_block.get(f.block, 0) + 1
    for name, per_block in blocks.items():
        if not per_block:
            continue
        s, top = out[name], max(per_block)
        s.blocks = len(per_block)
        s.active_block_files = per_block[top]
        s.unsealed_full_blocks = sum(1 for b, n in per_block.items() if b < top and n >= 2)
    for run in plan_recent(files, created, fanout, max_file_bytes):
        out[run[0].stream].compaction_pending_files += len(run)
    return out


class Census:
    """Censuses of one root's ``messages`` table through one handle. One at a time (a handle is
    not shared between threads); blocks: belongs on a worker thread."""

    def __init__(self, root: StoreRoot) -> None:
        self.root = root
        self._dt: DeltaTable | None = None

    def take(
        self, created: Mapping[str, int], through: Mapping[str, int], fanout: int, max_file_bytes: int
    ) -> TableCensus:
        if self._dt is None:
            self._dt = open_existing(self.root, sch.MESSAGES)
        else:
            catch_up(self._dt)
        if self._dt is None:
            return TableCensus(-1, {name: StreamFiles() for name in created})
        files = live_files_of(self._dt)
        return TableCensus(self._dt.version(), count_files(files, created, through, fanout, max_file_bytes))
