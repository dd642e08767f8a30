"""``jetlake jobs``: run a maintenance job once, or keep running them on the intervals of
``conf/jobs.toml``. Also runnable through ``spark-submit spark_jobs/cli.py run seal``, in which case
the master and resources are spark-submit's.

PySpark is imported only when a job runs, so ``jetlake serve`` never pays for it.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_jobs.settings import JobSettings
    from storage_delta.commit.store import StoreRoot

log = logging.getLogger("jetlake.jobs")


def add_parser(sub: Any) -> None:
    """Add ``jobs run`` and ``jobs schedule`` to a parent parser's subcommands, each with a flag for
    every job and Spark setting. (Our imports wait for a call: run as a file under spark-submit, this
    module puts the repository on the path first.)"""
    from spark_jobs.settings import JOBS_LOADER, SPARK_LOADER, Intervals

    jobs = sub.add_parser("jobs", help="run the Spark maintenance jobs")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", required=True)
    run = jobs_sub.add_parser("run", help="run jobs once, in the order given")
    run.add_argument("job", choices=[f.name for f in fields(Intervals)], nargs="+")
    schedule = jobs_sub.add_parser("schedule", help="run every job on its interval until stopped")
    for p in (run, schedule):
        JOBS_LOADER.add_flags(p)
        SPARK_LOADER.add_flags(p)


def main(args: argparse.Namespace) -> int:
    from spark_jobs.settings import JOBS_LOADER, SPARK_LOADER
    from storage_delta.format.settings import SettingsError

    try:
        settings = JOBS_LOADER.load(vars(args))
        spark_settings = SPARK_LOADER.load(vars(args))
    except SettingsError as exc:
        print(f"jetlake jobs: {exc}", file=sys.stderr)
        return 2
    from spark_jobs.session import build_spark_session

    spark = build_spark_session(app_name=f"jetlake-jobs-{args.jobs_command}", settings=spark_settings)
    try:
        if args.jobs_command == "run":
            for job in args.job:
                run_job(spark, job, settings)
            return 0
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        schedule(lambda job: run_job(spark, job, settings), asdict(settings.every), stop)
        return 0
    finally:
        spark.stop()


def run_job(spark: Any, job: str, settings: JobSettings) -> None:
    """One job, recorded in the ``jobruns`` table once done, or in ``jobfailures`` with its error
    when it fails (and the error raised again); a job that rewrites ``messages`` is followed by a
    vacuum that keeps the margin and a Delta checkpoint."""
    from storage_delta.commit.store import StoreRoot
    from storage_delta.tables.jobruns import JobRun, record_run

    root = StoreRoot(settings.data_root)
    started_ns = time.time_ns()
    started = time.monotonic()
    log.info("%s: starting on %s", job, root.uri)
    try:
        _run_job(spark, job, settings, root, started_ns, started)
    except Exception as exc:
        record_run(
            root, JobRun(job, started_ns, time.monotonic() - started, error=f"{type(exc).__name__}: {exc}")
        )
        raise


def _run_job(
    spark: Any, job: str, settings: JobSettings, root: StoreRoot, started_ns: int, started: float
) -> None:
    from spark_jobs import compaction
    from spark_jobs.ackfloors import ackfloors
    from storage_delta.format import schema as sch
    from storage_delta.maintenance import files as maintenance
    from storage_delta.maintenance.vacuum import MIN_RETENTION_HOURS, vacuum
    from storage_delta.tables.jobruns import JobRun, record_run
    from storage_delta.tables.removals import compact_removals, load_stream_states

    if job == "ackfloors":
        run, rows = ackfloors(spark, root)
        record_run(root, JobRun(job, started_ns, time.monotonic() - started))
        log.info("ackfloors: run %d done in %.1fs: %d consumers", run, time.monotonic() - started, len(rows))
        return
    if job == "removals":
        folded = compact_removals(root)
        # The folded files go after the margin, as in ``messages``; never sooner (a reader that
        # listed them may still be reading), so a shorter margin leaves them to a later run.
        gone = []
        if settings.vacuum_margin_hours >= MIN_RETENTION_HOURS:
            gone = vacuum(root, settings.vacuum_margin_hours, dry_run=False, table=sch.REMOVALS)
        record_run(root, JobRun(job, started_ns, time.monotonic() - started))
        log.info(
            "removals: done in %.1fs: files %d -> %d, rows %d -> %d, %d files vacuumed",
            time.monotonic() - started,
            folded.files_before,
            folded.files_after,
            folded.rows_before,
            folded.rows_after,
            len(gone),
        )
        return
    if job == "seal":
        out = compaction.seal(spark, root, settings.seal_min_files)
    elif job == "retention":
        out = compaction.retention(spark, root, load_stream_states)
    else:
        raise ValueError(f"unknown job {job!r}")
    vacuumed = maintenance.vacuum(root, settings.vacuum_margin_hours)
    maintenance.checkpoint(root)
    record_run(root, JobRun(job, started_ns, time.monotonic() - started, out))
    log.info(
        "%s: done in %.1fs: %d files removed, %d added, %d rows removed, live bytes %d -> %d, "
        "%d files vacuumed, %d swaps abandoned",
        job,
        time.monotonic() - started,
        out.files_removed,
        out.files_added,
        out.rows_removed,
        out.bytes_before,
        out.bytes_after,
        len(vacuumed),
        out.abandoned,
    )


def schedule(
    run: Callable[[str], None],
    every: Mapping[str, float],
    stop: threading.Event,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Run each job when due, one at a time, until ``stop`` is set. A failed run is logged and
    retried at its next interval: one bad run must not end the schedule."""
    due = dict.fromkeys(every, clock())
    while not stop.is_set():
        job = min(due, key=lambda j: due[j])
        wait = due[job] - clock()
        if wait > 0:
            stop.wait(wait)
            continue
        try:
            run(job)
        except Exception:
            log.exception("%s failed; next attempt in %gs", job, every[job])
        due[job] = clock() + every[job]


def _standalone(argv: list[str] | None = None) -> int:
    """Entry point for ``spark-submit spark_jobs/cli.py run|schedule ...``."""
    parser = argparse.ArgumentParser(prog="jetlake")
    add_parser(parser.add_subparsers(dest="command", required=True))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return main(parser.parse_args(["jobs", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    # Run as a file (spark-submit), the repository root is not on the path by itself.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(_standalone())
