"""The resource rule of the quality gate holds: a leaked file, socket or event loop fails a test, in
the tests' own process (pyproject.toml's ``filterwarnings``) and in the gateway's (the harness reads
its log when it stops it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT, Jetlake


@pytest.mark.parametrize(
    ("body", "status"),
    [
        # a file left to the garbage collector: its ResourceWarning is an error
        ("open(__file__)", 1),
        # the same file closed: passes (so the failure above is the leak's)
        ("with open(__file__):\n        pass", 0),
    ],
)
def test_a_leak_fails_the_test_that_leaked(tmp_path: Path, body: str, status: int) -> None:
    test = tmp_path / "test_leak.py"
    test.write_text(f"def test_leak() -> None:\n    {body}\n")
    config = ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), "-p", "no:cacheprovider"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *config, "-q", str(test)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert ("ResourceWarning" in proc.stdout) == bool(status), proc.stdout


def test_a_gateway_that_leaked_fails_its_stop(tmp_path: Path) -> None:
    lake = Jetlake(tmp_path)  # never started: stopping it only reads the log
    (tmp_path / "gateway.log").write_text(
        "jetlake serving domain 'jetlake', data in ./data\n"
        "/x/gateway/wire/leaf.py:1: ResourceWarning: unclosed <socket.socket fd=7>\n"
    )
    with pytest.raises(AssertionError, match="the gateway leaked resources"):
        lake.stop()


def test_a_gateway_that_leaked_nothing_stops_quietly(tmp_path: Path) -> None:
    lake = Jetlake(tmp_path)
    (tmp_path / "gateway.log").write_text("jetlake serving domain 'jetlake', data in ./data\n")
    lake.stop()
