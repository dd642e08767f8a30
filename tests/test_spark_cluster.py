"""The jobs through their command line against a standalone Spark cluster (a master and two
workers started with ``spark-class`` from the pyspark wheel), as an operator runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage_delta.maintenance.files import live_files
from storage_delta.tables.catalog import CatalogTable
from storage_delta.tables.removals import Removal, RemovalLog
from tests.harness import ROOT
from tests.standalone import standalone_cluster
from tests.test_spark_jobs import COUNT, build_store, duckdb_seqs


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, list[Path]]]:
    """A master and two one-core workers; yields the master URL and the workers' work dirs."""
    with standalone_cluster(tmp_path / "cluster", workers=2) as running:
        yield running


def _jobs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "jobs", "run", *args],
        cwd=ROOT,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(900)  # four JVMs start; on a loaded two-core machine that takes minutes
def test_jobs_run_on_a_standalone_cluster(cluster: tuple[str, list[Path]], tmp_path: Path) -> None:
    url, work_dirs = cluster
    store = build_store(tmp_path / "store")
    # Stream A exists and everything below 451 is removed from it; stream B was never created.
    CatalogTable(store).put("stream", "A", "A", {"config": {"name": "A"}, "created": 0})
    RemovalLog(store).append([Removal("A", 0, 1, 450)])
    common = ["--master", url, "--data-root", store.uri, "--vacuum-margin-hours", "0"]
    # Both jobs in one driver: each JVM costs many seconds on a small machine.
    done = _jobs("retention", "seal", *common)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "retention: done" in done.stderr
    assert "seal: done" in done.stderr
    assert duckdb_seqs(store, "A") == list(range(451, COUNT + 1))
    assert duckdb_seqs(store, "B") == []
    blocks = sorted((f.block, f.min_seq, f.max_seq) for f in live_files(store))
    # Full blocks 2-4 sealed into one file each (block 2 starts at the floor); block 5 is the tail.
    assert blocks == [(2, 451, 599), (3, 600, 799), (4, 800, 999), (5, 1000, 1000)]
    # The rewrites ran in executors on the workers, both of them.
    assert all(any(w.glob("app-*/*/stderr")) for w in work_dirs)
