"""The messages-table readers against real Delta tables written by the gateway's own writer."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from deltalake import DeltaTable

from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import MessageTable, StoredMessage
from storage_delta.format import schema as sch
from storage_delta.maintenance.seal import seal_stream
from storage_delta.read import reader as reader_mod
from storage_delta.read.reader import DataFile, MessageReader
from tests.harness import duckdb_connection

BLOCK = 10  # small blocks, so a few dozen messages span several partitions
T0 = 1_700_000_000_000_000_000


def message(stream: str, seq: int, subject: str | None = None, ts: int | None = None) -> StoredMessage:
    return StoredMessage(
        stream,
        BLOCK,
        seq,
        T0 + seq * 1_000 if ts is None else ts,
        subject or f"{stream.lower()}.k{seq % 3}",
        b"NATS/1.0\r\nX-Seq: %d\r\n\r\n" % seq if seq % 2 else None,
        b"payload-%d" % seq,
    )


@pytest.fixture
def store(tmp_path: Path) -> StoreRoot:
    """Two streams, 45 and 12 messages, committed in batches of 4 (files never span a commit)."""
    root = StoreRoot(str(tmp_path / "root"))
    table = MessageTable(root)
    batch: list[StoredMessage] = []
    version = 0
    rows = [message("ORDERS", s) for s in range(1, 46)] + [message("OTHER", s) for s in range(1, 13)]
    for i, m in enumerate(rows, 1):
        batch.append(m)
        if i % 4 == 0 or i == len(rows):
            version += 1
            table.commit(batch, version)
            batch = []
    table.close()
    return root


def test_read_range_is_inclusive_and_ordered(store: StoreRoot) -> None:
    reader = MessageReader(store)
    got = reader.read_range("ORDERS", 8, 23, BLOCK)
    assert got.column("seq").to_pylist() == list(range(8, 24))
    assert got.column("data").to_pylist() == [b"payload-%d" % s for s in range(8, 24)]
    assert got.column("hdrs").to_pylist()[0] is None  # seq 8 was published without headers
    assert reader.read_range("OTHER", 1, 100, BLOCK).num_rows == 12
    assert reader.read_range("ORDERS", 46, 60, BLOCK).num_rows == 0
    assert reader.read_range("NOPE", 1, 10, BLOCK).num_rows == 0


def test_read_range_touches_only_files_that_can_hold_the_range(store: StoreRoot) -> None:
    """Files outside the range are never opened: delete them and the read still answers."""
    reader = MessageReader(store)
    files = reader.stream_files("ORDERS")
    assert [f.min_seq for f in files] == sorted(f.min_seq for f in files)
    keep = [f for f in files if f.max_seq >= 30 and f.min_seq <= 31]
    assert len(keep) < len(files)
    for f in files:
        if f not in keep:
            os.remove(f"{store.uri}/{sch.MESSAGES}/{f.path}")
    assert reader.read_range("ORDERS", 30, 31, BLOCK).column("seq").to_pylist() == [30, 31]
    # a range over the deleted files has to open them: missing, they count as damaged, not served
    kept = [seq for f in keep for seq in range(f.min_seq, f.max_seq + 1)]
    assert reader.read_range("ORDERS", 1, 45, BLOCK).column("seq").to_pylist() == kept
    gone = {f.path for f in files if f not in keep}
    assert {d.file.path for d in reader.damage("ORDERS")} == gone
    assert all("unreadable" in d.reason for d in reader.damage("ORDERS"))


def test_first_seq_at_or_after_a_time(store: StoreRoot) -> None:
    reader = MessageReader(store)
    assert reader.first_seq_at_time("ORDERS", T0) == 1
    assert reader.first_seq_at_time("ORDERS", T0 + 17_000) == 17
    assert reader.first_seq_at_time("ORDERS", T0 + 17_001) == 18
    assert reader.first_seq_at_time("ORDERS", T0 + 46_000) is None
    assert reader.first_seq_at_time("ORDERS", 0, min_ts=T0 + 40_000) == 40


def test_last_message_per_subject(store: StoreRoot) -> None:
    reader = MessageReader(store)
    assert reader.last_per_subject("ORDERS") == {"orders.k0": 45, "orders.k1": 43, "orders.k2": 44}
    assert reader.last_per_subject("OTHER") == {"other.k0": 12, "other.k1": 10, "other.k2": 11}
    last = reader.last_for_subject("ORDERS", "orders.k1")
    assert last.to_pylist() == [
        {
            "seq": 43,
            "ts": T0 + 43_000,
            "subject": "orders.k1",
            "hdrs": b"NATS/1.0\r\nX-Seq: 43\r\n\r\n",
            "data": b"payload-43",
        }
    ]
    assert reader.last_for_subject("ORDERS", "orders.none").num_rows == 0


def test_an_earlier_stream_of_the_same_name_is_invisible(tmp_path: Path) -> None:
    """A stream deleted and created again starts at 1; rows of the old one stay until compaction
    and are told apart by time (the new stream's created time)."""
    root = StoreRoot(str(tmp_path / "root"))
    table = MessageTable(root)
    table.commit([message("KV", s, "kv.a", ts=T0 + s) for s in range(1, 6)], 1)
    reborn = T0 + 1_000_000
    table.commit([message("KV", s, "kv.a", ts=reborn + s) for s in range(1, 3)], 2)
    table.close()
    reader = MessageReader(root)
    assert reader.read_range("KV", 1, 10, BLOCK, min_ts=reborn).column("ts").to_pylist() == [
        reborn + 1,
        reborn + 2,
    ]
    assert reader.last_for_subject("KV", "kv.a", min_ts=reborn).column("seq").to_pylist() == [2]
    assert reader.last_per_subject("KV", min_ts=reborn) == {"kv.a": 2}
    assert reader.first_seq_at_time("KV", 0, min_ts=reborn) == 1


def test_readers_see_new_commits_and_sealed_blocks(store: StoreRoot) -> None:
    reader = MessageReader(store)
    assert reader.read_range("ORDERS", 1, 100, BLOCK).num_rows == 45
    table = MessageTable(store)
    table.commit([message("ORDERS", 46, "orders.k1")], table.last_txn_version() + 1)
    table.close()
    assert reader.last_for_subject("ORDERS", "orders.k1").column("seq").to_pylist() == [46]
    before = reader.read_range("ORDERS", 1, 100, BLOCK)
    sealed = seal_stream(store, "ORDERS")
    assert sealed == 5  # blocks 0..4, each made of several commit files
    after = reader.read_range("ORDERS", 1, 100, BLOCK)
    assert after.equals(before)
    assert len(reader.stream_files("ORDERS")) == 5
    rows = (
        duckdb_connection()
        .execute(
            "SELECT stream, count(*), min(seq), max(seq), count(DISTINCT seq) FROM delta_scan(?) "
            "GROUP BY stream ORDER BY stream",
            [f"{store.uri}/{sch.MESSAGES}"],
        )
        .fetchall()
    )
    assert rows == [("ORDERS", 46, 1, 46, 46), ("OTHER", 12, 1, 12, 12)]


def test_a_listing_as_of_a_version_is_brought_forward_only_when_behind_it(store: StoreRoot) -> None:
    """A takeover's reads ask for the files as of the version read after its fences
    (``at_least``): a handle at or past it lists what it holds, one behind it catches up."""
    reader = MessageReader(store)
    at = reader.version()
    files = reader.stream_files("ORDERS")
    table = MessageTable(store)
    table.commit([message("ORDERS", 46)], table.last_txn_version() + 1)
    assert reader.stream_files("ORDERS", at) == files
    assert reader.stored_index("ORDERS", at_least=at).seq.tolist() == list(range(1, 46))
    table.commit([message("ORDERS", 47)], table.last_txn_version() + 1)
    table.close()
    assert reader.stored_index("ORDERS", at_least=at + 1).seq.tolist() == list(range(1, 48))
    assert reader.version() == at + 2
    assert len(reader.stream_files("ORDERS", at)) == len(files) + 2


def test_stored_index_is_what_the_rows_say(tmp_path: Path) -> None:
    """The recovery index: sequences in order, stored sizes as the file store counts them, the
    header blocks from a time on, rows of an earlier stream of the same name left out; sealing
    changes none of it."""
    root = StoreRoot(str(tmp_path / "root"))
    table = MessageTable(root)
    table.commit([message("KV", s, "kv.old", ts=T0 + s) for s in range(1, 6)], 1)
    reborn = T0 + 1_000_000
    rows = [message("KV", s, ts=reborn + s) for s in range(1, 31) if s not in (7, 8)]
    table.commit(rows[10:], 2)  # committed out of order: the index sorts
    table.commit(rows[:10], 3)
    table.close()
    reader = MessageReader(root)
    for _ in ("as committed", "sealed"):
        index = reader.stored_index("KV", reborn, headers_since=reborn + 20)
        assert index.seq.tolist() == [m.seq for m in rows]
        assert index.ts.tolist() == [m.ts for m in rows]
        assert [index.subjects[c] for c in index.subject_codes] == [m.subject for m in rows]
        assert index.size.tolist() == [sch.stored_size(m.subject, m.hdrs, m.data) for m in rows]
        assert index.headers == [(m.seq, m.ts, m.hdrs) for m in rows if m.hdrs and m.ts >= reborn + 20]
        assert reader.scan_index("KV", reborn)[:2] == [
            (m.seq, m.ts, m.subject, sch.stored_size(m.subject, m.hdrs, m.data)) for m in rows[:2]
        ]
        seal_stream(root, "KV")
    assert reader.stored_index("NONE").seq.tolist() == []


def test_a_listing_taken_while_another_thread_catches_up_is_not_kept_as_the_newer_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's reads share one reader over its worker threads. A thread that listed the
    files at one version while another caught the handle up to a newer one must not leave its
    older listing in the cache as the newer version's: the messages of the newer commits would
    then read as gone (a cold read's answer for a consumer) until the table changed again. The
    listing is slowed down here so that the threads meet every time."""
    root = StoreRoot(str(tmp_path / "root"))
    table = MessageTable(root)
    table.commit([message("RACE", 1)], 1)
    reader = MessageReader(root)
    assert [f.max_seq for f in reader.stream_files("RACE")] == [1]
    table.commit([message("RACE", 2)], 2)  # the reader's handle is at the first commit now

    listed = threading.Event()
    caught_up = threading.Event()
    real = reader_mod._files_by_stream

    def slow_listing(dt: DeltaTable) -> dict[str, list[DataFile]]:
        files = real(dt)
        if threading.current_thread().name == "first":
            listed.set()
            caught_up.wait(1.0)  # the second thread catches up and lists meanwhile (unless it waits)
        return files

    monkeypatch.setattr(reader_mod, "_files_by_stream", slow_listing)
    first = threading.Thread(target=reader.stream_files, args=("RACE",), name="first")
    first.start()
    assert listed.wait(10)
    table.commit([message("RACE", 3)], 3)  # a commit while the first listing is under way

    def second_listing() -> None:
        reader.stream_files("RACE")
        caught_up.set()

    second = threading.Thread(target=second_listing, name="second")
    second.start()
    first.join(10)
    second.join(10)
    table.close()
    assert [f.max_seq for f in reader.stream_files("RACE")] == [1, 2, 3]
    assert reader.read_range("RACE", 1, 3, BLOCK).column("seq").to_pylist() == [1, 2, 3]
