"""The ``jobruns`` table: one row per finished run of a maintenance job, so the monitor can say how
often the jobs ran, when last, and how much they removed, without asking the job process (which may
run elsewhere, under spark-submit). Append-only, not partitioned; docs/storage.md has the schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from storage_delta.commit.append import TableAppender, TableSpec
from storage_delta.commit.store import StoreRoot, open_existing
from storage_delta.format import schema as sch

JOBRUNS_TABLE = TableSpec(sch.JOBRUNS, sch.JOBRUNS_SCHEMA)


@dataclass(slots=True)
class RunFigures:
    """What a maintenance run changed in the messages table: the figures the job counts as it goes
    and the ``jobruns`` row keeps."""

    rows_removed: int = 0
    files_removed: int = 0
    files_added: int = 0
    bytes_before: int = 0
    bytes_after: int = 0


@dataclass(frozen=True, slots=True)
class JobRun:
    job: str
    started: int  # Unix ns
    seconds: float
    figures: RunFigures = field(default_factory=RunFigures)


@dataclass(frozen=True, slots=True)
class JobFigures:
    """One job's runs so far: how many, rows removed in all, and the newest run (what it took and
    what it changed)."""

    runs: int
    rows_removed: int
    last: JobRun


def record_run(root: StoreRoot, run: JobRun) -> None:
    """Append one run. Runs are rare and never repeated, so no txn marker: a lost race with another
    job process is retried by the append primitive."""
    # the figures a job's own outcome may extend, as the table has them
    figures = {name: getattr(run.figures, name) for name in RunFigures.__dataclass_fields__}
    fields = {"job": run.job, "started": run.started, "seconds": run.seconds, **figures}
    row = pa.Table.from_pylist([fields], schema=sch.JOBRUNS_SCHEMA)
    appender = TableAppender(root, JOBRUNS_TABLE, None)
    try:
        appender.append([({}, row)], None)
    finally:
        appender.close()


def job_figures(root: StoreRoot) -> dict[str, JobFigures]:
    """Every job that has run, by name (empty before the first run)."""
    dt = open_existing(root, sch.JOBRUNS)
    if dt is None:
        return {}
    out: dict[str, JobFigures] = {}
    # oldest first, so each job's newest run is the last one seen (runs are few: one row each)
    for row in sorted(dt.to_pyarrow_table().to_pylist(), key=lambda r: r["started"]):
        figures = RunFigures(**{name: row[name] for name in RunFigures.__dataclass_fields__})
        run = JobRun(row["job"], row["started"], row["seconds"], figures)
        before = out.get(run.job)
        runs, removed = (before.runs, before.rows_removed) if before is not None else (0, 0)
        out[run.job] = JobFigures(runs + 1, removed + figures.rows_removed, run)
    return out
