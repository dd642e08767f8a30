"""The one way jetlake code gets a SparkSession, so jobs, notebooks and tests run alike.

Its settings (``SparkSettings``: ``conf/spark.toml``, then ``JETLAKE_SPARK_<KEY>`` variables, then the
flags of ``jetlake jobs``) are loaded when a session is built, never at import, so a test or notebook
can change the file, the environment or the arguments without re-importing; arguments win over them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from spark_jobs.datasource import JetlakeDataSource
from spark_jobs.settings import SPARK_LOADER, SparkSettings

MIN_JAVA = 17

_JAVA_HINT = f"Spark needs Java {MIN_JAVA}+: install it (e.g. apt-get install openjdk-17-jre-headless)"


def build_spark_session(
    master: str | None = None,
    app_name: str = "jetlake",
    conf: Mapping[str, str] | None = None,
    quiet: bool = False,
    settings: SparkSettings | None = None,
) -> SparkSession:
    """A SparkSession with jetlake's settings and the ``jetlake`` data source registered.

    ``settings`` are loaded now when not given; ``master`` and ``conf`` win over them.
    ``quiet`` is for tests: no UI (no port to collide on), no progress bars, only errors logged.
    If a session is already running it is returned, and settings that only apply at JVM start
    (master, UI) keep their old values: that is Spark's ``getOrCreate``.
    """
    check_java()
    loaded = settings or SPARK_LOADER.load()
    properties = {**loaded.conf, **(conf or {})}
    # Executors must run the interpreter (and so the venv) we run in, not whatever "python3" is.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    properties["spark.pyspark.python"] = sys.executable
    # Under spark-submit the master (and the rest) come from its command line, unless given here.
    resolved_master = master or (None if _under_spark_submit() else loaded.master)
    if resolved_master and resolved_master.startswith("local"):
        # A local session has no other node to talk to: binding to loopback avoids Spark guessing an
        # interface (and warning about it) on machines whose hostname resolves oddly.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if quiet:
        properties["spark.ui.enabled"] = "false"
        properties["spark.ui.showConsoleProgress"] = "false"
    builder = SparkSession.builder.appName(app_name)
    if resolved_master:
        builder = builder.master(resolved_master)
    for key, value in properties.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if quiet:
        spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(JetlakeDataSource)
    return spark


def _under_spark_submit() -> bool:
    """spark-submit starts the JVM first and hands Python the gateway port."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def check_java() -> None:
    """Fail with one line that says what to install, instead of PySpark's gateway traceback."""
    home = os.environ.get("JAVA_HOME")
    # Where bin/spark-class looks: $JAVA_HOME first, then PATH.
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        raise RuntimeError(f"java not found. {_JAVA_HINT}")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{java} -version failed ({exc}). {_JAVA_HINT}") from None
    version = java_major_version(out.stderr + out.stdout)
    if version is None or version < MIN_JAVA:
        raise RuntimeError(f"{java} is Java {version or 'of unknown version'}. {_JAVA_HINT}")


def java_major_version(version_output: str) -> int | None:
    """The major version in ``java -version`` output; old releases say ``1.8`` for 8."""
    m = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major
