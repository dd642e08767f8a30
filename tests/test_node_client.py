"""nats.js (v3, via Node) thin slice: publish, durable pull consumer, fetch + ack.

The driver lives in tests/node/thin_slice.mjs; ``run_thin_slice`` runs it against any
NATS URL and returns its JSON report, so the same checks can be pointed at another server.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.node

NODE_DIR = Path(__file__).resolve().parent / "node"
THIN_SLICE = NODE_DIR / "thin_slice.mjs"
SCRIPT_TIMEOUT_S = 90  # the script has its own 60 s deadline


def _ensure_node_modules() -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise RuntimeError("node and npm are needed for the nats.js tests: install Node.js 20")
    if (NODE_DIR / "node_modules").is_dir():
        return
    res = subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund"],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if res.returncode != 0:
        raise RuntimeError(f"npm ci failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")


def run_thin_slice(url: str, stream: str, prefix: str, count: int) -> dict[str, Any]:
    """Run tests/node/thin_slice.mjs against ``url`` and return its JSON report.

    Raises AssertionError with the script's output if it fails or reports an error.
    """
    _ensure_node_modules()
    res = subprocess.run(
        ["node", str(THIN_SLICE), url, stream, prefix, str(count)],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        check=False,
    )
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    report: dict[str, Any] | None = None
    if lines:
        try:
            report = json.loads(lines[-1])
        except json.JSONDecodeError:
            report = None
    if res.returncode != 0 or report is None or "error" in report:
        raise AssertionError(
            f"thin_slice.mjs failed (exit {res.returncode}) against {url}\n"
            f"stdout:\n{res.stdout}\nstderr:\n{res.stderr}"
        )
    return report


def check_thin_slice_report(report: dict[str, Any], stream: str, prefix: str, count: int) -> None:
    pubacks = report["pubacks"]
    assert len(pubacks) == count
    assert [pa["seq"] for pa in pubacks] == list(range(1, count + 1))
    assert all(pa["stream"] == stream for pa in pubacks)
    assert not any(pa["duplicate"] for pa in pubacks)

    received = sorted(report["received"], key=lambda r: r["seq"])
    assert len(received) == count
    for i, msg in enumerate(received):
        assert msg["seq"] == i + 1
        # delivered under its stored subject, not the pull request's _INBOX
        assert msg["subject"] == f"{prefix}.{i % 3}", msg
        assert not msg["subject"].startswith("_INBOX"), msg
        assert msg["data"] == f"msg-{i}"
        assert msg["x_idx"] == str(i)
        assert msg["delivery_count"] == 1
        assert msg["redelivered"] is False
        assert msg["info_stream"] == stream
        assert msg["info_consumer"] == "njs"
        assert msg["reply_prefix"] == f"$JS.ACK.{stream}.njs"

    state = report["stream_state"]
    assert state["messages"] == count
    assert state["first_seq"] == 1
    assert state["last_seq"] == count
    assert state["consumer_count"] == 1

    consumer = report["consumer"]
    assert consumer["num_ack_pending"] == 0
    assert consumer["num_pending"] == 0
    assert consumer["ack_floor"]["stream_seq"] == count
    assert consumer["delivered"]["stream_seq"] == count


@pytest.mark.node
def test_thin_slice_with_nats_js(targets: dict[str, str]) -> None:
    """nats.js (jetstreamManager, js.publish, consumer.fetch, m.ack) against both servers: each
    message arrives under its stored subject, and the reports agree."""
    stream, prefix, count = "NJS_THIN", "njs.thin", 1000
    reports = {}
    for name, url in targets.items():
        report = run_thin_slice(url, stream, prefix, count)
        check_thin_slice_report(report, stream, prefix, count)
        # fetch diagnostics and ack polling depend on timing, not on behaviour
        reports[name] = {k: v for k, v in report.items() if k not in ("fetches",)}
        reports[name]["consumer"].pop("ack_polls", None)
    assert reports["jetlake"] == reports["jetstream"]
