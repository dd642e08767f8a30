"""A checkpoint carried forward from the previous one and the entries since
(storage_delta/commit/incremental.py, #23): it holds what delta-rs's checkpoint of the same version
holds (less the merges' tombstones, as jetlake's always did), every reader loads the same table
from it, and whatever it does not handle is left to delta-rs."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from storage_delta.commit import checkpoint as ckpt
from storage_delta.commit import incremental
from storage_delta.commit.incremental import Unsupported, carried_checkpoint
from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import MessageTable, StoredMessage
from storage_delta.format import schema as sch
from storage_delta.format.integrity import checkpoint_digest_path
from storage_delta.maintenance.files import live_files, swap_files
from storage_delta.maintenance.recent import Compaction
from storage_delta.tables.repair import check_at_start

#: ``alone``: hundreds of synced one-message commits; beside another process they slow both.
pytestmark = pytest.mark.alone

HOUR_MS = 3_600_000


def message(stream: str, seq: int, origin: tuple[str, int] | None = None) -> StoredMessage:
    return StoredMessage(
        stream, 1000, seq, 1_700_000_000_000_000_000 + seq, "s.x", None, b"m%d" % seq, origin
    )


def table_path(root: StoreRoot) -> str:
    return os.path.join(root.uri, sch.MESSAGES)


def newest_checkpoint(path: str) -> tuple[int, list[dict[str, Any]]]:
    log_dir = os.path.join(path, "_delta_log")
    pointer = json.loads(Path(log_dir, "_last_checkpoint").read_text())
    version = int(pointer["version"])
    actions = pq.read_table(os.path.join(log_dir, f"{version:020d}.checkpoint.parquet")).to_pylist()
    return version, actions


def state(actions: list[dict[str, Any]]) -> dict[str, Any]:
    """What a checkpoint says, independent of row order: protocol, metaData, live files, data
    tombstones (the fields a reader or the vacuum uses) and app transactions. A path or an app id
    twice is a checkpoint no reader can trust."""
    by_kind: dict[str, Any] = {"protocol": [], "metaData": [], "add": {}, "remove": {}, "txn": {}}
    for row in actions:
        for kind, body in row.items():
            if body is None or kind not in by_kind:
                continue
            key = body.get("appId") if kind == "txn" else body.get("path")
            assert key is None or key not in by_kind[kind], f"{kind} {key} twice"
            if kind == "add":
                by_kind["add"][body["path"]] = body
            elif kind == "remove":
                keep = ("dataChange", "deletionTimestamp", "size", "partitionValues")
                by_kind["remove"][body["path"]] = {k: body[k] for k in keep}
            elif kind == "txn":
                by_kind["txn"][body["appId"]] = body["version"]
            else:
                by_kind[kind].append(body)
    return by_kind


def written_by_delta_rs(path: str, scratch: Path) -> dict[str, Any]:
    """delta-rs's checkpoint of the table's newest version, in a copy of it, as jetlake's delta-rs
    path leaves it (no merge tombstones)."""
    copy = scratch / "copy"
    shutil.copytree(path, copy)
    for name in os.listdir(copy / "_delta_log"):
        if "checkpoint" in name:
            os.unlink(copy / "_delta_log" / name)
    DeltaTable(str(copy)).create_checkpoint()
    _, actions = newest_checkpoint(str(copy))
    out = state(actions)
    out["remove"] = {p: r for p, r in out["remove"].items() if r["dataChange"]}
    return out


def grow(table: MessageTable, root: StoreRoot, seqs: range, compaction: Compaction) -> None:
    """One-message commits to two streams (the second's carrying a source position), merged by
    the compaction every four."""
    for seq in seqs:
        table.commit([message("S", seq), message("T", seq, origin=("src", seq))], seq)
        if seq % 4 == 0:
            compaction.round({"S": 0, "T": 0}, 4, 1 << 30)


def no_delta_rs_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(self: DeltaTable) -> None:
        raise AssertionError("delta-rs made the checkpoint")

    monkeypatch.setattr(DeltaTable, "create_checkpoint", refused)


def test_a_carried_checkpoint_holds_what_delta_rs_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over a first checkpoint (delta-rs's), one-message commits to two streams, the compaction's
    merges, a retention rewrite (a data tombstone), a removal whose tombstone has expired and a
    source position: the next checkpoint, carried, holds the same protocol, metaData, live files
    (every field), data tombstones and app transactions as delta-rs's of the same version; the
    table loads from it with the same files and rows, and the start check finds it whole."""
    root = StoreRoot(str(tmp_path / "store"))
    table = MessageTable(root, checkpoint_every=10**9)
    compaction = Compaction(root)
    grow(table, root, range(1, 41), compaction)
    table._appender.hygiene()  # the first checkpoint: delta-rs's (there is none to carry)
    grow(table, root, range(41, 101), compaction)
    oldest = min(live_files(root, "S"), key=lambda f: f.min_seq or 0)
    assert swap_files(root, [oldest], [], data_change=True)
    gone = min(live_files(root, "T"), key=lambda f: f.min_seq or 0)
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() - 2 * HOUR_MS / 1000)
    assert swap_files(root, [gone], [], data_change=True)  # its tombstone expired an hour ago
    monkeypatch.undo()
    grow(table, root, range(101, 121), compaction)
    path = table_path(root)
    expected = written_by_delta_rs(path, tmp_path)
    no_delta_rs_checkpoint(monkeypatch)
    table._appender.hygiene()
    version, actions = newest_checkpoint(path)
    assert version == DeltaTable(path).version()
    got = state(actions)
    assert got == expected
    assert oldest.log_path in got["remove"]
    assert gone.log_path not in got["remove"]
    assert got["txn"]["src"] == 120
    assert len(got["add"]) < 40
    pointer = json.loads(Path(path, "_delta_log", "_last_checkpoint").read_text())
    assert pointer["size"] == len(actions)
    assert pointer["numOfAddFiles"] == len(got["add"])
    loaded, replayed = DeltaTable(path), DeltaTable(str(tmp_path / "copy"))
    assert sorted(loaded.file_uris()) != []
    assert sorted(Path(u).name for u in loaded.file_uris()) == sorted(
        Path(u).name for u in replayed.file_uris()
    )
    seqs = sorted(loaded.to_pyarrow_table(columns=["seq"]).column("seq").to_pylist())
    assert seqs == sorted(replayed.to_pyarrow_table(columns=["seq"]).column("seq").to_pylist())
    assert check_at_start(root).problems == []
    table.close()


def test_a_carried_checkpoint_drops_tombstones_as_they_expire(tmp_path: Path) -> None:
    """A data tombstone in the previous checkpoint leaves the next one once the table's
    ``deletedFileRetentionDuration`` (an hour) has passed since its removal, and not before."""
    root = StoreRoot(str(tmp_path))
    table = MessageTable(root, checkpoint_every=10**9)
    table.commit([message("S", 1)], 1)
    table.commit([message("S", 2)], 2)
    assert swap_files(root, live_files(root, "S")[:1], [], data_change=True)
    table._appender.hygiene()
    table.commit([message("S", 3)], 3)
    path = table_path(root)
    base, _ = newest_checkpoint(path)
    now = int(time.time() * 1000)
    soon = state(carried_checkpoint(path, base, base + 1, now).to_pylist())
    later = state(carried_checkpoint(path, base, base + 1, now + HOUR_MS + 60_000).to_pylist())
    assert len(soon["remove"]) == 1
    assert later["remove"] == {}
    assert soon["add"] == later["add"]
    assert len(later["add"]) == 2
    table.close()


def checkpointed_once(tmp_path: Path) -> tuple[StoreRoot, MessageTable, str, int]:
    """A table of one message with its first checkpoint (delta-rs's): the root, the writer, the
    table's path and the checkpoint's version."""
    root = StoreRoot(str(tmp_path))
    table = MessageTable(root, checkpoint_every=10**9)
    table.commit([message("S", 1)], 1)
    table._appender.hygiene()
    path = table_path(root)
    base, _ = newest_checkpoint(path)
    return root, table, path, base


def test_what_it_does_not_handle_is_left_to_delta_rs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A metaData change since the previous checkpoint, and a previous checkpoint that does not
    match its digest: the carried checkpoint declines, and delta-rs's checkpoint is written
    instead (it holds the change)."""
    root, table, path, base = checkpointed_once(tmp_path)
    digest = checkpoint_digest_path(path, base)
    good = Path(digest).read_text()
    Path(digest).write_text("00000000")
    with pytest.raises(Unsupported, match="digest"):
        carried_checkpoint(path, base, base, 0)
    Path(digest).write_text(good)
    DeltaTable(path).alter.set_table_properties({"delta.appendOnly": "false"})
    table.commit([message("S", 2)], 2)
    version = DeltaTable(path).version()
    with pytest.raises(Unsupported, match="metaData"):
        carried_checkpoint(path, base, version, 0)
    made = []
    real = DeltaTable.create_checkpoint

    def counted(self: DeltaTable) -> None:
        made.append(self.version())
        real(self)

    monkeypatch.setattr(DeltaTable, "create_checkpoint", counted)
    ckpt.checkpoint_local(root, sch.MESSAGES, version)
    assert made == [version]
    _, actions = newest_checkpoint(path)
    assert dict(state(actions)["metaData"][0]["configuration"])["delta.appendOnly"] == "false"
    table.close()


@pytest.mark.parametrize(
    "line",
    [
        b'{"add":{"size":1}}',
        b'{"add":{"path":"p","size":"big","partitionValues":{}}}',
        b"[1]",
        b'{"a":1,"b":2}',
    ],
)
def test_an_entry_that_is_not_delta_s_is_left_to_delta_rs(tmp_path: Path, line: bytes) -> None:
    """An entry without digests (another writer's) whose line parses but is no action as Delta
    writes it: the carried checkpoint declines (delta-rs judges it), it does not fail the round."""
    _, table, path, base = checkpointed_once(tmp_path)
    Path(path, "_delta_log", f"{base + 1:020d}.json").write_bytes(b'{"commitInfo":{}}\n' + line + b"\n")
    with pytest.raises(Unsupported):
        carried_checkpoint(path, base, base + 1, 0)
    table.close()


def test_the_tombstone_retention_is_read_as_delta_writes_it() -> None:
    assert (
        incremental.tombstone_retention_ms({"delta.deletedFileRetentionDuration": "interval 1 hours"})
        == HOUR_MS
    )
    assert (
        incremental.tombstone_retention_ms({"delta.deletedFileRetentionDuration": "interval 2 days"})
        == 48 * HOUR_MS
    )
    assert incremental.tombstone_retention_ms({}) == incremental.DEFAULT_TOMBSTONE_RETENTION_MS
    with pytest.raises(Unsupported):
        incremental.tombstone_retention_ms({"delta.deletedFileRetentionDuration": "1 hour"})
