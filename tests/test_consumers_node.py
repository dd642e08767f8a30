"""nats.js (v3, via Node) consumer paths against the real JetStream and jetlake: next(),
consume(), fetch() with a nak and its redelivery, and the ordered consumer. The driver is
tests/node/consumers.mjs; both servers' reports must be equal."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.test_node_client import NODE_DIR, _ensure_node_modules

pytestmark = pytest.mark.node

DRIVER = NODE_DIR / "consumers.mjs"


def run_driver(url: str, stream: str) -> dict[str, Any]:
    _ensure_node_modules()
    res = subprocess.run(
        ["node", str(DRIVER), url, stream],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    report = json.loads(lines[-1]) if lines else None
    if res.returncode != 0 or report is None or "error" in report:
        raise AssertionError(f"consumers.mjs failed against {url}\n{res.stdout}\n{res.stderr}")
    return dict(report)


def test_nats_js_consumer_paths(targets: dict[str, str], unique: str) -> None:
    """next, consume, fetch (nak + redelivery) and ordered consume see the same messages, counts
    and consumer numbers on both servers."""
    reports = {name: run_driver(url, unique) for name, url in targets.items()}
    assert reports["jetlake"] == reports["jetstream"]
    out = reports["jetstream"]
    assert out["next_empty"] is True
    assert len(out["consume"]) == 20
    # the nak'd message came back first in the next batch, ahead of new messages
    assert [(m[2], m[3]) for m in out["fetch"][3:6]] == [(7, 1), (1, 2), (9, 1)]
    assert [m[2] for m in out["ordered"]] == list(range(2, 21, 2))
