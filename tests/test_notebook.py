"""``notebooks/consumer_ack_floors.ipynb`` runs top to bottom (nbclient) on a store this test fills
through a live gateway, and what its tables and figures show equals the live API's consumer info."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import nats
import nbformat
import pytest
from nbclient import NotebookClient

from tests.harness import ROOT
from tests.monitor_fixtures import MonitoredJetlake, ack_floor_scenario, api

NOTEBOOK = ROOT / "notebooks" / "consumer_ack_floors.ipynb"
STREAM = "ORDERS"


async def produce(url: str) -> dict[str, Any]:
    """The ack-floor scenario, then more messages and acks later on (so the floors have a history);
    returns the API's stream and consumer info afterwards."""
    nc = await nats.connect(url)
    try:
        await ack_floor_scenario(nc, STREAM)
        js = nc.jetstream()
        for i in range(5):
            await js.publish(f"{STREAM.lower()}.a", f"later {i}".encode())
        fast = await js.pull_subscribe(f"{STREAM.lower()}.>", durable="fast", stream=STREAM)
        for msg in await fast.fetch(3, timeout=5):
            await msg.ack_sync()
        info = await api(nc, f"STREAM.INFO.{STREAM}")
        consumers = {c: await api(nc, f"CONSUMER.INFO.{STREAM}.{c}") for c in ("fast", "slow")}
    finally:
        await nc.close()
    return {"stream": info, "consumers": consumers}


async def run_notebook(store: Path, monkeypatch: pytest.MonkeyPatch) -> nbformat.NotebookNode:
    monkeypatch.setenv("JETLAKE_ROOT", str(store))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    )
    await client.async_execute()
    return nb


def tagged_output(nb: nbformat.NotebookNode, tag: str) -> str:
    (cell,) = [c for c in nb.cells if tag in c.get("metadata", {}).get("tags", [])]
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


@pytest.mark.slow
async def test_notebook_shows_the_api_numbers(
    monitored: MonitoredJetlake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = await produce(monitored.url)
    await asyncio.sleep(0.5)  # deliveries and NAKs reach the ack log within ack_flush_interval_ms
    nb = await run_notebook(monitored.data_root, monkeypatch)

    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == []
    images = [
        o["data"]["image/png"]
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if "image/png" in o.get("data", {})
    ]
    assert len(images) == 2  # ack floors over time, pending per consumer
    for i, png in enumerate(images):
        (tmp_path / f"figure{i}.png").write_bytes(base64.b64decode(png))

    summary = json.loads(tagged_output(nb, "summary"))
    last_seq = live["stream"]["state"]["last_seq"]
    assert summary["streams"][STREAM]["last_seq"] == last_seq
    shown = {c["consumer"]: c for c in summary["consumers"] if c["stream"] == STREAM}
    assert sorted(shown) == ["fast", "slow"]
    for name, info in live["consumers"].items():
        floor = info["ack_floor"]["stream_seq"]
        expected = {
            "delivered_seq": info["delivered"]["stream_seq"],
            "ack_floor": floor,
            "ack_pending": info["num_ack_pending"],
            "redelivered": info["num_redelivered"],
            "unprocessed": info["num_pending"],
            "last_seq": last_seq,
            "lag": last_seq - floor,
            # read back from the figures
            "plotted_floor": floor,
            "bar_ack_pending": info["num_ack_pending"],
            "bar_unprocessed": info["num_pending"],
        }
        assert {k: shown[name][k] for k in expected} == expected, name
    # the scenario's numbers, so the comparison above is not between two zeros
    assert (shown["fast"]["ack_floor"], shown["fast"]["delivered_seq"]) == (4, 9)  # 5 and 6 unacked
    assert shown["slow"]["redelivered"] == 1
    assert shown["slow"]["lag"] == 15
