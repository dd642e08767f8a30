"""Damaged files (#16): a flipped bit or a cut tail in a data file, a Delta log entry, a checkpoint or
an index snapshot is detected, reported and never served; ``jetlake repair`` drops what is lost.

One store is built once (stream ``BAD``: 120 messages, one commit each, so ``messages`` has a
checkpoint at version 100 and a file per message; stream ``GOOD``: 10 messages and a consumer;
stream ``GONE``: 3 messages, the second deleted; a clean stop, so each has an index snapshot). Each
case damages a copy of it, starts the real gateway on it and checks
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
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from deltalake.transaction import RemoveAction

from storage_delta.commit.store import StoreRoot
from storage_delta.format import schema as sch
from storage_delta.format.integrity import DamagedFile
from storage_delta.format.schema import MESSAGE_FILE_SCHEMA, MESSAGE_PARTITIONS
from storage_delta.maintenance.files import rewrite_files, swap_actions
from storage_delta.read import index_snapshot
from storage_delta.read.reader import MessageReader
from storage_delta.tables.catalog import CatalogTable
from storage_delta.tables.removals import Removal, RemovalLog, live_streams, load_stream_states
from storage_delta.tables.repair import check_at_start
from storage_delta.tables.scope import Scope, load_store_state
from storage_delta.tables.unresolved import UnresolvedEntry
from tests.differential import api
from tests.harness import ROOT, Jetlake, duckdb_connection, wait_log
from tests.monitor_fixtures import get_json, http_get

BAD, GOOD = "BAD", "GOOD"
#: A third stream with a deleted message (its removal is the ``removals`` table's one row).
GONE = "GONE"
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
        await api(nc, f"STREAM.CREATE.{GONE}", {"name": GONE, "subjects": ["gone.>"]})
        for i in range(1, 4):
            await js.publish("gone.x", f"gone-{i}".encode())
        assert (await api(nc, f"STREAM.MSG.DELETE.{GONE}", {"seq": 2}))["success"]


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


def repair_as_it_says(store: Jetlake, *says: str) -> None:
    """With the gateway stopped: the dry run finds damage and says each of ``says``; ``--apply``
    leaves none (the caller checks the tables, then starts the gateway again)."""
    assert store.stop_gateway() == 0
    code, out = repair(store.data_root)
    assert code == 1
    for text in says:
        assert text in out
    code, out = repair(store.data_root, "--apply")
    assert code == 0, out


def _entry_repaired_and_served(store: Jetlake, entry: Path, lost: range, says: str) -> dict[str, Any]:
    """With the gateway down: the dry run names the damaged log entry and says ``says``; ``--apply``
    drops what cannot be made again, so the table holds every sequence but ``lost``; the gateway
    then starts healthy and serves the stream without them, its last sequence kept."""
    code, out = repair(store.data_root)
    assert code == 1
    assert f"{entry.name}: log entry, version {int(entry.stem)}" in out
    assert says in out
    assert repair(store.data_root, "--apply")[0] == 0
    assert _duckdb_seqs(store.data_root) == [s for s in range(1, BAD_MSGS + 1) if s not in lost]
    store.start_gateway()
    assert healthz(store) == (200, {"status": "ok"})
    seen: dict[str, Any] = asyncio.run(_observe(store.url, lost))
    assert (seen["bad"]["messages"], seen["bad"]["last_seq"]) == (BAD_MSGS - len(lost), BAD_MSGS)
    return seen


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
    path.unlink()  # with the file there, its digest finds the line again (the next test)
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


def test_a_log_entry_with_a_flipped_bit_in_a_file_name_is_made_again_from_its_digest(store: Jetlake) -> None:
    """The damaged line names a file that does not exist; the file it named, which no version
    names now, matches the line's digest: the gateway rewrites the line as it was and serves all."""
    path, _ = _messages_file(store.data_root, BAD_MSGS - 10)
    entry = _entry_of(store.data_root, path)
    original = entry.read_bytes()
    flip_in_path(entry, path)
    store.start()
    try:
        assert healthz(store) == (200, {"status": "ok"})
        assert f"found again from its file {path}" in (store.workdir / "gateway.log").read_text()
        assert _add_of(entry.read_bytes()) == _add_of(original)
        _check_served(asyncio.run(_observe(store.url, range(0))), range(0))
    finally:
        store.stop()


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


def cut_before_the_name(entry: Path, file: Path) -> bytes:
    """Cut the entry where nothing says which file its ``add`` named; returns the original."""
    body = entry.read_bytes()
    entry.write_bytes(body[: body.index(b'{"add":{"path"') + len(b'{"add":{"pa')])
    return body


def test_a_log_entry_cut_before_its_file_is_named_is_made_again_from_its_digest(store: Jetlake) -> None:
    """Cut where nothing says which file the ``add`` named: its digest in the surviving
    ``commitInfo`` and the file no version names find the line again, byte for byte (the
    ``modificationTime`` too); the gateway rewrites the entry and serves everything."""
    path, _ = _messages_file(store.data_root, BAD_MSGS - 10)
    entry = _entry_of(store.data_root, path)
    original = cut_before_the_name(entry, path)
    store.start()
    try:
        assert healthz(store) == (200, {"status": "ok"})
        log_text = (store.workdir / "gateway.log").read_text()
        assert f"damaged log entry {entry}" in log_text
        assert f"found again from its file {path}" in log_text
        assert f"rewrote {entry}: damaged lines [4], of them dropped []" in log_text
        (add,) = (line for line in entry.read_bytes().splitlines() if line.startswith(b'{"add"'))
        assert add in original.splitlines()
        _check_served(asyncio.run(_observe(store.url, range(0))), range(0))
        assert store.stop_gateway() == 0
        assert repair(store.data_root)[0] == 0
        assert _duckdb_seqs(store.data_root) == list(range(1, BAD_MSGS + 2))
    finally:
        store.stop()


#: Where a cut leaves an ``add`` line whose file is gone too, and which streams go offline (what
#: survives of the line says: every stream when nothing does, else the streams its path can name).
CUTS_WITHOUT_THE_FILE = {
    "before the name": (b'{"add":{"pa', (BAD, GOOD, GONE)),
    "inside the stream's name": (b'{"add":{"path":"stream=BA', (BAD,)),
    "after the stream's name": (b'{"add":{"path":"stream=BAD/block=', (BAD,)),
}


@pytest.mark.slow  # three gateway starts and three repair processes
@pytest.mark.parametrize("where", sorted(CUTS_WITHOUT_THE_FILE))
def test_a_log_entry_cut_in_an_add_whose_file_is_gone_takes_its_streams_offline(
    store: Jetlake, where: str
) -> None:
    """Cut inside its ``add`` line, and the file is gone too: nothing can make the line again. The
    entry no longer parses (delta-rs would refuse the whole table), so the gateway sets it aside at
    start (rewrites it without the line, the original kept, a marker written first) and takes
    offline the streams the line's surviving bytes can name, every stream when they name none; the
    others, the API and the other tables serve, and every reader reads the table. A restart keeps
    them offline; repair drops the line (its file's sequences become a gap) and they serve again."""
    path, lost = _messages_file(store.data_root, BAD_MSGS - 10)
    entry = _entry_of(store.data_root, path)
    keep, offline = CUTS_WITHOUT_THE_FILE[where]
    body = entry.read_bytes()
    damaged = body[: body.index(b'{"add":{"path"') + len(keep)]
    entry.write_bytes(damaged)
    path.unlink()
    why = (
        "a damaged messages log entry whose content is unknown, see jetlake repair"
        if len(offline) > 1
        else f"a damaged messages log entry _delta_log/{entry.name} lost a line of it, see jetlake repair"
    )
    store.start_server()
    try:
        _offline_until_repaired(store, entry, damaged, lost, offline, why)
        seen = _entry_repaired_and_served(store, entry, lost, "1 damaged line(s) dropped")
        assert seen["next"] == BAD_MSGS + 1
    finally:
        store.stop()


@pytest.mark.slow  # two gateway starts and three repair processes
def test_a_set_aside_entry_that_held_a_streams_last_messages_does_not_let_them_be_numbered_again(
    store: Jetlake,
) -> None:
    """The lost line (cut before its name, its file gone) added the stream's last message: no file
    holds sequence 120 any more, but the stream's index snapshot (written at the clean stop) knew
    it, so repair records it as removed and the stream keeps its last sequence: the next publish
    gets 121, not 120 again."""
    path, lost = _messages_file(store.data_root, BAD_MSGS - 1)
    assert lost == range(BAD_MSGS, BAD_MSGS + 1)
    entry = _entry_of(store.data_root, path)
    cut_before_the_name(entry, path)
    path.unlink()
    store.start()
    try:
        assert healthz(store)[0] == 503
        assert store.stop_gateway() == 0
        says = f"sequences {BAD_MSGS}-{BAD_MSGS} of stream {BAD} (its index snapshot knew them"
        seen = _entry_repaired_and_served(store, entry, lost, says)
        assert seen["next"] == BAD_MSGS + 1
    finally:
        store.stop()


def _offline_until_repaired(
    store: Jetlake, entry: Path, damaged: bytes, lost: range, offline: tuple[str, ...], why: str
) -> None:
    """Twice (the second start reads the marker the first wrote): the gateway starts, ``/healthz``
    names the entry set aside and the offline streams, which answer as offline streams while the
    others serve; meanwhile DuckDB reads the rewritten table and the damaged original is kept."""
    for _ in range(2):
        store.start_gateway()
        status, health = healthz(store)
        assert status == 503
        assert any(
            p.startswith(f"damaged log entry messages/_delta_log/{entry.name}: ")
            and "set aside at start" in p
            for p in health["problems"]
        ), health
        assert f"stream {offline[0]} is offline: {why}" in health["problems"]
        seen = asyncio.run(_offline(store.url, offline[0], why, also=offline[1:]))
        assert sorted(seen["infos"]) == sorted({BAD, GOOD, GONE} - set(offline))
        assert store.stop_gateway() == 0
    assert _duckdb_seqs(store.data_root) == [s for s in range(1, BAD_MSGS + 1) if s not in lost]
    assert (store.data_root / "messages" / "_jetlake_quarantine" / entry.name).read_bytes() == damaged


@pytest.mark.slow  # three gateway starts and three repair processes
@pytest.mark.parametrize("where", ["to nothing", "inside its commitInfo"])
def test_a_log_entry_that_lost_its_commit_info_is_never_taken_for_an_empty_commit(
    store: Jetlake, where: str
) -> None:
    """Cut within its first line, the entry lost the count of its lines with its digests: what it
    held is unknown (it was rewritten as an empty commit before: its messages were gone without a
    word, and a stream's last ones would have been numbered again). Cut to nothing, Delta readers
    take it for an empty commit; cut inside, delta-rs refuses the table. Either way the gateway sets
    it aside and starts with every stream offline, until repair drops it; its file's sequences
    become a gap."""
    path, lost = _messages_file(store.data_root, BAD_MSGS - 10)
    entry = _entry_of(store.data_root, path)
    damaged = b"" if where == "to nothing" else entry.read_bytes()[:30]
    entry.write_bytes(damaged)
    store.start_server()
    try:
        why = "a damaged messages log entry whose content is unknown, see jetlake repair"
        _offline_until_repaired(store, entry, damaged, lost, (GOOD, BAD, GONE), why)
        _entry_repaired_and_served(
            store, entry, lost, "its commitInfo is lost, and with it what the commit held: unknown"
        )
    finally:
        store.stop()


@pytest.mark.slow  # two gateway starts and two repair processes
@pytest.mark.parametrize("table", [sch.CATALOG, sch.REMOVALS, sch.ACKS])
def test_a_log_entry_of_another_table_that_lost_its_commit_info_is_set_aside(
    store: Jetlake, table: str
) -> None:
    """The newest entry of the catalog, the removal log or the ack log cut inside its
    ``commitInfo``: delta-rs would refuse the table, so the gateway would not start. It sets the
    entry aside: a lost catalog or removal log commit may concern any stream, so every stream is
    offline; a lost ack log commit concerns no stream's messages or definition (its acks are
    redeliveries, as with a damaged ack log file), so every stream serves. Repair drops it."""
    entry = max((store.data_root / table / "_delta_log").glob("*.json"))
    assert int(entry.stem) > 0  # not the table's creation
    entry.write_bytes(entry.read_bytes()[:30])
    store.start()
    try:
        status, health = healthz(store)
        assert status == 503
        assert any(
            p.startswith(f"damaged log entry {table}/_delta_log/{entry.name}: ") and "set aside at start" in p
            for p in health["problems"]
        ), health
        why = f"a damaged {table} log entry whose content is unknown, see jetlake repair"
        infos = asyncio.run(_infos(store.url))
        if table == sch.ACKS:
            assert all("error" not in info for info in infos.values()), infos
        else:
            offline = {"code": 500, "err_code": 10194, "description": f"stream is offline: {why}"}
            assert {name: info.get("error") for name, info in infos.items()} == dict.fromkeys(infos, offline)
        repair_as_it_says(
            store, f"{entry.name}: log entry, version {int(entry.stem)}", "its commitInfo is lost"
        )
        store.start_gateway()
        assert healthz(store) == (200, {"status": "ok"})
        assert "error" not in asyncio.run(_infos(store.url))[BAD]
    finally:
        store.stop()


def _flip_a_column_name(body: bytes) -> bytes:
    """One bit of the schema's first column name flipped: the entry still parses, and a reader
    would take the table for one with another column."""
    at = body.index(b'[{\\"name\\":\\"') + len(b'[{\\"name\\":\\"')
    return body[:at] + bytes([body[at] ^ 1]) + body[at + 1 :]


#: Damage to a table's creation (version 0: its protocol and metaData, which delta-rs wrote from
#: jetlake's spec of the table; jetlake adds the digests of its lines, so a damaged line is one
#: whose digest differs, one that does not parse, and a missing protocol or metaData).
CREATION_DAMAGES: dict[str, Callable[[bytes], bytes]] = {
    "cut": lambda body: body[: len(body) * 2 // 3],
    "to nothing": lambda body: b"",
    "cut after the table id": lambda body: body[: body.index(b'"name":null')],
    "a flipped bit that still parses": _flip_a_column_name,
}


@pytest.mark.slow  # two gateway starts
@pytest.mark.parametrize(
    ("table", "damage"),
    [
        (sch.CATALOG, "cut"),
        (sch.REMOVALS, "to nothing"),
        (sch.ACKS, "cut after the table id"),
        (sch.CATALOG, "a flipped bit that still parses"),
    ],
)
def test_a_damaged_creation_of_a_table_without_a_checkpoint_is_rebuilt_from_its_spec(
    store: Jetlake, table: str, damage: str
) -> None:
    """The creation of a table with no checkpoint yet (every load reads it) damaged: delta-rs would
    refuse the table, and the gateway did not start. Its protocol and metaData are what jetlake
    wrote from the table's spec (schema, partition columns, properties), so they are made again
    from it (the table id kept when it survived), the original kept aside, and the gateway starts
    and serves everything; DuckDB reads every row the table held (and those the run added) and
    repair finds nothing."""
    log_dir = store.data_root / table / "_delta_log"
    assert not list(log_dir.glob("*.checkpoint.parquet"))
    creation = log_dir / f"{0:020d}.json"
    body = creation.read_bytes()
    table_id = json.loads(body.split(b"\n")[2])["metaData"]["id"]
    before = _duckdb_rows(store.data_root, table)
    damaged = CREATION_DAMAGES[damage](body)
    creation.write_bytes(damaged)
    store.start()
    try:
        assert healthz(store) == (200, {"status": "ok"})
        _check_served(asyncio.run(_observe(store.url, range(0))), range(0))
        assert store.stop_gateway() == 0
        assert f"rewrote {creation}" in (store.workdir / "gateway.log").read_text()
        assert (store.data_root / table / "_jetlake_quarantine" / creation.name).read_bytes() == damaged
        rebuilt = [json.loads(line) for line in creation.read_bytes().splitlines()]
        assert [next(iter(action)) for action in rebuilt] == ["commitInfo", "protocol", "metaData"]
        assert (rebuilt[2]["metaData"]["id"] == table_id) is (table_id.encode() in damaged)
        after = _duckdb_rows(store.data_root, table)  # the rows before, and what the run added
        assert before
        assert [row for row in before if row not in after] == []
        assert repair(store.data_root)[0] == 0
    finally:
        store.stop()


def _duckdb_rows(data_root: Path, table: str) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = (
        duckdb_connection()
        .execute("SELECT * FROM delta_scan(?) ORDER BY ALL", [str(data_root / table)])
        .fetchall()
    )
    return rows


async def _infos(url: str) -> dict[str, dict[str, Any]]:
    async with await nats.connect(url) as nc:
        return {name: await api(nc, f"STREAM.INFO.{name}") for name in (BAD, GOOD)}


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


def test_a_checkpoint_hint_naming_a_missing_checkpoint_is_set_aside(store: Jetlake) -> None:
    """``_last_checkpoint`` with a flipped low bit of its version's last digit still parses and
    names a checkpoint that is not there, and Delta readers (DuckDB, delta-rs, so the jobs and
    repair) refuse the table: the gateway sets the hint aside at start (readers list the log for
    the newest checkpoint; nothing is lost) and serves everything, and DuckDB reads the table."""
    hint = store.data_root / "messages" / "_delta_log" / "_last_checkpoint"
    body = hint.read_bytes()
    at = body.index(b",", body.index(b'"version":')) - 1  # its last digit
    # a higher version (readers start from a lower one's checkpoint and replay: no harm)
    digit = next(d for d in (body[at] ^ bit for bit in (1, 2, 4, 8)) if body[at] < d <= ord("9"))
    hint.write_bytes(body[:at] + bytes([digit]) + body[at + 1 :])
    named = int(json.loads(hint.read_bytes())["version"])
    assert named > int(json.loads(body)["version"])
    assert not list(hint.parent.glob(f"{named:020d}.checkpoint*"))
    store.start()
    try:
        assert healthz(store) == (200, {"status": "ok"})
        log_text = (store.workdir / "gateway.log").read_text()
        assert "_last_checkpoint names a checkpoint that is not there" in log_text
        _check_served(asyncio.run(_observe(store.url, range(0))), range(0))
        assert _duckdb_seqs(store.data_root) == list(range(1, BAD_MSGS + 2))
        assert store.stop_gateway() == 0
        assert repair(store.data_root)[0] == 0
    finally:
        store.stop()


@pytest.mark.slow  # three gateway starts
@pytest.mark.parametrize("damage", ["flip", "cut"])
def test_a_damaged_index_snapshot_is_reported_and_written_again(store: Jetlake, damage: str) -> None:
    """The snapshot is a cache: recovery reads the message files instead and serves everything. It
    is reported (the log, ``/healthz``, the stream's ``index_snapshot`` in ``/lake``) until a good
    snapshot is written over it: at a clean stop, and at the next snapshot round of a running
    gateway, whatever ``index_snapshot_min_new`` says."""
    snapshot = store.data_root / "_jetlake_index" / f"{BAD}.parquet"
    created = _created(store.data_root, BAD)
    damage_snapshot = flip_in_seq_page if damage == "flip" else cut
    damage_snapshot(snapshot)
    store.start_server()
    try:
        store.start_gateway({"JETLAKE_INDEX_SNAPSHOT_INTERVAL_MS": "3600000"})
        status, health = healthz(store)
        assert status == 503
        (said,) = [p for p in health["problems"] if "index snapshot" in p]
        assert said.startswith(f"damaged index snapshot of stream {BAD}: ")
        assert "recovered from the message files" in said
        lake = get_json(f"http://127.0.0.1:{store.monitor_port}/lake", None)
        damaged = {s["name"]: s["index_snapshot"]["damaged"] for s in lake["streams"]}
        assert damaged[GOOD] is None
        assert damaged[GONE] is None
        assert damaged[BAD]
        assert damaged[BAD] in said
        assert f"index snapshot of {BAD} damaged" in (store.workdir / "gateway.log").read_text()
        _check_served(asyncio.run(_observe(store.url, range(0))), range(0))
        with pytest.raises(index_snapshot.DamagedSnapshot):
            index_snapshot.read(StoreRoot(str(store.data_root)), BAD, created)
        assert store.stop_gateway() == 0  # a clean stop writes a good one over it
        assert index_snapshot.read(StoreRoot(str(store.data_root)), BAD, created) is not None
        store.start_gateway()
        assert healthz(store) == (200, {"status": "ok"})
        assert store.stop_gateway() == 0

        damage_snapshot(snapshot)  # a running gateway writes it again at its next round
        (store.workdir / "gateway.log").unlink()  # what the clean stop said is not what is looked for
        store.start_gateway({"JETLAKE_INDEX_SNAPSHOT_INTERVAL_MS": "300"})
        wait_log(store.workdir / "gateway.log", f"index snapshot of {BAD} written again over the damaged one")
        assert healthz(store) == (200, {"status": "ok"})
        assert index_snapshot.read(StoreRoot(str(store.data_root)), BAD, created) is not None
    finally:
        store.stop()


def _created(data_root: Path, stream: str) -> int:
    return live_streams(StoreRoot(str(data_root)))[stream]


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
        repair_as_it_says(store, f"acks/{acks[len(acks) // 2].name}: data file")
        store.start_gateway()
        assert healthz(store) == (200, {"status": "ok"})
        asyncio.run(_consumer_info(store.url))
    finally:
        store.stop()


async def _consumer_info(url: str) -> None:
    async with await nats.connect(url) as nc:
        info = await api(nc, f"CONSUMER.INFO.{GOOD}.KEEP")
        assert info["config"]["durable_name"] == "KEEP"


def _file_of(data_root: Path, table: str, stream: str) -> Path:
    """The one data file of ``table`` whose rows are all of ``stream`` (by its add statistics)."""
    dt = DeltaTable(str(data_root / table))
    adds = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    (path,) = (str(a["path"]) for a in adds if a["min.stream"] == a["max.stream"] == stream)
    return data_root / table / path


async def _offline(url: str, stream: str, why: str, also: tuple[str, ...] = ()) -> dict[str, Any]:
    """What clients see of a quarantined stream (and of ``also``, offline too) and of the others."""
    offline_ones = sorted({stream, *also})
    served = sorted({BAD, GOOD, GONE} - set(offline_ones))
    async with await nats.connect(url) as nc:
        offline = {"code": 500, "err_code": 10194, "description": f"stream is offline: {why}"}
        assert (await api(nc, f"STREAM.INFO.{stream}"))["error"] == offline
        assert (await api(nc, f"STREAM.CREATE.{stream}", {"name": stream}))["error"] == offline
        assert (await api(nc, f"STREAM.DELETE.{stream}"))["error"] == offline
        assert (await api(nc, f"CONSUMER.INFO.{stream}.X"))["error"] == offline
        with pytest.raises(nats.errors.TimeoutError):  # the server lets a read time out
            await nc.request(f"$JS.API.STREAM.MSG.GET.{stream}", b'{"seq":1}', timeout=0.5)
        with pytest.raises(nats.errors.NoRespondersError):  # no stream captures its subjects
            await nc.request(f"{stream.lower()}.x", b"lost?", timeout=2)
        assert (await api(nc, "INFO"))["streams"] == 3  # offline ones count, as on the server
        names = await api(nc, "STREAM.NAMES")
        assert names["streams"] == sorted([BAD, GOOD, GONE])
        assert names["total"] == 3
        listed = await api(nc, "STREAM.LIST")
        assert listed["missing"] == offline_ones
        assert listed["offline"] == dict.fromkeys(offline_ones, why)
        assert sorted(s["config"]["name"] for s in listed["streams"]) == served
        infos = {s: await api(nc, f"STREAM.INFO.{s}") for s in served}
        if GOOD not in served:
            return {"infos": infos}
        consumer = await api(nc, f"CONSUMER.INFO.{GOOD}.KEEP")
        published = await nc.jetstream().publish("good.x", b"served")
        return {"infos": infos, "consumer": consumer, "published": published.seq}


def _catalog_streams(data_root: Path) -> list[str]:
    rows = (
        duckdb_connection()
        .execute("SELECT DISTINCT stream FROM delta_scan(?) ORDER BY stream", [str(data_root / "catalog")])
        .fetchall()
    )
    return [r[0] for r in rows]


@pytest.mark.slow  # two gateway starts and three repair processes
@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_catalog_file_takes_only_its_stream_offline(store: Jetlake, damage: str) -> None:
    """The damaged file is stream ``BAD``'s creation: ``BAD`` answers as an offline stream (its
    definition cannot be known), the others are served; repair drops the file, after which ``BAD``
    is gone (its creation was the row lost) and the rest is as before."""
    path = _file_of(store.data_root, "catalog", BAD)
    DAMAGES[damage](path)
    why = f"damaged catalog file {path.name}, see jetlake repair"
    store.start()
    try:
        status, health = healthz(store)
        assert status == 503
        assert f"stream {BAD} is offline: {why}" in health["problems"]
        assert any(
            f"damaged data file catalog/{path.name} (1 rows, stream {BAD})" in p for p in health["problems"]
        )
        seen = asyncio.run(_offline(store.url, BAD, why))
        assert seen["infos"][GOOD]["state"]["messages"] == GOOD_MSGS
        assert seen["infos"][GONE]["state"]["messages"] == 2
        assert seen["consumer"]["num_ack_pending"] == 0
        assert seen["consumer"]["ack_floor"]["stream_seq"] == GOOD_MSGS
        assert seen["published"] == GOOD_MSGS + 1
        repair_as_it_says(
            store,
            f"catalog/{path.name}: data file, 1 rows, stream {BAD};",
            "a lost creation leaves its messages unreachable",
        )
        assert f"stream {BAD} is offline" in (store.workdir / "gateway.log").read_text()
        assert _catalog_streams(store.data_root) == [GONE, GOOD]
        store.start_gateway()
        assert healthz(store) == (200, {"status": "ok"})
        asyncio.run(_after_catalog_repair(store.url))
    finally:
        store.stop()


async def _after_catalog_repair(url: str) -> None:
    async with await nats.connect(url) as nc:
        assert (await api(nc, f"STREAM.INFO.{BAD}"))["error"]["err_code"] == 10059
        assert (await api(nc, f"STREAM.INFO.{GOOD}"))["state"]["messages"] == GOOD_MSGS + 1


@pytest.mark.slow  # two gateway starts and three repair processes
def test_a_damaged_removals_file_takes_only_its_stream_offline(store: Jetlake) -> None:
    """The damaged file records ``GONE``'s deleted message: ``GONE`` is offline (served, the
    message would be live again), ``BAD`` and ``GOOD`` are served as before; repair drops the file
    and says that the deleted message comes back, which it does."""
    path = _file_of(store.data_root, "removals", GONE)
    flip(path, 0.5)
    why = f"damaged removals file {path.name}, see jetlake repair"
    store.start()
    try:
        status, health = healthz(store)
        assert status == 503
        assert f"stream {GONE} is offline: {why}" in health["problems"]
        seen = asyncio.run(_offline(store.url, GONE, why))
        assert seen["infos"][BAD]["state"]["messages"] == BAD_MSGS
        assert seen["infos"][GOOD]["state"]["messages"] == GOOD_MSGS
        repair_as_it_says(
            store,
            f"removals/{path.name}: data file, 1 rows, stream {GONE};",
            "deleted messages that only it recorded become live again",
        )
        removals = duckdb_connection().execute(
            "SELECT count(*) FROM delta_scan(?)", [str(store.data_root / "removals")]
        )
        assert removals.fetchall() == [(0,)]
        store.start_gateway()
        assert healthz(store) == (200, {"status": "ok"})
        asyncio.run(_gone_served(store.url))
    finally:
        store.stop()


async def _gone_served(url: str) -> None:
    async with await nats.connect(url) as nc:
        state = (await api(nc, f"STREAM.INFO.{GONE}"))["state"]
        assert (state["messages"], state["last_seq"]) == (3, 3)


def _strip_stream_stats(table: Path) -> None:
    """Rewrite every log entry of ``table`` as a writer before stream statistics made it: no
    ``stream`` bounds in an ``add``'s statistics (only the gateway's start checks the digests)."""
    for entry in (table / "_delta_log").glob("*.json"):
        lines = []
        for line in entry.read_bytes().splitlines():
            obj = json.loads(line)
            if "add" in obj and obj["add"].get("stats"):
                stats = json.loads(obj["add"]["stats"])
                for key in ("minValues", "maxValues"):
                    stats[key].pop("stream", None)
                obj["add"]["stats"] = json.dumps(stats)
            lines.append(json.dumps(obj).encode())
        entry.write_bytes(b"\n".join(lines) + b"\n")


def test_the_scope_of_a_damaged_file_is_what_its_statistics_bound(tmp_path: Path) -> None:
    """Without the gateway: a damaged removals file of stream A quarantines A alone; a catalog file
    whose statistics name no stream (written before they did) quarantines every name, unknown ones
    too (the lost row may be a creation), and the jobs' readers refuse both tables."""
    root = StoreRoot(str(tmp_path))
    catalog = CatalogTable(root)
    for name, created in (("A", 1), ("B", 2), ("C", 3)):
        catalog.put("stream", name, name, {"config": {"name": name}, "created": created})
    removals = RemovalLog(root)
    for name, created in (("A", 1), ("B", 2)):
        removals.append([Removal(name, created, 1, 5)])
    flip(_file_of(tmp_path, "removals", "A"), 0.5)
    state = load_store_state(root)
    assert set(state.quarantine.streams) == {"A"}
    assert sorted(e.name for e in state.entries) == ["B", "C"]
    assert state.streams["B"].removed == [(1, 5)]
    assert state.quarantine.reason("NEW") is None
    with pytest.raises(DamagedFile, match="removals/"):
        load_stream_states(root)
    _strip_stream_stats(tmp_path / "removals")  # a file written before: its incarnations bound it
    assert set(load_store_state(root).quarantine.streams) == {"A"}

    _strip_stream_stats(tmp_path / "catalog")
    cut(next((tmp_path / "catalog").glob("*.parquet")))
    state = load_store_state(root)
    assert state.entries == []
    # the streams whole rows still name are listed; the one whose row was lost cannot be, but is
    # refused like any other name
    assert len(state.quarantine.streams) == 2
    why = next(iter(state.quarantine.streams.values()))
    assert [state.quarantine.reason(n) for n in ("A", "B", "C", "NEW")] == [why] * 4
    assert "every stream" in Scope.of({}).describe()
    with pytest.raises(DamagedFile, match="catalog/"):
        live_streams(root)


def test_a_lost_add_line_is_found_again_when_compaction_removed_its_file_since(store: Jetlake) -> None:
    """The file of the cut line was merged since (a later version removes it and adds the merged
    file): it is still the only version that can have added it, so the start's check makes the
    line again and the table reads as before, every sequence once."""
    path, _ = _messages_file(store.data_root, BAD_MSGS - 10)
    entry = _entry_of(store.data_root, path)
    root = StoreRoot(str(store.data_root))
    rel = str(path.relative_to(store.data_root / "messages"))
    _, merged = rewrite_files(root, BAD, 0, [rel])
    assert merged is not None
    gone = RemoveAction(
        path=rel, data_change=False, deletion_timestamp=0, partition_values={"stream": BAD, "block": "0"}
    )
    assert swap_actions(root, "messages", MESSAGE_FILE_SCHEMA, MESSAGE_PARTITIONS, [gone], [merged])
    original = cut_before_the_name(entry, path)
    assert check_at_start(root).problems == []
    (add,) = (line for line in entry.read_bytes().splitlines() if line.startswith(b'{"add"'))
    assert add in original.splitlines()
    assert _duckdb_seqs(store.data_root) == list(range(1, BAD_MSGS + 1))


def test_the_streams_a_set_aside_entry_concerns_are_what_its_dropped_lines_name() -> None:
    """A ``messages`` line names its stream when its path survived past the name, the streams with
    a prefix when cut inside it (an escape cut in two counts for nothing), every stream otherwise;
    a lost ``commitInfo`` means every stream; ``catalog`` every stream, the ack log none."""

    def concerned(table: str, dropped: dict[int, bytes], names: list[str]) -> list[str]:
        scopes = UnresolvedEntry(table, 7, "cut", dropped).scopes()
        return [n for n in names if any(s.names(n) for s in scopes)]

    names = ["A", "AB", "A%B", "B", "ZZ"]
    path = b'{"add":{"path":"stream='
    assert concerned(sch.MESSAGES, {3: path + b"AB/block=0/part-1"}, names) == ["AB"]
    assert concerned(sch.MESSAGES, {3: path + b"A"}, names) == ["A", "AB", "A%B"]
    assert concerned(sch.MESSAGES, {3: path + b"A%25B/"}, names) == ["A%B"]
    assert concerned(sch.MESSAGES, {3: path + b"A%2"}, names) == ["A", "AB", "A%B"]
    assert concerned(sch.MESSAGES, {3: b'{"remove":{"path":"stream=B/'}, names) == ["B"]
    assert concerned(sch.MESSAGES, {3: b'{"add":{"pa'}, names) == names
    assert concerned(sch.MESSAGES, {3: b""}, names) == names
    assert concerned(sch.MESSAGES, {0: b'{"commitInfo":{"ti'}, names) == names
    assert concerned(sch.CATALOG, {2: path + b"AB/"}, names) == names
    assert concerned(sch.ACKS, {2: b""}, names) == []
    assert UnresolvedEntry(sch.MESSAGES, 7, "cut", {3: path + b"AB/", 4: path + b"B"}).describe() == (
        "stream AB, a stream named B…"
    )
