"""The settings of ``jetlake jobs`` (``conf/jobs.toml``, ``JETLAKE_JOBS_<KEY>``) and of every
SparkSession jetlake builds (``conf/spark.toml``, ``JETLAKE_SPARK_<KEY>``), through the one loader
(``storage_delta/format/settings.py``).

Apart from ``spark_jobs/session.py`` because that imports PySpark, and the command line needs these
classes to build its flags: ``jetlake serve`` must not pay for starting PySpark.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from storage_delta.format.settings import Loader, setting

__all__ = ["JOBS_LOADER", "SPARK_LOADER", "Intervals", "JobSettings", "SparkSettings"]

CONF = Path(__file__).resolve().parent.parent / "conf"


@dataclass(frozen=True)
class Intervals:
    """Seconds between two runs of each job under ``jetlake jobs schedule``: the ``[every]`` table.
    Its fields are the jobs there are."""

    seal: float = setting(900.0, "seconds between two `seal` runs under `jetlake jobs schedule`")
    retention: float = setting(300.0, "seconds between two `retention` runs under `jetlake jobs schedule`")
    ackfloors: float = setting(60.0, "seconds between two `ackfloors` runs under `jetlake jobs schedule`")
    removals: float = setting(
        600.0,
        "seconds between two `removals` runs under `jetlake jobs schedule` "
        "(each folds the removal log, one small file per 5 s of a gateway's removals, into one)",
    )


@dataclass(frozen=True)
class JobSettings:
    """What the maintenance jobs work on and how long they keep what they remove."""

    data_root: str = setting("./data", "where the Delta tables live: the gateway's `data_root`")
    vacuum_margin_hours: int = setting(
        24,
        "hours removed files stay on disk before vacuum deletes them, so that a reader that planned "
        "on an older table version (a long Spark query, a consumer's cold read) still finds them",
    )
    seal_min_files: int = setting(2, "a full block is sealed once it holds at least this many files")
    every: Intervals = field(default_factory=Intervals)


@dataclass(frozen=True)
class SparkSettings:
    """How jetlake's SparkSessions start. Arguments given to ``build_spark_session`` win over it."""

    master: str = setting(
        "local[*]", "Spark master URL (`local[*]`, `spark://host:7077`); under spark-submit, its own"
    )
    conf: dict[str, str] = setting(
        {
            # Small local jobs: Spark's 200 shuffle partitions would be 200 near-empty tasks.
            "spark.sql.shuffle.partitions": "4",
            # JetStream times are UTC; rendering them in the machine's zone only confuses.
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            # A streaming query's offset and commit logs written with a rename through Hadoop's
            # FileSystem, not its FileContext: 10-20 ms a file instead of 40-60, twice per micro-batch
            # (bench/freshness.py). Neither syncs; both rename a finished file into place.
            "spark.sql.streaming.checkpointFileManagerClass": "org.apache.spark.sql.execution.streaming."
            "checkpointing.FileSystemBasedCheckpointFileManager",
            # Spark's local files (those logs above all) without Hadoop's .crc beside each: one file
            # and one rename a log entry instead of two of each, 5-9 ms instead of 9-16.5 at p50.
            # jetlake's tables go through delta-rs, not Hadoop.
            "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
        },
        "Spark properties every session gets; entries from the variable and flags are added to "
        "(or replace) the file's",
    )


JOBS_LOADER = Loader(JobSettings, CONF / "jobs.toml", "JETLAKE_JOBS_")
# Sessions are built outside any command line too (notebooks, tests), so the file is named by the
# variable JETLAKE_SPARK_CONF_FILE only; ``--conf-file`` on ``jetlake jobs`` is conf/jobs.toml's.
SPARK_LOADER = Loader(SparkSettings, CONF / "spark.toml", "JETLAKE_SPARK_", file_flag=None)
