"""Compaction of the ``removals`` table on a real store written by a real gateway: the many small
files the gateway appends fold into one, ``load_stream_states`` and DuckDB's delta extension read the
same removed ranges before and after, the gateway's own deletes keep landing while compaction runs,
and a restarted gateway rebuilds the same streams from the compacted table."""

from __future__ import annotations

import asyncio
import json

import nats
import pyarrow as pa
import pytest
from nats.aio.client import Client

from storage_delta.commit.store import StoreRoot
from storage_delta.format import schema as sch
from storage_delta.tables.removals import (
    StreamLogicalState,
    compact_removals,
    fold_removals,
    load_stream_states,
    merge_ranges,
)
from tests.harness import Jetlake, duckdb_connection
from tests.jsapi import api, stream

COUNT = 600


def duckdb_removed(root: StoreRoot, states: dict[str, StreamLogicalState]) -> dict[str, set[int]]:
    """Every live stream's removed sequences as DuckDB reads the table (rows of the live incarnation)."""
    out: dict[str, set[int]] = {}
    rows = duckdb_connection().execute(
        'SELECT stream, created, "first", "last" FROM delta_scan(?)', [root.table_uri(sch.REMOVALS)]
    )
    for name, created, first, last in rows.fetchall():
        if name in states and states[name].created == created:
            out.setdefault(name, set()).update(range(first, last + 1))
    return out


def removed_set(state: StreamLogicalState) -> set[int]:
    return {s for a, b in state.removed for s in range(a, b + 1)}


async def _publish(nc: Client, subject: str, count: int) -> None:
    for start in range(0, count, 100):
        await asyncio.gather(
            *[nc.request(subject, b"m%d" % i, timeout=10) for i in range(start, start + 100)]
        )


async def _delete(nc: Client, name: str, seqs: list[int]) -> None:
    for seq in seqs:
        assert (await api(nc, f"STREAM.MSG.DELETE.{name}", {"seq": seq})) == {
            "type": "io.nats.jetstream.api.v1.stream_msg_delete_response",
            "success": True,
        }


async def _deleted_details(nc: Client, name: str) -> tuple[int, set[int]]:
    info = await api(nc, f"STREAM.INFO.{name}", {"deleted_details": True})
    return info["state"]["first_seq"], set(info["state"].get("deleted") or [])


@pytest.mark.slow
async def test_compaction_keeps_the_logical_state_while_the_gateway_deletes(own_jetlake: Jetlake) -> None:
    gateway = own_jetlake

    root = StoreRoot(str(gateway.data_root))
    nc = await nats.connect(gateway.url)
    try:
        # W: a purge below 50 and 120 deletes (each its own commit), a max_msgs limit on L, and
        # an earlier incarnation of D whose rows no reader counts any more.
        await stream(nc, "W")
        await stream(nc, "L", max_msgs=100)
        await stream(nc, "D")
        await _publish(nc, "w.x", COUNT)
        await _publish(nc, "l.x", 300)
        await _publish(nc, "d.x", 100)
        await _delete(nc, "D", [5, 7, 9])
        await api(nc, "STREAM.DELETE.D")
        await stream(nc, "D")
        await _publish(nc, "d.x", 20)
        await _delete(nc, "D", [3])
        await api(nc, "STREAM.PURGE.W", {"seq": 50})
        await _delete(nc, "W", list(range(51, 400, 3)))
        await asyncio.sleep(5.5)  # the limit's removals on L are recorded within 5 s

        before = load_stream_states(root)
        assert before["L"].removed == [(1, 200)]
        assert before["D"].removed == [(3, 3)]
        assert duckdb_removed(root, before) == {
            name: removed_set(s) for name, s in before.items() if s.removed
        }

        # Compaction, three times in a row, while 100 more deletes go to the gateway.
        more = list(range(401, COUNT, 2))
        loop = asyncio.get_running_loop()
        deleting = asyncio.create_task(_delete(nc, "W", more))
        runs = []
        for _ in range(3):
            runs.append(await loop.run_in_executor(None, compact_removals, root))
        await deleting
        assert runs[0].files_before > 100
        assert runs[0].files_after == 1
        assert runs[0].rows_before > runs[0].rows_after

        after = load_stream_states(root)
        expected = merge_ranges([*before["W"].removed, *((s, s) for s in more)])
        assert after["W"].removed == expected
        assert {k: v for k, v in after.items() if k != "W"} == {k: v for k, v in before.items() if k != "W"}
        assert duckdb_removed(root, after) == {name: removed_set(s) for name, s in after.items() if s.removed}
        first, deleted = await _deleted_details(nc, "W")
        assert (first, deleted) == (50, {s for s in removed_set(after["W"]) if s > 50})

        # Once quiet, one file holds one row per merged range of the live incarnations.
        final = compact_removals(root)
        assert final.files_after == 1
        assert final.rows_after == sum(len(s.removed) for s in after.values())
        assert load_stream_states(root) == after
        rows = duckdb_connection().execute(
            "SELECT count(*), count(DISTINCT created) FROM delta_scan(?) WHERE stream = 'D'",
            [root.table_uri(sch.REMOVALS)],
        )
        assert rows.fetchall() == [(1, 1)]  # the earlier D's rows are gone
        info = {
            n: json.dumps((await api(nc, f"STREAM.INFO.{n}", {"deleted_details": True}))["state"])
            for n in "WLD"
        }
    finally:
        await nc.close()

    gateway.stop_gateway()
    gateway.start_gateway(wait=False)
    await gateway._wait_ready()
    nc = await nats.connect(gateway.url)
    try:
        restarted = {
            n: json.dumps((await api(nc, f"STREAM.INFO.{n}", {"deleted_details": True}))["state"])
            for n in "WLD"
        }
    finally:
        await nc.close()
    assert restarted == info


def test_fold_merges_each_live_incarnations_ranges_and_drops_the_rest() -> None:
    rows = [
        ("A", 1, 1, 3, 10),
        ("A", 1, 4, 4, 20),  # adjacent: joins 1-3
        ("A", 1, 8, 9, 30),
        ("A", 1, 2, 2, 5),  # inside 1-3 already
        ("A", 0, 1, 50, 40),  # an earlier incarnation of A
        ("B", 7, 1, 2, 50),  # B is deleted
    ]
    table = pa.table([list(c) for c in zip(*rows, strict=True)], schema=sch.REMOVALS_SCHEMA)
    assert fold_removals(table, {"A": 1, "C": 3}).to_pylist() == [
        {"stream": "A", "created": 1, "first": 1, "last": 4, "ts": 30},
        {"stream": "A", "created": 1, "first": 8, "last": 9, "ts": 30},
    ]
