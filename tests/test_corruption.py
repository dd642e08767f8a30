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
import pyarrow.parquet as pq
import pytest

from storage_delta.commit.store import StoreRoot
from storage_delta.format.integrity import DamagedFile
from storage_delta.maintenance.files import rewrite_files
from storage_delta.read.reader import MessageReader
from tests.differential import api
from tests.harness import ROOT, Jetlake, duckdb_connection
from tests.monitor_fixtures import http_get

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
        sub = await js.pull_subscribe("good.>", durable="KEEP", stream=GOOD)
        for m in await sub.fetch(GOOD_MSGS, timeout=5):
            await m.ack_sync()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store every case damages a copy of: one data file per publish (no compaction merges
    them), so each case finds the file it damages by its place."""
    gw = Jetlake(tmp_path_factory.mktemp("corruption-base"))
    gw.gateway_env = {"JETLAKE_COMPACT_MIN_FILES": "0"}
    gw.start()
    try:
        asyncio.run(_fill(gw.url))
        assert gw.stop_gateway() == 0
    finally:
        gw.stop()
    _checkpoint(gw.data_root)
    assert (gw.data_root / "_jetlake_index" / f"{BAD}.parquet").exists()
    return gw.data_root


def _checkpoint(data_root: Path) -> Path:
    """The ``messages`` table's newest checkpoint, the one readers start from (one is written every
    100 commits; the 130 publishes and the compactions of their files make one or two)."""
    return max((data_root / "messages" / "_delta_log").glob("*.checkpoint.parquet"))


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
        around = {lost.start - 1, lost.start, lost.stop - 1, lost.stop} if lost else {1, BAD_MSGS}
        for seq in around - {0, BAD_MSGS + 1}:
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
    # reported as JetStream reports the records of a corrupt block (a record: 30 + subject + data)
    lost_bytes = sum(30 + len("bad.x") + len(f"bad-{s}") for s in lost)
    assert seen["bad"].get("lost") == ({"msgs": list(lost), "bytes": lost_bytes} if lost else None)


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


@pytest.mark.slow  # three gateway starts and three repair processes: about 15 s
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
        _apply_repair_and_serve(store, lost)
    finally:
        store.stop()


def _apply_repair_and_serve(store: Jetlake, lost: range) -> None:
    """``jetlake repair --apply`` leaves nothing to repair; DuckDB reads the table again (everything
    but the lost range and the publish after it); the gateway starts healthy and serves."""
    code, out = repair(store.data_root, "--apply")
    assert code == 0, out
    assert repair(store.data_root)[0] == 0
    assert _duckdb_seqs(store.data_root) == [s for s in range(1, BAD_MSGS + 2) if s not in lost]
    store.start_gateway()
    assert healthz(store) == (200, {"status": "ok"})
    asyncio.run(_after_repair(store.url, lost))


async def _after_repair(url: str, lost: range) -> None:
    async with await nats.connect(url) as nc:
        state = (await api(nc, f"STREAM.INFO.{BAD}"))["state"]
        assert "lost" not in state  # repaired: the range is an ordinary removal now
        assert state["last_seq"] == BAD_MSGS + 1
        assert state["messages"] == BAD_MSGS + 1 - len(lost)
        assert (await nc.jetstream().publish("bad.x", b"again")).seq == BAD_MSGS + 2


def _entry_of(data_root: Path, file: Path) -> Path:
    """The ``messages`` log entry whose ``add`` names ``file``."""
    log_dir = data_root / "messages" / "_delta_log"
    return next(p for p in sorted(log_dir.glob("*.json")) if file.name.encode() in p.read_bytes())


def flip_in_path(entry: Path, file: Path) -> None:
    """Flip a bit of a hex digit of the file's name in the entry: the entry still parses (only its
    digests can tell), and names a file that does not exist."""
    body = bytearray(entry.read_bytes())
    at = body.index(file.name.encode()) + len("part-") + 3
    body[at] = ord("0") if body[at] != ord("0") else ord("1")
    entry.write_bytes(bytes(body))


@pytest.mark.slow  # as above
def test_a_log_entry_with_a_flipped_bit_is_reported_and_repaired(store: Jetlake) -> None:
    # above the checkpoint: readers replay this entry
    path, lost = _messages_file(store.data_root, BAD_MSGS - 10)
    entry = _entry_of(store.data_root, path)
    assert int(entry.stem) > int(_checkpoint(store.data_root).name[:20])
    flip_in_path(entry, path)
    store.start()
    try:
        status, health = healthz(store)
        assert status == 503
        assert any(f"log entry messages/_delta_log/{entry.name}" in p for p in health["problems"])
        _check_served(asyncio.run(_observe(store.url, lost)), lost)
        assert store.stop_gateway() == 0

        code, out = repair(store.data_root)
        assert code == 1
        assert f"{entry.name}: log entry, version {int(entry.stem)}: an add of stream {BAD}, " in out
        _apply_repair_and_serve(store, lost)
    finally:
        store.stop()


@pytest.mark.slow  # as above
def _add_of(entry_body: bytes) -> dict[str, Any]:
    """The ``add`` action of a one-file entry, without its modification time (a rebuilt line takes
    the file's)."""
    (add,) = (json.loads(line)["add"] for line in entry_body.splitlines() if line.startswith(b'{"add"'))
    return {k: v for k, v in add.items() if k != "modificationTime"}


def test_a_log_entry_with_a_cut_tail_is_rebuilt_from_its_data_file(store: Jetlake) -> None:
    """The cut entry no longer parses, but its ``add`` line's start names a whole file: the gateway
    makes the line again from the file (size, partition, statistics), keeps the original aside and
    serves everything; the entry is whole again for every reader."""
    path, _ = _messages_file(store.data_root, BAD_MSGS - 10)
    entry = _entry_of(store.data_root, path)
    original = entry.read_bytes()
    entry.write_bytes(original[: original.index(path.name.encode()) + len(path.name) + 40])
    store.start()
    try:
        assert healthz(store) == (200, {"status": "ok"})
        log_text = (store.workdir / "gateway.log").read_text()
        assert f"damaged log entry {entry}" in log_text
        # line 4, the add: after the commitInfo and the txns of the commit and of the owner epoch
        assert f"rewrote {entry}: damaged lines [4], of them dropped []" in log_text
        assert (store.data_root / "messages" / "_jetlake_quarantine" / entry.name).read_bytes() == (
            original[: original.index(path.name.encode()) + len(path.name) + 40]
        )
        assert _add_of(entry.read_bytes()) == _add_of(original)
        _check_served(asyncio.run(_observe(store.url, range(0))), range(0))
        assert store.stop_gateway() == 0
        assert repair(store.data_root)[0] == 0
        assert _duckdb_seqs(store.data_root) == list(range(1, BAD_MSGS + 2))
    finally:
        store.stop()


def test_a_log_entry_cut_before_its_file_is_named_stops_the_gateway_until_repaired(store: Jetlake) -> None:
    """Cut where nothing says which file the ``add`` named: the entry no longer parses, so delta-rs
    refuses the table and the gateway says which file and does not start; repair drops the cut
    line (its file's sequences become a gap: they cannot be told from the file, which no line names)."""
    path, lost = _messages_file(store.data_root, BAD_MSGS - 10)
    entry = _entry_of(store.data_root, path)
    body = entry.read_bytes()
    entry.write_bytes(body[: body.index(b'{"add":{"path"') + len(b'{"add":{"pa')])
    store.start_server()
    try:
        with pytest.raises(RuntimeError, match="gateway exited"):
            store.start_gateway()
        assert (
            f"damaged log entry messages/_delta_log/{entry.name}"
            in (store.workdir / "gateway.log").read_text()
        )
        code, out = repair(store.data_root)
        assert code == 1
        assert f"{entry.name}: log entry, version {int(entry.stem)}" in out
        assert "1 damaged line(s) dropped" in out
        assert repair(store.data_root, "--apply")[0] == 0
        assert _duckdb_seqs(store.data_root) == [s for s in range(1, BAD_MSGS + 1) if s not in lost]
        store.start_gateway()
        assert healthz(store) == (200, {"status": "ok"})
        seen = asyncio.run(_observe(store.url, lost))
        assert seen["bad"]["messages"] == BAD_MSGS - len(lost)
        assert seen["bad"]["last_seq"] == BAD_MSGS
        assert seen["next"] == BAD_MSGS + 1
    finally:
        store.stop()


#: A checkpoint also comes out empty after a power cut that caught a Spark job between its checkpoint
#: and the job's sync of it, when a gateway commit's sync of ``_delta_log`` made the name durable.
def empty(path: Path) -> None:
    path.write_bytes(b"")


CHECKPOINT_DAMAGES: dict[str, Damage] = {**DAMAGES, "empty": empty}


@pytest.mark.parametrize("damage", sorted(CHECKPOINT_DAMAGES))
def test_a_damaged_checkpoint_is_set_aside_and_the_log_replayed(store: Jetlake, damage: str) -> None:
    checkpoint = _checkpoint(store.data_root)
    CHECKPOINT_DAMAGES[damage](checkpoint)
    store.start()
    try:
        assert healthz(store) == (200, {"status": "ok"})
        assert f"damaged checkpoint {checkpoint}" in (store.workdir / "gateway.log").read_text()
        assert not checkpoint.exists()
        assert (store.data_root / "messages" / "_jetlake_quarantine" / checkpoint.name).exists()
        _check_served(asyncio.run(_observe(store.url, range(0))), range(0))
        assert store.stop_gateway() == 0
        assert repair(store.data_root) == (0, f"no damaged files under {store.data_root}\n")
        assert _duckdb_seqs(store.data_root) == list(range(1, BAD_MSGS + 2))
    finally:
        store.stop()


def flip_in_seq_page(snapshot: Path) -> None:
    """Flip a bit near the end of the ``seq`` column's data page (a flip elsewhere may hit bytes no
    reader uses, such as the footer's second copy of the metadata, which changes nothing)."""
    column = pq.ParquetFile(snapshot).metadata.row_group(0).column(0)
    body = bytearray(snapshot.read_bytes())
    body[column.data_page_offset + column.total_compressed_size - 2] ^= 1
    snapshot.write_bytes(bytes(body))


@pytest.mark.parametrize("damage", ["flip", "cut"])
def test_a_damaged_index_snapshot_is_ignored(store: Jetlake, damage: str) -> None:
    snapshot = store.data_root / "_jetlake_index" / f"{BAD}.parquet"
    (flip_in_seq_page if damage == "flip" else cut)(snapshot)
    store.start()
    try:
        assert healthz(store) == (200, {"status": "ok"})
        assert f"index snapshot of {BAD}" in (store.workdir / "gateway.log").read_text()
        _check_served(asyncio.run(_observe(store.url, range(0))), range(0))
    finally:
        store.stop()


def test_a_job_refuses_to_rewrite_a_damaged_file(store: Jetlake) -> None:
    """Sealing or retention would give the damaged rows a fresh digest: the rewrite stops instead."""
    path, _ = _messages_file(store.data_root, 3)
    flip(path, 0.5)
    rel = str(path.relative_to(store.data_root / "messages"))
    with pytest.raises(DamagedFile, match=path.name):
        rewrite_files(StoreRoot(str(store.data_root)), BAD, 0, [rel])


@pytest.mark.slow  # two gateway starts and three repair processes
@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_ack_log_file_is_reported_and_repaired(store: Jetlake, damage: str) -> None:
    """The gateway leaves the damaged file out of the ack log (its consumers restart from the
    other rows) and lists it on /healthz; repair drops it; the streams are served throughout."""
    acks = sorted((store.data_root / "acks").glob("*.parquet"))
    DAMAGES[damage](acks[len(acks) // 2])
    store.start()
    try:
        status, health = healthz(store)
        assert status == 503
        assert any(f"damaged data file acks/{acks[len(acks) // 2].name}" in p for p in health["problems"])
        _check_served(asyncio.run(_observe(store.url, range(0))), range(0))
        assert store.stop_gateway() == 0
        code, out = repair(store.data_root)
        assert code == 1
        assert f"acks/{acks[len(acks) // 2].name}: data file" in out
        assert repair(store.data_root, "--apply")[0] == 0
        store.start_gateway()
        assert healthz(store) == (200, {"status": "ok"})
        asyncio.run(_consumer_info(store.url))
    finally:
        store.stop()


async def _consumer_info(url: str) -> None:
    async with await nats.connect(url) as nc:
        info = await api(nc, f"CONSUMER.INFO.{GOOD}.KEEP")
        assert info["config"]["durable_name"] == "KEEP"


def test_a_damaged_catalog_file_stops_the_gateway_until_repaired(store: Jetlake) -> None:
    """Without a catalog file a deleted stream could come back: the gateway names it and stops."""
    catalog = sorted((store.data_root / "catalog").glob("*.parquet"))
    flip(catalog[0], 0.5)
    store.start_server()
    try:
        with pytest.raises(RuntimeError, match="gateway exited"):
            store.start_gateway()
        said = (store.workdir / "gateway.log").read_text()
        assert f"catalog/{catalog[0].name}" in said
        assert "the gateway needs it whole" in said
        code, out = repair(store.data_root)
        assert code == 1
        assert f"catalog/{catalog[0].name}: data file" in out
    finally:
        store.stop()
