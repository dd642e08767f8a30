"""A standalone Spark cluster from the pyspark wheel (a master and one-core workers started with
``spark-class``), as an operator runs one: for the cluster test and the compaction benchmark."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyspark

from tests.harness import free_port, spawn, stop, wait_port

SPARK_HOME = Path(pyspark.__file__).parent


def _spark_class(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1"}
    return spawn([str(SPARK_HOME / "bin" / "spark-class"), *args], log, env=env)


@contextmanager
def standalone_cluster(workdir: Path, workers: int) -> Iterator[tuple[str, list[Path]]]:
    """A master and ``workers`` one-core workers; yields the master URL and the workers' work dirs.
    Workers register with the master a little after they start: a job submitted at once may wait
    for them, never fail."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    master = _spark_class(
        [
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())),
        ],
        workdir / "master.log",
    )
    url = f"spark://127.0.0.1:{port}"
    procs = [master]
    work_dirs = []
    try:
        wait_port(port, master, timeout=120)
        for i in range(workers):
            work = workdir / f"worker{i}"
            work.mkdir()
            work_dirs.append(work)
            args = ["--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--work-dir", str(work)]
            procs.append(
                _spark_class(
                    ["org.apache.spark.deploy.worker.Worker", url, *args, "--webui-port", str(free_port())],
                    workdir / f"worker{i}.log",
                )
            )
        yield url, work_dirs
    finally:
        for p in reversed(procs):
            stop(p)
