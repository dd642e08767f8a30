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

from storage_delta.commit.store import StoreRoot
from storage_delta.tables.removals import load_stream_states
from tests.harness import ROOT
from tests.monitor_fixtures import MonitoredJetlake, ack_floor_scenario, api

NOTEBOOK = ROOT / "notebooks" / "consumer_ack_floors.ipynb"
STREAM = "ORDERS"
LIMITED = "LIMITED"  # max_msgs 3: its first three messages leave the stream's view


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
        await js.add_stream(name=LIMITED, subjects=["limited.>"], max_msgs=3)
        for i in range(6):
            await js.publish(f"limited.{i % 2}", b"x")
        one = await js.pull_subscribe("limited.>", durable="one", stream=LIMITED)
        (first,) = await one.fetch(1, timeout=5)
        await first.ack_sync()
        streams = {s: await api(nc, f"STREAM.INFO.{s}") for s in (STREAM, LIMITED)}
        consumers = {
            (s, c): await api(nc, f"CONSUMER.INFO.{s}.{c}")
            for s, c in ((STREAM, "fast"), (STREAM, "slow"), (LIMITED, "one"))
        }
    finally:
        await nc.close()
    return {"streams": streams, "consumers": consumers}


async def removals_durable(store: Path, stream: str, within_s: float = 20.0) -> None:
    """Limit removals reach the removals table within a few seconds (gateway/removals.py); the
    notebook reads the tables, so it waits for them."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        states = await asyncio.to_thread(load_stream_states, StoreRoot(str(store)))
        if stream in states and states[stream].removed:
            return
        assert loop.time() < deadline, f"no removal of {stream} recorded within {within_s}s"
        await asyncio.sleep(0.5)


async def run_notebook(store: Path, monkeypatch: pytest.MonkeyPatch) -> nbformat.NotebookNode:
    monkeypatch.setenv("JETLAKE_DATA_ROOT", str(store))
    nb: nbformat.NotebookNode = nbformat.read(NOTEBOOK, as_version=4)
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
    await removals_durable(monitored.data_root, LIMITED)
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
    for name, info in live["streams"].items():
        st = info["state"]
        assert summary["streams"][name] == {k: st[k] for k in ("messages", "first_seq", "last_seq")}, name
    shown = {(c["stream"], c["consumer"]): c for c in summary["consumers"]}
    assert sorted(shown) == sorted(live["consumers"])
    for (stream, name), info in live["consumers"].items():
        last_seq = live["streams"][stream]["state"]["last_seq"]
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
        assert {k: shown[(stream, name)][k] for k in expected} == expected, name
    # the scenario's numbers, so the comparison above is not between two zeros
    fast, slow, one = shown[(STREAM, "fast")], shown[(STREAM, "slow")], shown[(LIMITED, "one")]
    assert (fast["ack_floor"], fast["delivered_seq"]) == (4, 9)  # 5 and 6 unacked
    assert (slow["redelivered"], slow["lag"]) == (1, 15)
    assert (one["ack_floor"], one["unprocessed"], one["lag"]) == (4, 2, 2)  # 1-3 removed by max_msgs
    assert summary["streams"][LIMITED] == {"messages": 3, "first_seq": 4, "last_seq": 6}
