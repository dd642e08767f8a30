"""``sync_interval`` and the helpers that put a commit on stable storage
(``storage_delta/commit/durable.py``). That the syncs are where they must be is shown by the power-cut
test (``tests/test_power_loss.py``), which drops every write that was not synced."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest

from gateway.runtime.settings import LOADER
from storage_delta.commit import deltalog, durable
from storage_delta.commit.durable import make_dirs, sync_interval_seconds
from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import MessageTable, StoredMessage
from storage_delta.format.settings import SettingsError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("always", None),
        ("ALWAYS", None),
        ("2m", 120.0),
        ("30s", 30.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("1.5s", 1.5),
        ("250us", 0.00025),
    ],
)
def test_sync_interval_is_always_or_a_go_duration(text: str, seconds: float | None) -> None:
    assert sync_interval_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "2", "2x", "-1s", "0s", "s", "1m2", "never"])
def test_other_sync_intervals_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="always"):
        sync_interval_seconds(text)


def test_the_gateway_setting_defaults_to_always_and_refuses_a_bad_duration() -> None:
    assert LOADER.load(environ={}).sync_seconds is None
    assert LOADER.load(environ={"JETLAKE_SYNC_INTERVAL": "2m"}).sync_seconds == 120.0
    with pytest.raises(SettingsError, match=r"sync_interval.*'2 minutes'"):
        LOADER.load(environ={"JETLAKE_SYNC_INTERVAL": "2 minutes"})


def test_make_dirs_names_the_directories_that_got_a_new_entry(tmp_path: Path) -> None:
    leaf = tmp_path / "t" / "stream=A" / "block=0"
    assert make_dirs(str(leaf)) == [str(leaf.parent), str(leaf.parent.parent), str(tmp_path)]
    assert leaf.is_dir()
    assert make_dirs(str(leaf)) == []
    assert make_dirs(str(leaf.parent / "block=1")) == [str(leaf.parent)]


def _one_message_commit(tmp_path: Path) -> MessageTable:
    table = MessageTable(StoreRoot(str(tmp_path / "store")))
    table.commit([StoredMessage("S", 1000, 1, 1, "s.x", None, b"one")], table.last_txn_version() + 1)
    return table


def test_a_log_entry_is_linked_only_after_the_files_it_names_and_itself_are_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The data files' syncs run on other threads while the entry is encoded, written and synced;
    the link waits for every one of them, however slow, and the log directory is synced after it.
    (Mutant: ``syncing`` not waiting for its syncs -> the link comes before the slow data file's
    sync ends.)"""
    events: list[tuple[str, str]] = []
    lock = threading.Lock()
    real_sync, real_link = durable.fsync_path, os.link

    def slow_sync(path: str) -> None:
        if path.endswith(".parquet"):
            time.sleep(0.2)  # a data file much slower to sync than the entry
        real_sync(path)
        with lock:
            events.append(("synced", path))

    def link(src: str, dst: str) -> None:
        with lock:
            events.append(("linked", dst))
        real_link(src, dst)

    table = _one_message_commit(tmp_path)  # the table and its first partition exist
    monkeypatch.setattr(durable, "fsync_path", slow_sync)
    monkeypatch.setattr(deltalog, "fsync_path", slow_sync)
    monkeypatch.setattr(os, "link", link)
    table.commit([StoredMessage("S", 1000, 2, 2, "s.x", None, b"two")], table.last_txn_version() + 1)
    table.close()

    linked = next(i for i, (kind, _) in enumerate(events) if kind == "linked")
    before = {path for kind, path in events[:linked] if kind == "synced"}
    (data_file,) = [p for p in before if p.endswith(".parquet")]
    assert os.path.dirname(data_file) in before  # its directory's entry for it
    assert any("_jetlake_staging" in p for p in before)  # the entry's own bytes
    log_dir = os.path.dirname(events[linked][1])
    assert events[linked + 1 :] == [("synced", log_dir)]


def test_a_failed_sync_of_a_data_file_links_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A data file that cannot be synced fails the commit before its entry is linked."""
    table = _one_message_commit(tmp_path)
    real_sync = durable.fsync_path

    def failing(path: str) -> None:
        if path.endswith(".parquet"):
            raise OSError(errno.EIO, "the disk failed")
        real_sync(path)

    monkeypatch.setattr(durable, "fsync_path", failing)
    log_dir = tmp_path / "store" / "messages" / "_delta_log"
    entries = sorted(log_dir.glob("*.json"))
    with pytest.raises(OSError, match="the disk failed"):
        table.commit([StoredMessage("S", 1000, 2, 2, "s.x", None, b"two")], table.last_txn_version() + 1)
    table.close()
    assert sorted(log_dir.glob("*.json")) == entries
