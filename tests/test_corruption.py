"""Damaged files (#16): a flipped bit or a cut tail in a data file, a Delta log entry, a checkpoint or
an index snapshot is detected, reported and never served; ``jetlake repair`` drops what is lost.

One store is built once (stream ``BAD``: 120 messages, one commit each, so ``messages`` has a
checkpoint at version 100 and a file per message; stream ``GOOD``: 10 messages; a clean stop, so both
have an index snapshot). Each case damages a copy of it, starts the real gateway on it and checks
``/healthz``, stream info, direct reads and a consumer; then runs ``jetlake repair`` (dry run, then
``--apply``) as a process, reads the tables with DuckDB and starts the gateway again.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import pytest

from storage_delta.commit.store import StoreRoot
from storage_delta.read.reader import MessageReader
from tests.harness import ROOT, Jetlake, duckdb_connection
from tests.monitor_fixtures import http_get
from tests.test_consumer_restart import api

BAD, GOOD = "BAD", "GOOD"
BAD_MSGS, GOOD_MSGS = 120, 10


def flip(path: Path, at: float) -> None:
    """Flip the lowest bit of the byte at fraction ``at`` of the file."""
    body = bytearray(path.read_bytes())
    body[int(len(body) * at)] ^= 1
    path.write_bytes(bytes(body))


def cut(path: Path) -> None:
    """Cut the file's tail: its last third."""
    body = path.read_bytes()
    path.write_bytes(body[: len(body) * 2 // 3])


async def _fill(url: str) -> None:
    async with await nats.connect(url) as nc:
        js = nc.jetstream()
        await api(nc, f"STREAM.CREATE.{BAD}", {"name": BAD, "subjects": ["bad.>"]})
        await api(nc, f"STREAM.CREATE.{GOOD}", {"name": GOOD, "subjects": ["good.>"]})
        for i in range(1, BAD_MSGS + 1):
            await js.publish("bad.x", f"bad-{i}".encode())
        for i in range(1, GOOD_MSGS + 1):
            await js.publish("good.x", f"good-{i}".encode())


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store every case damages a copy of."""
    gw = Jetlake(tmp_path_factory.mktemp("corruption-base"))
    gw.start()
    try:
        asyncio.run(_fill(gw.url))
        assert gw.stop_gateway() == 0
    finally:
        gw.stop()
    assert (gw.data_root / "messages" / "_delta_log" / f"{100:020d}.checkpoint.parquet").exists()
    assert (gw.data_root / "_jetlake_index" / f"{BAD}.parquet").exists()
    return gw.data_root


def repair(data_root: Path, *flags: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "repair", "--data-root", str(data_root), *flags],
        capture_output=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    return proc.returncode, proc.stdout.decode() + proc.stderr.decode()


def healthz(gw: Jetlake) -> tuple[int, dict[str, Any]]:
    status, body = http_get(f"http://127.0.0.1:{gw.monitor_port}/healthz", None)
    answer: dict[str, Any] = json.loads(body)
    return status, answer


async def _observe(url: str, lost: range) -> dict[str, Any]:
    """What clients see: stream infos, direct gets around the lost range, a consumer's deliveries,
    a new publish's sequence."""
    async with await nats.connect(url) as nc:
        bad = await api(nc, f"STREAM.INFO.{BAD}")
        good = await api(nc, f"STREAM.INFO.{GOOD}")
        gets = {}
        for seq in {lost.start - 1, lost.start, lost.stop - 1, lost.stop} - {0, BAD_MSGS + 1}:
            got = await api(nc, f"STREAM.MSG.GET.{BAD}", {"seq": seq})
            gets[seq] = got.get("message", {}).get("data") or got["error"]["err_code"]
        js = nc.jetstream()
        sub = await js.pull_subscribe("bad.>", durable="READER", stream=BAD)
        delivered: list[tuple[int, bytes]] = []
        while len(delivered) < bad["state"]["messages"]:
            for m in await sub.fetch(50, timeout=5):
                delivered.append((m.metadata.sequence.stream, m.data))
                await m.ack()
        published = await js.publish("bad.x", b"after")
        return {
            "bad": bad["state"],
            "good": good["state"],
            "gets": gets,
            "delivered": delivered,
            "next": published.seq,
        }


def _messages_file(data_root: Path, index: int) -> tuple[Path, range]:
    files = MessageReader(StoreRoot(str(data_root))).stream_files(BAD)
    f = files[index]
    return data_root / "messages" / f.path, range(f.min_seq, f.max_seq + 1)


def _check_served(seen: dict[str, Any], lost: range) -> None:
    """The lost sequences are deletes, nothing else changed, nothing is renumbered."""
    alive = [s for s in range(1, BAD_MSGS + 1) if s not in lost]
    assert seen["bad"]["last_seq"] == BAD_MSGS
    assert seen["bad"]["messages"] == len(alive)
    assert seen["bad"]["first_seq"] == alive[0]
    assert seen["good"]["messages"] == GOOD_MSGS
    assert seen["delivered"] == [(s, f"bad-{s}".encode()) for s in alive]
    for seq, got in seen["gets"].items():
        assert got == (10037 if seq in lost else _b64(f"bad-{seq}")), seq
    assert seen["next"] == BAD_MSGS + 1


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _duckdb_seqs(data_root: Path) -> list[int]:
    rows = (
        duckdb_connection()
        .execute(
            "SELECT seq FROM delta_scan(?) WHERE stream = ? ORDER BY seq", [str(data_root / "messages"), BAD]
        )
        .fetchall()
    )
    return [r[0] for r in rows]


Damage = Callable[[Path], None]
DAMAGES: dict[str, Damage] = {"flip": lambda p: flip(p, 0.5), "cut": cut}


@pytest.fixture
def store(base: Path, tmp_path: Path) -> Jetlake:
    gw = Jetlake(tmp_path)
    shutil.copytree(base, gw.data_root)
    return gw


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_data_file_is_reported_never_served_and_repaired(store: Jetlake, damage: str) -> None:
    path, lost = _messages_file(store.data_root, BAD_MSGS // 2)
    DAMAGES[damage](path)
    store.start()
    try:
        status, health = healthz(store)
        assert status == 503
        assert any(path.name in p and f"{lost.start}-{lost.stop - 1}" in p for p in health["problems"])
        _check_served(asyncio.run(_observe(store.url, lost)), lost)
        assert store.stop_gateway() == 0
        assert path.name in (store.workdir / "gateway.log").read_text()

        code, out = repair(store.data_root)
        assert code == 1
        assert f"{path.name}: data file, stream {BAD}, sequences {lost.start}-{lost.stop - 1}" in out
        assert path.exists()  # a dry run changes nothing
        code, out = repair(store.data_root, "--apply")
        assert code == 0, out
        assert repair(store.data_root)[0] == 0
        # DuckDB reads the table again: everything but the lost range (and the publish after it)
        assert _duckdb_seqs(store.data_root) == [s for s in range(1, BAD_MSGS + 2) if s not in lost]

        store.start_gateway()
        assert healthz(store) == (200, {"status": "ok"})
        asyncio.run(_after_repair(store.url, lost))
    finally:
        store.stop()


async def _after_repair(url: str, lost: range) -> None:
    async with await nats.connect(url) as nc:
        state = (await api(nc, f"STREAM.INFO.{BAD}"))["state"]
        assert state["last_seq"] == BAD_MSGS + 1
        assert state["messages"] == BAD_MSGS + 1 - len(lost)
        assert (await nc.jetstream().publish("bad.x", b"again")).seq == BAD_MSGS + 2
