"""A wall clock stepping back under a running gateway (#16, item 4): a real ``jetlake serve`` whose
clock libfaketime moves (``LD_PRELOAD``, the offset read from ``FAKETIME_TIMESTAMP_FILE`` at every
call, so the test steps it while the process runs; the monotonic clock is left alone, as an NTP
step leaves it).

Not differential: the real nats-server is a Go binary (its clock calls never reach the C library
libfaketime replaces), so this compares jetlake with the stated expectation, not with the server.
The engine's own rule is tested without a process in
``tests/test_streams_state.py::test_a_wall_clock_stepping_back_reorders_nothing``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import libfaketime
import nats
import numpy as np
from nats.js.api import PubAck

from tests.differential import api
from tests.harness import Jetlake, duckdb_connection
from tests.monitor_fixtures import get_json

STREAM = "CLOCK"
#: MaxAge and the duplicate window (seconds): short, so the test can wait past them.
AGE_S = 4
HOUR_NS = 3600 * 10**9


def _ns(rfc3339: str) -> int:
    return int(np.datetime64(rfc3339.rstrip("Z"), "ns").astype(np.int64))


def _gateway_now_ns(gw: Jetlake) -> int:
    """The gateway process's wall clock, as its ``/jsz`` says (``now``)."""
    return _ns(get_json(f"http://127.0.0.1:{gw.monitor_port}/jsz", None)["now"])


async def _publish(js: nats.js.JetStreamContext, data: bytes, msg_id: str) -> PubAck:
    return await js.publish("clock.x", data, headers={"Nats-Msg-Id": msg_id})


async def _before(url: str) -> PubAck:
    async with await nats.connect(url) as nc:
        config = {"name": STREAM, "subjects": ["clock.>"], "max_age": AGE_S * 10**9}
        created = await api(nc, f"STREAM.CREATE.{STREAM}", {**config, "duplicate_window": AGE_S * 10**9})
        assert "error" not in created, created
        return await _publish(nc.jetstream(), b"1", "a")


async def _after(url: str) -> tuple[list[PubAck], list[int], dict[str, Any]]:
    """Publishes once the clock stepped back (a new message, two duplicates); the stored times of
    both messages; the stream's state once MaxAge has passed in real time."""
    async with await nats.connect(url) as nc:
        js = nc.jetstream()
        acks = [
            await _publish(js, b"2", "b"),
            await _publish(js, b"2 again", "b"),  # inside the window on either clock
            await _publish(js, b"1 again", "a"),  # published an hour "later" than it was
        ]
        gets = [await api(nc, f"STREAM.MSG.GET.{STREAM}", {"seq": seq}) for seq in (1, 2)]
        await asyncio.sleep(AGE_S + 1)  # past MaxAge in real time, not on the stream's clock
        info = await api(nc, f"STREAM.INFO.{STREAM}")
        return acks, [_ns(g["message"]["time"]) for g in gets], info["state"]


def test_a_wall_clock_stepping_back_an_hour_reorders_nothing_expires_nothing_early(tmp_path: Path) -> None:
    """Publish, step the gateway's clock back an hour, publish again: the stored times stay
    increasing (read through the API and from the Delta table by DuckDB), a duplicate inside the
    window is still refused, and MaxAge removes nothing when its age has passed in real time but
    not on the stream's clock."""
    offset = tmp_path / "faketime"
    offset.write_text("+0\n")
    _, preload = libfaketime.get_reload_information()
    gw = Jetlake(tmp_path)
    gw.start_server()
    try:
        gw.start_gateway({**preload, "FAKETIME_TIMESTAMP_FILE": str(offset)})
        before = asyncio.run(_before(gw.url))
        assert abs(_gateway_now_ns(gw) - time.time_ns()) < 60 * 10**9
        offset.write_text("-1h\n")  # the clock steps back an hour
        assert abs(_gateway_now_ns(gw) - (time.time_ns() - HOUR_NS)) < 60 * 10**9
        acks, (first, second), state = asyncio.run(_after(gw.url))
        assert before.seq == 1
        assert [(a.seq, bool(a.duplicate)) for a in acks] == [(2, False), (2, True), (1, True)]
        assert second > first
        assert (state["messages"], state["first_seq"], state["last_seq"]) == (2, 1, 2)
        assert _ns(state["first_ts"]) == first
        assert _ns(state["last_ts"]) == second
        rows = (
            duckdb_connection()
            .execute(
                "SELECT seq, ts FROM delta_scan(?) WHERE stream = ? ORDER BY seq",
                [str(gw.data_root / "messages"), STREAM],
            )
            .fetchall()
        )
        assert [seq for seq, _ in rows] == [1, 2]
        assert [ts for _, ts in rows] == [first, second]
    finally:
        gw.stop()
