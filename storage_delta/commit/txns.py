"""The newest version of each app id (Delta ``txn`` actions) as of a table's version, kept as the
table's handles move on.

delta-rs answers ``DeltaTable.transaction_version`` by replaying the log from its last checkpoint
at every call: on an object store one GET per entry since the checkpoint (up to 100), at every
commit (its epoch check) and every lease read. Against moto two gateways' commits and lease reads
made most of the store's requests that way (70 % of them in a takeover; the store answered
everything else late). Entries never change once written, so the answer for a version is read
once here and brought forward entry by entry: one GET per new entry, the one delta-rs's own
catch-up of the handle makes too. What is read is kept with the handle (and goes with it).
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pyarrow.parquet as pq
from deltalake import DeltaTable

from storage_delta.commit.store import StoreRoot
from storage_delta.format.integrity import FETCH_AHEAD


def app_version(root: StoreRoot, table: str, dt: DeltaTable, app_id: str) -> int:
    """The newest version of ``app_id`` in the snapshot of ``dt`` (a handle of ``table`` under
    ``root``; 0: none), as ``dt.transaction_version`` answers it. Blocks (a worker thread's)."""
    key = id(dt)  # a DeltaTable is not hashable
    with _HANDLES_LOCK:
        held = _HANDLES.get(key)
        if held is None or held[0]() is not dt:
            gone = partial(_forget, key)
            held = _HANDLES[key] = (weakref.ref(dt, gone), AppVersions(root, table))
    return held[1].of(dt, app_id)


def note_commit(
    root: StoreRoot, table: str, dt: DeltaTable, version: int, txns: Iterable[tuple[str, int]]
) -> None:
    """The handle ``dt`` made the commit ``version`` with the app transactions ``txns`` and was
    brought to it: what it holds goes forward from memory, without reading back the entry just
    written (a HEAD and a GET of every commit on an object store, #19). Only from the version
    before it; otherwise the next :func:`app_version` reads as before."""
    key = id(dt)
    with _HANDLES_LOCK:
        held = _HANDLES.get(key)
        versions = held[1] if held is not None and held[0]() is dt else None
    if versions is None:
        versions = AppVersions(root, table)
        with _HANDLES_LOCK:
            _HANDLES[key] = (weakref.ref(dt, partial(_forget, key)), versions)
    versions.committed(version, txns)


def _forget(key: int, _ref: weakref.ref[DeltaTable]) -> None:
    """A handle is gone: so is what was read for it."""
    with _HANDLES_LOCK:
        held = _HANDLES.get(key)
        if held is not None and held[0]() is None:
            del _HANDLES[key]


class AppVersions:
    """The ``txn`` versions of one table as of one handle's versions. Thread-safe."""

    def __init__(self, root: StoreRoot, table: str) -> None:
        self._fs, base = root.filesystem()
        self._log = f"{base}/{table}/_delta_log"
        self._ahead = FETCH_AHEAD if root.local_path() is None else 1
        self._lock = threading.Lock()
        #: The version :attr:`_apps` is as of (-1: nothing read yet).
        self._version = -1
        self._apps: dict[str, int] = {}

    def of(self, dt: DeltaTable, app_id: str) -> int:
        """The newest version of ``app_id`` in ``dt``'s snapshot (0: none), as
        ``dt.transaction_version`` would answer it."""
        version = dt.version()
        with self._lock:
            if version != self._version:
                try:
                    self._move_to(version)
                except (OSError, ValueError, KeyError, TypeError, IndexError):
                    # an entry trimmed behind a checkpoint this reader did not start from, an
                    # older handle: delta-rs's own replay, this once
                    self._version = -1
                    return dt.transaction_version(app_id) or 0
            return self._apps.get(app_id, 0)

    def committed(self, version: int, txns: Iterable[tuple[str, int]]) -> None:
        """:func:`note_commit`: ``version`` is known to hold ``txns`` and no other app's."""
        with self._lock:
            if self._version == version - 1 and self._version >= 0:
                for app, v in txns:
                    self._apps[app] = v
                self._version = version

    def _move_to(self, version: int) -> None:
        if 0 <= self._version < version:
            # in place, not a copy of every app id per commit: a read that fails part way sets
            # the version to -1 (:meth:`of`), and the next ask reads afresh
            self._apply(self._apps, range(self._version + 1, version + 1))
            self._version = version
            return
        apps: dict[str, int] = {}
        start = self._read_checkpoint(apps, version)
        self._apply(apps, range(start + 1, version + 1))
        self._apps, self._version = apps, version

    def _read_checkpoint(self, apps: dict[str, int], version: int) -> int:
        """The ``txn`` actions of the newest checkpoint at or below ``version`` named by
        ``_last_checkpoint`` into ``apps``; its version (-1: none to start from)."""
        try:
            with self._fs.open_input_stream(f"{self._log}/_last_checkpoint") as fh:
                hint = json.loads(bytes(fh.read()))
        except FileNotFoundError:
            return -1
        checkpoint = int(hint["version"])
        if checkpoint > version:
            raise ValueError(f"checkpoint {checkpoint} is past version {version}")
        parts = int(hint.get("parts") or 0)
        names = (
            [f"{checkpoint:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, parts + 1)]
            if parts
            else [f"{checkpoint:020d}.checkpoint.parquet"]
        )
        for name in names:
            with self._fs.open_input_file(f"{self._log}/{name}") as fh:
                column = pq.read_table(fh, columns=["txn"]).column("txn")
            for txn in column.to_pylist():
                if txn is not None:
                    apps[str(txn["appId"])] = int(txn["version"])
        return checkpoint

    def _apply(self, apps: dict[str, int], versions: Iterable[int]) -> None:
        paths = [f"{self._log}/{version:020d}.json" for version in versions]
        if self._ahead > 1 and len(paths) > 1:
            # on an object store side by side: a handle read for the first time (a new gateway's
            # first tick, a writer's first fence) reads up to a checkpoint interval of entries
            with ThreadPoolExecutor(min(len(paths), self._ahead), thread_name_prefix="jetlake-txns") as pool:
                bodies = list(pool.map(self._entry, paths))
        else:
            bodies = [self._entry(path) for path in paths]
        for body in bodies:
            for line in body.splitlines():
                if b'"txn"' not in line:
                    continue
                txn = json.loads(line).get("txn")
                if txn is not None:  # the snapshot's is the last one (the log's order)
                    apps[str(txn["appId"])] = int(txn["version"])

    def _entry(self, path: str) -> bytes:
        with self._fs.open_input_stream(path) as fh:
            return bytes(fh.read())


#: Per live handle (by ``id``), what was read for it.
_HANDLES: dict[int, tuple[weakref.ref[DeltaTable], AppVersions]] = {}
_HANDLES_LOCK = threading.RLock()  # a handle may be collected while it is held
