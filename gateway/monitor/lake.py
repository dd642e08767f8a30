"""The lake side of every stream, for the operator: the ``messages`` table's version, each stream's
live files and bytes, what waits for compaction and sealing, removed messages still on storage, the
index snapshots' age, the last compaction round and maintenance job runs; and warnings that say
what to do.

The tables are read on the gateway's executor, at most once every ``monitor_lake_refresh_ms`` (an answer in
between gets the last reading: a scrape every few seconds must not become a table scan every few
seconds), through one handle caught up incrementally (:class:`~storage_delta.maintenance.census.Census`),
plus one listing of the index snapshots and the small ``jobruns`` table. What the gateway keeps in
memory (messages per stream, the compactor's rounds, how far each snapshot is behind) is read on
the event loop at every answer.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from gateway.adapters.compactor import RoundRecord
from gateway.api.timefmt import rfc3339
from gateway.runtime.settings import Settings
from gateway.service.gateway import Core
from storage_delta.commit.store import StoreRoot
from storage_delta.maintenance.census import Census, StreamFiles, TableCensus
from storage_delta.read import index_snapshot
from storage_delta.tables.jobruns import JobFigures, job_figures

#: The fanout the census plans with when the gateway's compaction is off (the default setting's).
DEFAULT_FANOUT = 16
#: Warn from this many small files waiting for compaction in one stream (a healthy stream has
#: fewer than the fanout per tier, about a hundred at most).
PENDING_FILES_WARN = 256
#: Warn from this many full blocks of one stream not yet sealed.
UNSEALED_BLOCKS_WARN = 4
#: Warn when removed messages still stored reach this many bytes, or half a stream's files (from
#: ``RECLAIM_WARN_MIN_BYTES``, so a small stream is left alone).
RECLAIM_WARN_BYTES = 1 << 30
RECLAIM_WARN_MIN_BYTES = 1 << 20
#: Warn when a stream has this many times ``index_snapshot_min_new`` messages beyond its snapshot.
SNAPSHOT_BEHIND_FACTOR = 4


@dataclass(frozen=True, slots=True)
class TableReading:
    """What one refresh read from the tables (on the executor)."""

    mono: float
    census: TableCensus
    snapshots: dict[str, int]  # stream -> when its index snapshot was written, Unix ns
    jobs: dict[str, JobFigures]
    #: per stream, noted on the loop just before the census: messages the stream shows at or below
    #: its durable sequence (the rows its files should hold)
    visible: dict[str, int]


@dataclass(frozen=True, slots=True)
class StreamLake:
    name: str
    files: StreamFiles
    #: estimated bytes of rows the stream no longer shows that its files still hold (and the files
    #: of an earlier stream of the name): what the retention job reclaims
    unreclaimed_bytes: int
    snapshot_written_ns: int | None
    snapshot_behind: int
    #: why its index snapshot was found damaged, until one is written over it (None: not damaged)
    snapshot_damage: str | None
    compaction: RoundRecord | None


@dataclass(frozen=True, slots=True)
class LakeWarning:
    stream: str | None
    text: str


@dataclass(frozen=True, slots=True)
class LakeReport:
    version: int
    read_ns: int
    streams: list[StreamLake]
    jobs: dict[str, JobFigures]
    compaction_on: bool
    compaction_rounds: int
    compaction_failed_rounds: int
    compaction_files_merged: int
    warnings: list[LakeWarning]


def unreclaimed(files: StreamFiles, visible: int) -> int:
    """Bytes of removed rows still stored: the rows beyond what the stream shows, at the average
    row size of its files, plus an earlier incarnation's files."""
    current_bytes = files.bytes - files.stale_bytes
    extra = max(0, files.rows_through - visible)
    per_row = current_bytes / files.rows if files.rows else 0.0
    return files.stale_bytes + round(extra * per_row)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_age(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def warnings(
    streams: list[StreamLake], jobs: dict[str, JobFigures], settings: Settings, now_ns: int
) -> list[LakeWarning]:
    """What an operator should act on, each with what to do."""
    out: list[LakeWarning] = []
    compaction_on = settings.compact_min_files > 0
    for job, figures in sorted(jobs.items()):
        if figures.last.error:
            ago = human_age((now_ns - figures.last.started) / 1e9)
            out.append(
                LakeWarning(
                    None,
                    f"the last run of the {job} job, {ago} ago, failed: {figures.last.error}; see the "
                    f"job's log (`jetlake jobs run {job}` prints it) and run it again",
                )
            )
    for s in streams:
        f, name = s.files, s.name
        if f.compaction_pending_files >= PENDING_FILES_WARN:
            head = (
                f"{f.compaction_pending_files:,} small files waiting for compaction in {name} "
                f"({f.active_block_files:,} in the active block): "
            )
            if not compaction_on:
                out.append(
                    LakeWarning(
                        name,
                        head + "the gateway's compaction is off (compact_min_files = 0); turn it on, "
                        "or run `jetlake jobs run seal` as blocks fill",
                    )
                )
            else:
                out.append(
                    LakeWarning(name, head + "compaction is behind; see the gateway log for its rounds")
                )
        if s.compaction is not None and s.compaction.error:
            ago = human_age((now_ns - s.compaction.ended_ns) / 1e9)
            out.append(
                LakeWarning(
                    name,
                    f"the last compaction round of {name} failed {ago} ago: {s.compaction.error}; "
                    f"it is tried again every {settings.compact_interval_ms / 1000:g} s",
                )
            )
        if f.unsealed_full_blocks >= UNSEALED_BLOCKS_WARN:
            out.append(
                LakeWarning(
                    name,
                    f"{f.unsealed_full_blocks:,} full blocks of {name} are still made of several files: "
                    "the seal job is behind; run `jetlake jobs run seal` or keep `jetlake jobs "
                    "schedule` running",
                )
            )
        stored = s.unreclaimed_bytes
        if stored >= RECLAIM_WARN_BYTES or (stored >= RECLAIM_WARN_MIN_BYTES and 2 * stored >= f.bytes):
            last = jobs.get("retention")
            when = (
                "it has never run"
                if last is None
                else f"its last run was {human_age((now_ns - last.last.started) / 1e9)} ago"
            )
            out.append(
                LakeWarning(
                    name,
                    f"{human_bytes(stored)} of {name}'s {human_bytes(f.bytes)} on storage are removed "
                    f"messages not yet reclaimed ({when}): run `jetlake jobs run retention`",
                )
            )
        if s.snapshot_behind >= SNAPSHOT_BEHIND_FACTOR * settings.index_snapshot_min_new:
            written = (
                "it has none"
                if s.snapshot_written_ns is None
                else f"written {human_age((now_ns - s.snapshot_written_ns) / 1e9)} ago"
            )
            out.append(
                LakeWarning(
                    name,
                    f"{s.snapshot_behind:,} messages of {name} are beyond its index snapshot ({written}): "
                    "a restart after a crash reads them all from the message files; see the gateway "
                    "log for failed snapshots",
                )
            )
    return out


class Lake:
    def __init__(self, root: StoreRoot, executor: Executor, settings: Settings) -> None:
        self.root = root
        self.executor = executor
        self.settings = settings
        self.refresh_s = settings.monitor_lake_refresh_ms / 1000
        self.fanout = settings.compact_min_files or DEFAULT_FANOUT
        self._census = Census(root)
        self._reading: TableReading | None = None
        self._lock = asyncio.Lock()

    def _read(self, created: dict[str, int], through: dict[str, int]) -> TableCensus:
        return self._census.take(created, through, self.fanout, self.settings.compact_max_file_bytes)

    async def _table(self, core: Core) -> TableReading:
        """The last reading of the tables, taken again when older than ``refresh_s`` (one at a
        time: callers that arrive meanwhile wait for it)."""
        async with self._lock:
            r = self._reading
            if r is not None and time.monotonic() - r.mono < self.refresh_s:
                return r
            streams = list(core.registry.streams.values())
            created = {s.name: s.created_ns for s in streams}
            through = {s.name: s.durable_last_seq for s in streams}
            # the messages at or below the durable sequence: those accepted above it are not in files
            visible = {s.name: s.state.messages - (s.state.last_seq - s.durable_last_seq) for s in streams}
            loop = asyncio.get_running_loop()
            census = await loop.run_in_executor(self.executor, self._read, created, through)
            snaps = await loop.run_in_executor(self.executor, index_snapshot.written_times, self.root)
            jobs = await loop.run_in_executor(self.executor, job_figures, self.root)
            self._reading = TableReading(time.monotonic(), census, snaps, jobs, visible)
            return self._reading

    async def report(self, core: Core) -> LakeReport:
        r = await self._table(core)
        compactor = core.compactor
        streams = []
        for name, stream in sorted(core.registry.streams.items()):
            files = r.census.streams.get(name)
            if files is None:  # created since the reading: nothing to say about its files yet
                files = StreamFiles()
            streams.append(
                StreamLake(
                    name,
                    files,
                    unreclaimed(files, r.visible.get(name, 0)),
                    r.snapshots.get(name),
                    core.snapshots.behind(stream),
                    core.snapshots.damaged.get(name),
                    compactor.last.get(name) if compactor is not None else None,
                )
            )
        now = time.time_ns()
        return LakeReport(
            r.census.version,
            now - round((time.monotonic() - r.mono) * 1e9),
            streams,
            r.jobs,
            compactor is not None,
            compactor.rounds if compactor else 0,
            compactor.failed_rounds if compactor else 0,
            compactor.files_merged if compactor else 0,
            warnings(streams, r.jobs, self.settings, now),
        )


def render_lake(report: LakeReport, now_ns: int) -> dict[str, Any]:
    """The JSON of ``/lake``."""

    def age(ns: int) -> float:
        return round((now_ns - ns) / 1e9, 3)

    def stream(s: StreamLake) -> dict[str, Any]:
        f = s.files
        c = s.compaction
        return {
            "name": s.name,
            "files": f.files,
            "bytes": f.bytes,
            "rows": f.rows,
            "blocks": f.blocks,
            "active_block_files": f.active_block_files,
            "compaction_pending_files": f.compaction_pending_files,
            "unsealed_full_blocks": f.unsealed_full_blocks,
            "unreclaimed_bytes": s.unreclaimed_bytes,
            "index_snapshot": {
                "written": rfc3339(s.snapshot_written_ns) if s.snapshot_written_ns else None,
                "age_s": age(s.snapshot_written_ns) if s.snapshot_written_ns else None,
                "behind": s.snapshot_behind,
                "damaged": s.snapshot_damage,
            },
            "compaction": None
            if c is None
            else {
                "ended": rfc3339(c.ended_ns),
                "age_s": age(c.ended_ns),
                "seconds": round(c.seconds, 6),
                "files_merged": c.files_merged,
                "error": c.error,
            },
        }

    return {
        "version": report.version,
        "read": rfc3339(report.read_ns),
        "read_age_s": age(report.read_ns),
        "compaction": {
            "on": report.compaction_on,
            "rounds": report.compaction_rounds,
            "failed_rounds": report.compaction_failed_rounds,
            "files_merged": report.compaction_files_merged,
        },
        "streams": [stream(s) for s in report.streams],
        "jobs": {
            job: {
                "runs": f.runs,
                "failures": f.failures,
                "rows_removed": f.rows_removed,
                "last": {
                    "error": f.last.error,
                    "started": rfc3339(f.last.started),
                    "age_s": age(f.last.started),
                    "seconds": round(f.last.seconds, 3),
                    "rows_removed": f.last.figures.rows_removed,
                    "files_removed": f.last.figures.files_removed,
                    "files_added": f.last.figures.files_added,
                    "bytes_before": f.last.figures.bytes_before,
                    "bytes_after": f.last.figures.bytes_after,
                },
            }
            for job, f in sorted(report.jobs.items())
        },
        "warnings": [{"stream": w.stream, "text": w.text} for w in report.warnings],
    }
