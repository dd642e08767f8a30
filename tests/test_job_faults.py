"""#9, job faults: ``kill -9`` of a ``jetlake jobs run`` process mid-way through retention and
sealing, on a real store beside a live gateway that keeps taking publishes and acks; then the same
jobs again. After the kill and after the second run the tables are consistent: DuckDB's delta
extension reads exactly the messages the gateway serves, no sequence is stored twice, every
PubAck'd message and every synchronously acked ack is there, and every file the table references
exists. The second run finishes the work: nothing removed is left in storage and the full blocks
are sealed."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import random
import signal
import sys
import time
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import MessageTable, StoredMessage
from storage_delta.format import schema as sch
from storage_delta.maintenance.files import live_files
from storage_delta.tables.removals import load_stream_states
from tests.harness import ROOT, Jetlake, duckdb_connection
from tests.jsapi import api, stream

STREAM = "JOBFAULT"
STORED = 230_000  # blocks 0 and 1 full, block 2 the tail
COMMIT_ROWS = 10_000  # ten files per full block, as a gateway's group commits leave them
PURGE_BELOW = 60_000  # block 0: five files go by metadata, one is rewritten, four stay
DELETED = list(range(120_001, 140_000, 400))  # block 1: two of its ten files are rewritten


def prefill(root: StoreRoot, ts0: int) -> None:
    """What a gateway would have stored, written straight into the table (the gateway is down)."""
    table = MessageTable(root)
    try:
        version = table.last_txn_version()
        for start in range(1, STORED + 1, COMMIT_ROWS):
            version += 1
            batch = [
                StoredMessage(STREAM, sch.DEFAULT_BLOCK_SIZE, s, ts0 + s, "jobfault.old", None, b"m-%d" % s)
                for s in range(start, min(start + COMMIT_ROWS, STORED + 1))
            ]
            table.commit(batch, version)
    finally:
        table.close()


class Load:
    """A publisher and a consumer that acknowledges what it gets (each batch's last ack synchronously)."""

    def __init__(self, nc: Client) -> None:
        self.js = nc.jetstream()
        self.acked: dict[int, bytes] = {}  # PubAck'd: sequence -> payload
        self.synced = 0  # the highest sequence whose ack_sync was answered
        self.errors: list[str] = []
        self.stop = asyncio.Event()

    async def publish(self) -> None:
        i = 0
        while not self.stop.is_set():
            payload = b"live-%d" % i
            try:
                ack = await self.js.publish("jobfault.live", payload, timeout=5)
                self.acked[ack.seq] = payload
            except Exception as exc:  # a refused publish is a finding, not a crash of the load
                self.errors.append(f"publish: {exc!r}")
            i += 1
            await asyncio.sleep(0.2)

    async def consume(self) -> None:
        sub = await self.js.pull_subscribe("jobfault.>", durable="C", stream=STREAM)
        while not self.stop.is_set():
            try:
                msgs = await sub.fetch(200, timeout=1)
            # nats-py raises asyncio's TimeoutError, not its own, when the time ran out between its
            # no-wait pull and the waiting one (the built-in TimeoutError is both)
            except TimeoutError:
                continue
            for m in msgs[:-1]:
                await m.ack()
            await msgs[-1].ack_sync(timeout=5)
            self.synced = msgs[-1].metadata.sequence.stream


def visible_in_duckdb(root: StoreRoot, created: int) -> tuple[set[int], int, int]:
    """The logical stream as an independent Delta reader computes it (docs/storage.md): the live
    incarnation's rows minus the removed ranges; also how many rows are stored and how many distinct
    sequences they hold (equal when nothing is stored twice)."""
    con = duckdb_connection()
    seqs = [
        r[0]
        for r in con.execute(
            "SELECT seq FROM delta_scan(?) WHERE stream = ? AND ts >= ?",
            [root.table_uri(sch.MESSAGES), STREAM, created],
        ).fetchall()
    ]
    ranges = con.execute(
        'SELECT "first", "last" FROM delta_scan(?) WHERE stream = ? AND created = ?',
        [root.table_uri(sch.REMOVALS), STREAM, created],
    ).fetchall()
    removed = {s for a, b in ranges for s in range(a, b + 1)}
    return set(seqs) - removed, len(seqs), len(set(seqs))


async def check_consistent(nc: Client, root: StoreRoot, created: int, load: Load) -> None:
    """Everything the module docstring promises, at this moment."""
    for f in live_files(root, STREAM):
        assert (Path(root.uri) / sch.MESSAGES / f.path).is_file(), f"{f.path} is referenced but missing"
    acked = dict(load.acked)  # what was acknowledged before the gateway's answer below
    info = await api(nc, f"STREAM.INFO.{STREAM}", {"deleted_details": True})
    state = info["state"]
    served = set(range(state["first_seq"], state["last_seq"] + 1)) - set(state.get("deleted") or [])
    visible, rows, distinct = visible_in_duckdb(root, created)
    assert rows == distinct, "a sequence is stored twice"
    # The gateway may have committed publishes after its answer: DuckDB may see more, never less.
    assert served <= visible
    assert {s for s in visible if s <= state["last_seq"]} == served
    assert set(acked) <= visible
    con = duckdb_connection()
    sample = sorted(random.Random(7).sample(sorted(served), 40)) + sorted(acked)[-20:]
    stored = dict(
        con.execute(
            "SELECT seq, data FROM delta_scan(?) WHERE stream = ? AND ts >= ? AND list_contains(?, seq)",
            [root.table_uri(sch.MESSAGES), STREAM, created, sample],
        ).fetchall()
    )
    for seq in sample:
        got = await api(nc, f"STREAM.MSG.GET.{STREAM}", {"seq": seq})
        assert got["message"]["seq"] == seq
        assert base64.b64decode(got["message"]["data"]) == stored[seq]
    for seq, payload in acked.items():
        if seq in sample:
            assert stored[seq] == payload


async def read_lines(proc: asyncio.subprocess.Process, lines: list[str]) -> None:
    assert proc.stderr is not None
    async for line in proc.stderr:
        lines.append(line.decode(errors="replace"))
        sys.stdout.write(f"[job {proc.pid}] {lines[-1]}")


def jobs_command(root: StoreRoot) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gateway",
        "jobs",
        "run",
        "retention",
        "seal",
        "removals",
        "--data-root",
        root.uri,
        "--master",
        "local[2]",
    ]


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(600)
async def test_a_job_killed_mid_way_leaves_consistent_tables_and_the_next_run_finishes(
    own_jetlake: Jetlake,
) -> None:
    gw = own_jetlake
    root = StoreRoot(str(gw.data_root))
    job: asyncio.subprocess.Process | None = None
    nc = await nats.connect(gw.url)
    try:
        assert "error" not in await stream(nc, STREAM)
        await nc.close()
        gw.stop_gateway()
        created_ns = load_stream_states(root)[STREAM].created
        prefill(root, time.time_ns())
        gw.start_gateway(wait=False)
        await gw._wait_ready()
        nc = await nats.connect(gw.url)
        await api(nc, f"STREAM.PURGE.{STREAM}", {"seq": PURGE_BELOW})
        for seq in DELETED:
            assert (await api(nc, f"STREAM.MSG.DELETE.{STREAM}", {"seq": seq}))["success"]

        load = Load(nc)
        tasks = [asyncio.create_task(load.publish()), asyncio.create_task(load.consume())]
        job = await asyncio.create_subprocess_exec(
            *jobs_command(root), cwd=ROOT, stderr=asyncio.subprocess.PIPE, start_new_session=True
        )
        lines: list[str] = []
        drain = asyncio.create_task(read_lines(job, lines))
        deadline = time.monotonic() + 240
        while not any("rewriting" in line for line in lines):
            assert job.returncode is None, "".join(lines)[-3000:]
            assert time.monotonic() < deadline, "the job never started rewriting"
            await asyncio.sleep(0.05)
        await asyncio.sleep(random.uniform(0, 2.0))
        job.send_signal(signal.SIGKILL)
        assert await job.wait() == -signal.SIGKILL
        await drain
        reached = [p for p in ("retention: done", "seal: done", "removals: done") if p in "".join(lines)]
        print(f"job killed after: {reached or 'retention started rewriting'}")

        await check_consistent(nc, root, created_ns, load)

        rerun = await asyncio.create_subprocess_exec(
            *jobs_command(root), cwd=ROOT, stderr=asyncio.subprocess.PIPE, start_new_session=True
        )
        rerun_lines: list[str] = []
        await asyncio.wait_for(read_lines(rerun, rerun_lines), 400)
        err = "".join(rerun_lines)
        assert await rerun.wait() == 0, err[-3000:]
        for line in ("retention: done", "seal: done", "removals: done"):
            assert line in err
        load.stop.set()
        await asyncio.gather(*tasks)
        assert load.errors == []
        assert len(load.acked) > 10

        await check_consistent(nc, root, created_ns, load)
        # The second run finished the work: nothing removed is stored any more, full blocks are sealed.
        visible, rows, _ = visible_in_duckdb(root, created_ns)
        assert rows == len(visible)
        assert sorted(f.block for f in live_files(root, STREAM) if f.block < 2) == [0, 1]
        # Every synchronously acked ack held: the consumer's floor is at or past it.
        info = await api(nc, f"CONSUMER.INFO.{STREAM}.C")
        assert load.synced > PURGE_BELOW
        assert info["ack_floor"]["stream_seq"] >= load.synced
    finally:
        if job is not None:
            # the killed driver's JVM and Python workers are in its session; none may outlive the test
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)
        await nc.close()
