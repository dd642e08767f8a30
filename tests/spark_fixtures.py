"""Spark fixtures, imported by the test modules (and later by conftest) rather than defined there,
so the tests that need no JVM never pay for one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from spark_jobs.session import build_spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local session for the whole run: starting a JVM costs seconds. Two cores, so a read
    of several blocks really runs tasks side by side."""
    session = build_spark_session(master="local[2]", app_name="jetlake-tests", quiet=True)
    yield session
    session.stop()
