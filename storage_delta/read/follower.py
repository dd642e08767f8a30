"""Warm handles on the tables a planner consults again and again: a Spark streaming query asks for
the newest offset every few milliseconds while it is idle and plans a micro-batch right after.

Loading the ``messages`` table anew (its checkpoint and every commit since) for each of those calls
cost tens of milliseconds, several times per micro-batch, and most of a message's way from its
PubAck to a ``foreachBatch``. A :class:`StoreFollower` keeps one handle per table and brings it to the
newest version only when a commit has landed (:func:`~storage_delta.commit.store.catch_up`: one look
for the next commit file when none has), and derives the listings and the logical view again only
when their table's version moved.

On a local root the ``messages`` listing goes further: delta-rs brings a handle forward by
replaying every commit since the table's last checkpoint, tens of milliseconds per new commit on a
table of many files, once per micro-batch. The follower reads just the new commit files instead and
applies their ``add`` and ``remove`` actions to the listing it holds (:class:`LoggedFiles`); it
loads the table afresh only when it cannot (an entry trimmed before it was read, a protocol or
schema change).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from deltalake import DeltaTable

from storage_delta.commit.deltalog import commit_path
from storage_delta.commit.store import StoreRoot, catch_up, newest_version, open_existing, read_whole
from storage_delta.format import schema as sch
from storage_delta.maintenance.files import LiveFile, live_files_of
from storage_delta.tables.removals import StreamLogicalState, live_streams_of, stream_states_of


class LoggedFiles:
    """The ``messages`` table's live files on a local root, brought forward commit by commit.

    ``files[stream][log path]`` is what :func:`live_files_of` gives of the table at :attr:`version`;
    each newer commit file is read once and its actions applied. An ``add`` describes its file in
    full (partition values, size and the statistics ``file_stats`` wrote), so nothing else needs
    reading."""

    def __init__(self, log_dir: str, dt: DeltaTable) -> None:
        self.log_dir = log_dir
        self.version = dt.version()
        self.files: dict[str, dict[str, LiveFile]] = {}
        for f in live_files_of(dt):
            self.files.setdefault(f.stream, {})[f.log_path] = f

    def advance(self) -> bool:
        """Apply the commits that landed since :attr:`version`; False when one cannot be (its
        entry trimmed meanwhile, or it changes the protocol or the schema): load the table anew."""
        newest = newest_version(self.log_dir, self.version)
        while self.version < newest:
            try:
                with open(commit_path(self.log_dir, self.version + 1), "rb") as fh:
                    actions = [json.loads(line) for line in fh if line.strip()]
            except FileNotFoundError:
                return False
            if any("protocol" in a or "metaData" in a for a in actions):
                return False
            for action in actions:
                if "remove" in action:
                    self._remove(action["remove"])
                elif "add" in action:
                    f = _live_file(action["add"])
                    self.files.setdefault(f.stream, {})[f.log_path] = f
            self.version += 1
        return True

    def _remove(self, remove: dict[str, Any]) -> None:
        stream = (remove.get("partitionValues") or {}).get("stream")
        for files in [self.files.get(stream, {})] if stream is not None else list(self.files.values()):
            files.pop(remove["path"], None)


def _live_file(add: dict[str, Any]) -> LiveFile:
    """A ``LiveFile`` from a commit's ``add`` action, as delta-rs describes the same file."""
    stats = json.loads(add.get("stats") or "{}")
    low, high = stats.get("minValues") or {}, stats.get("maxValues") or {}
    values = add["partitionValues"]
    return LiveFile(
        stream=values["stream"],
        block=int(values["block"]),
        log_path=add["path"],
        size=int(add["size"]),
        min_seq=low.get("seq"),
        max_seq=high.get("seq"),
        min_ts=low.get("ts"),
        max_ts=high.get("ts"),
        rows=stats.get("numRecords"),
    )


class StoreFollower:
    """The newest live files of a stream and the logical view of every stream, kept warm.

    Not thread-safe and not picklable (it holds delta-rs handles): one per planning process. A
    one-shot reader makes one and drops it, which costs what a plain load costs.
    """

    def __init__(self, root: StoreRoot) -> None:
        self.root = root
        self._handles: dict[str, DeltaTable] = {}
        #: (stream, messages version) → that version's live files of the stream
        self._files: tuple[tuple[str, int], list[LiveFile]] | None = None
        #: (catalog version, removals version) → the logical view at those versions
        self._states: tuple[tuple[int, int], dict[str, StreamLogicalState]] | None = None
        #: On a local root: the ``messages`` listing kept from the commit files
        self._logged: LoggedFiles | None = None

    def _newest(self, name: str) -> DeltaTable | None:
        dt = self._handles.get(name)
        if dt is not None:
            catch_up(dt)
            return dt
        dt = open_existing(self.root, name)
        if dt is not None:
            self._handles[name] = dt
        return dt

    def files(self, stream: str) -> list[LiveFile]:
        """The stream's live files at the ``messages`` table's newest version, ordered by block,
        lowest sequence and path."""
        logged = self._logged_files()
        if logged is not None:
            key = (stream, logged.version)
            if self._files is None or self._files[0] != key:
                self._files = (key, _ordered(logged.files.get(stream, {}).values()))
            return self._files[1]
        dt = self._newest(sch.MESSAGES)
        if dt is None:
            return []
        key = (stream, dt.version())
        if self._files is None or self._files[0] != key:
            self._files = (key, _ordered(live_files_of(dt, stream)))
        return self._files[1]

    def _logged_files(self) -> LoggedFiles | None:
        """On a local root with a ``messages`` table: its listing, brought to the newest version."""
        local = self.root.local_path()
        if local is None:
            return None
        if self._logged is not None and self._logged.advance():
            return self._logged
        dt = open_existing(self.root, sch.MESSAGES)
        log_dir = os.path.join(local, sch.MESSAGES, "_delta_log")
        self._logged = None if dt is None else LoggedFiles(log_dir, dt)
        return self._logged

    def removals_version(self) -> int:
        """The removal log's newest version (-1: no log yet)."""
        dt = self._newest(sch.REMOVALS)
        return -1 if dt is None else dt.version()

    def states(self) -> dict[str, StreamLogicalState]:
        """Every live stream's logical state at the catalog's and the removal log's newest versions.
        Called after :meth:`files`, so every listed row's removal is already known."""
        catalog = self._newest(sch.CATALOG)
        removals = self._newest(sch.REMOVALS)
        key = (-1 if catalog is None else catalog.version(), -1 if removals is None else removals.version())
        if self._states is None or self._states[0] != key:
            # Every file checked, as a job reads them: a damaged one raises DamagedFile rather than
            # let a deleted stream or removed messages show again.
            root = self.root
            names = None if catalog is None else read_whole(root, catalog, sch.CATALOG, sch.CATALOG_SCHEMA)
            live = {} if names is None else live_streams_of(names)
            rows = None if removals is None else read_whole(root, removals, sch.REMOVALS, sch.REMOVALS_SCHEMA)
            self._states = (key, stream_states_of(live, rows))
        return self._states[1]


def _ordered(files: Iterable[LiveFile]) -> list[LiveFile]:
    """Files in one order whichever way they were listed (delta-rs's order is its replay's)."""
    return sorted(files, key=lambda f: (f.block, f.min_seq is None, f.min_seq or 0, f.log_path))
