"""The ``jobruns`` table: one row per finished run of a maintenance job, so the monitor can say how
often the jobs ran, when last, and how much they removed, without asking the job process (which may
run elsewhere, under spark-submit); and ``jobfailures``: one row per run that ended with an error,
with its words, so the monitor can say a job is failing. Append-only, not partitioned;
docs/storage.md has the schemas.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from storage_delta.commit.append import TableAppender, TableSpec
from storage_delta.commit.store import StoreRoot, open_existing
from storage_delta.format import schema as sch

JOBRUNS_TABLE = TableSpec(sch.JOBRUNS, sch.JOBRUNS_SCHEMA)
JOBFAILURES_TABLE = TableSpec(sch.JOBFAILURES, sch.JOBFAILURES_SCHEMA)
#: Characters of an error kept: enough to say what failed, not a whole traceback.
ERROR_CHARS = 500


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
    #: why the run failed ("": it finished)
    error: str = ""


@dataclass(frozen=True, slots=True)
class JobFigures:
    """One job's runs so far: how many (failed ones included), rows removed in all, and the newest
    run (what it took and what it changed, or why it failed); how many failed."""

    runs: int
    rows_removed: int
    last: JobRun
    failures: int = 0


def record_run(root: StoreRoot, run: JobRun) -> None:
    """Append one run, to ``jobfailures`` when it failed. Runs are rare and never repeated, so no txn
    marker: a lost race with another job process is retried by the append primitive."""
    if run.error:
        fields: dict[str, object] = {"job": run.job, "started": run.started, "seconds": run.seconds}
        row = pa.Table.from_pylist(
            [{**fields, "error": run.error[:ERROR_CHARS]}], schema=sch.JOBFAILURES_SCHEMA
        )
        spec = JOBFAILURES_TABLE
    else:
        # the figures a job's own outcome may extend, as the table has them
        figures = {name: getattr(run.figures, name) for name in RunFigures.__dataclass_fields__}
        fields = {"job": run.job, "started": run.started, "seconds": run.seconds, **figures}
        row = pa.Table.from_pylist([fields], schema=sch.JOBRUNS_SCHEMA)
        spec = JOBRUNS_TABLE
    appender = TableAppender(root, spec, None)
    try:
        appender.append([({}, row)], None)
    finally:
        appender.close()


def _runs(root: StoreRoot) -> list[JobRun]:
    runs = []
    done = open_existing(root, sch.JOBRUNS)
    for row in [] if done is None else done.to_pyarrow_table().to_pylist():
        figures = RunFigures(**{name: row[name] for name in RunFigures.__dataclass_fields__})
        runs.append(JobRun(row["job"], row["started"], row["seconds"], figures))
    failed = open_existing(root, sch.JOBFAILURES)
    for row in [] if failed is None else failed.to_pyarrow_table().to_pylist():
        runs.append(JobRun(row["job"], row["started"], row["seconds"], error=row["error"]))
    return runs


def job_figures(root: StoreRoot) -> dict[str, JobFigures]:
    """Every job that has run, by name (empty before the first run)."""
    out: dict[str, JobFigures] = {}
    # oldest first, so each job's newest run is the last one seen (runs are few: one row each)
    for run in sorted(_runs(root), key=lambda r: r.started):
        before = out.get(run.job)
        runs, removed, failures = (before.runs, before.rows_removed, before.failures) if before else (0, 0, 0)
        out[run.job] = JobFigures(
            runs + 1, removed + run.figures.rows_removed, run, failures + (1 if run.error else 0)
        )
    return out
