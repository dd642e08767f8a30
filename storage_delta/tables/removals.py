"""The ``removals`` table: which sequences of a stream are gone from its logical view.

JetStream removes messages at once (deletes, purges, limits, TTL, acked work-queue messages); jetlake
makes them invisible at once and records each removal here as a sequence range, so a restarted
gateway, the Spark data source and the retention job all see the same stream. Physical removal from
``messages`` comes later (Spark). Rows are append-only; a stream incarnation is identified by its
``created`` time (a stream deleted and created again under the same name starts over), and rows of
``messages`` stored before that time belong to an earlier incarnation. docs/storage.md has the schema.

The gateway appends a file every few seconds, so the table is compacted by a job
(:func:`compact_removals`): every live stream's ranges merged into one file, which changes no
:func:`load_stream_states` answer.
"""

from __future__ import annotations

import json
import math
import threading
import time
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.transaction import RemoveAction

from storage_delta.commit.append import TableSpec, WriterTable
from storage_delta.commit.checkpoint import checkpoint_table
from storage_delta.commit.deltalog import LogEntries, commit_path
from storage_delta.commit.owner import StreamEpochs, commit_without_fenced
from storage_delta.commit.store import (
    StoreRoot,
    catch_up,
    open_existing,
    open_version,
    read_checked,
    read_whole,
    write_data_file,
)
from storage_delta.format import schema as sch
from storage_delta.format.integrity import read_verified
from storage_delta.maintenance.files import delete_unreferenced, removes_of, swap_actions

APP_ID = "jetlake-removals"
REMOVALS_TABLE = TableSpec(sch.REMOVALS, sch.REMOVALS_SCHEMA)


@dataclass(frozen=True, slots=True)
class Removal:
    """Sequences ``first..last`` (inclusive) of stream incarnation (``stream``, ``created``) are removed."""

    stream: str
    created: int
    first: int
    last: int


@dataclass(slots=True)
class StreamLogicalState:
    """What the removal log says about one live stream: merged removed ranges, ascending.

    ``floor`` is the lowest sequence not covered by a removal from 1 (every sequence below it is
    gone); ``last_seq`` is the highest sequence any removal covers (the stream's last sequence is at
    least this, even when storage no longer holds the message).
    """

    stream: str
    created: int
    removed: list[tuple[int, int]] = field(default_factory=list)

    @property
    def floor(self) -> int:
        if self.removed and self.removed[0][0] <= 1:
            return self.removed[0][1] + 1
        return 1

    @property
    def last_seq(self) -> int:
        return self.removed[-1][1] if self.removed else 0

    def is_removed(self, seq: int) -> bool:
        i = bisect_right(self.removed, (seq, float("inf"))) - 1
        return i >= 0 and self.removed[i][0] <= seq <= self.removed[i][1]


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, overlapping or adjacent ranges joined."""
    out: list[tuple[int, int]] = []
    for first, last in sorted(ranges):
        if out and first <= out[-1][1] + 1:
            if last > out[-1][1]:
                out[-1] = (out[-1][0], last)
        else:
            out.append((first, last))
    return out


class RemovalLog(WriterTable):
    """Blocking access to the ``removals`` table; callers run it on a worker thread."""

    SPEC = REMOVALS_TABLE
    APP_ID = APP_ID

    def __init__(self, root: StoreRoot, streams: StreamEpochs | None = None) -> None:
        super().__init__(root, streams=streams)
        self._version = self._appender.committed_version()

    def append(self, removals: list[Removal]) -> frozenset[str]:
        """Make removals durable in one commit (txn ``(jetlake-removals, n)`` lands it once).
        Fenced per stream, the removals of streams a newer owner holds are left out; returns
        those streams."""
        if not removals:
            return frozenset()
        self._version += 1
        if not self.per_stream:
            self._appender.append([({}, self._rows(removals))], self._version)
            return frozenset()

        def attempt(left_out: frozenset[str]) -> None:
            kept = [r for r in removals if r.stream not in left_out]
            if kept:
                streams = {r.stream for r in kept}
                self._appender.append([({}, self._rows(kept))], self._version, streams=streams)

        return commit_without_fenced(attempt)

    @staticmethod
    def _rows(removals: list[Removal]) -> pa.Table:
        now = time.time_ns()
        return pa.table(
            {
                "stream": [r.stream for r in removals],
                "created": [r.created for r in removals],
                "first": [r.first for r in removals],
                "last": [r.last for r in removals],
                "ts": [now] * len(removals),
            },
            schema=sch.REMOVALS_SCHEMA,
        )


#: The columns of the catalog and of the removal log that the logical view is made from.
CATALOG_COLUMNS = ["rev", "kind", "name", "deleted", "body"]
REMOVAL_COLUMNS = ["stream", "created", "first", "last"]


def live_streams(root: StoreRoot, skip_damaged: bool = False) -> dict[str, int]:
    """Live stream name → created time, from the catalog (newest row per stream, not deleted). A
    damaged catalog file raises :class:`DamagedFile`: a job must not take a stream whose deletion
    it cannot read for live, nor one whose creation it cannot read for gone. ``skip_damaged``
    reads the whole files only (``jetlake repair``, which drops the damaged ones)."""
    dt = open_existing(root, sch.CATALOG)
    if dt is None:
        return {}
    if skip_damaged:
        return live_streams_of(read_checked(root, dt, sch.CATALOG, sch.CATALOG_SCHEMA)[0])
    return live_streams_of(read_whole(root, dt, sch.CATALOG, sch.CATALOG_SCHEMA))


def live_streams_of(catalog: pa.Table) -> dict[str, int]:
    """:func:`live_streams` of the catalog's rows (:data:`CATALOG_COLUMNS`)."""
    return {name: int(body["created"]) for name, body in _live_stream_bodies(catalog).items()}


class PlacedStream(NamedTuple):
    """What the meta owner places a stream by (per-stream ownership): its ``num_replicas`` (at
    least 1) and its local origins, the names of the streams it mirrors or sources in this store
    (not through an ``external`` API prefix), which it is placed with."""

    num_replicas: int
    origins: tuple[str, ...]

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> PlacedStream:
        """From a stream's config as the catalog holds it."""
        mirror = config.get("mirror")
        copied = [mirror] if mirror else list(config.get("sources") or ())
        origins = tuple(sorted({str(c["name"]) for c in copied if not c.get("external")}))
        return cls(max(1, int(config.get("num_replicas") or 1)), origins)


class StreamReplicas:
    """Live stream name → its :class:`PlacedStream`: what the meta owner places over the
    gateways (per-stream ownership), every tick. Kept from one call to the next: a call catches
    a handle up and, when the catalog's version moved, reads only the files added since (the
    catalog's rows are only ever appended; a stream's newest row by ``rev`` wins whichever file
    holds it); when a file went (a compaction's swap, a repair), the whole snapshot again. So a
    tick costs a look at the log, not a read of every stream's rows (which grew with the
    streams), and only the streams whose newest row changed are parsed again. A damaged
    catalog file's rows are left out: a stream they alone name is placed on no gateway, and the
    meta owner answers it as offline (its quarantine, read at its start); a stream with older
    rows elsewhere is placed, and its claim finds it offline. Blocking."""

    def __init__(self, root: StoreRoot) -> None:
        self.root = root
        self._dt: DeltaTable | None = None
        self._version = -1
        self._files: set[str] = set()
        #: Per stream, its newest row: (rev, deleted, body).
        self._newest: dict[str, tuple[int, bool, str]] = {}
        self._replicas: dict[str, PlacedStream] = {}
        self._lock = threading.Lock()  # the meta owner's ticks and the follower's
        #: The catalog's log entries (False: an object store whose commits delta-rs makes).
        self._entries: LogEntries | Literal[False] | None = None
        #: The version whose next entry was missing at the last look of the log, and when
        #: (monotonic): a view that did not take that version in (its fold failed) looks again.
        self._looked: tuple[int, float] = (-1, -math.inf)

    def read(self) -> dict[str, PlacedStream]:
        with self._lock:
            return self._read()

    def _read(self) -> dict[str, PlacedStream]:
        followed = self._follow_log()
        if followed is not None:
            version, adds = followed
            if version == self._version:
                return self._replicas
            self._files.update(str(a["path"]) for a in adds)
            return self._fold(adds, version, self._files, False)
        if self._dt is None:
            self._dt = open_existing(self.root, sch.CATALOG)
            if self._dt is None:
                return {}
        else:
            catch_up(self._dt)
        dt = self._dt
        if dt.version() == self._version:
            return self._replicas
        # the paths alone of every file (one per catalog commit, never compacted), the whole
        # add actions only of the new ones: a dict per file each tick grew with the commits
        actions = pa.table(dt.get_add_actions(flatten=True))
        paths = actions.column("path").to_pylist()
        files = set(paths)
        reset = not self._files <= files  # rows went with a file: start again from the snapshot
        known = set() if reset else self._files
        added = pa.array([i for i, path in enumerate(paths) if path not in known], pa.int64())
        fresh = actions.take(added).to_pylist()  # none: a commit without files (a claim's fence)
        return self._fold(fresh, dt.version(), files, reset)

    def _follow_log(self) -> tuple[int, list[dict[str, Any]]] | None:
        """After a first read: the newest version and the files its commits since this view's
        added, from the log's entries themselves, a read of each and one of the next version
        (:meth:`StoreRoot.log_entries`); None when the snapshot must be read (an object store
        without jetlake's own commit, a file removed, the log trimmed past this view's version).
        A delta-rs handle brought up to date replayed the log from its checkpoint, 90 ms a tick
        with 10,000 files (#23), and on an object store listed the log and read its
        ``_last_checkpoint`` every tick of every gateway."""
        if self._version < 0:
            return None
        if self._entries is None:
            self._entries = self.root.log_entries(sch.CATALOG) or False
        if self._entries is False:
            return None
        version, adds = self._version, []
        while (entry := self._entries.read(version + 1)) is not None:
            for line in entry.splitlines():
                try:
                    action = json.loads(line) if line.strip() else {}
                except ValueError:  # a damaged entry: delta-rs's load says what it makes of it
                    return None
                if "remove" in action:
                    return None
                if (add := action.get("add")) is not None:
                    adds.append({**add, "path": unquote(add["path"])})
            version += 1
        # entries are only ever trimmed from the oldest up to a checkpoint, those older than the
        # retention: none after this view's version may mean they were, not that nothing landed,
        # unless that entry was missing at the last look too, less than a retention ago
        now = time.monotonic()
        if (
            version == self._version
            and (self._looked[0] != version or now - self._looked[1] >= self.root.log_retention_s)
            and self._entries.trimmed(version + 1)
        ):
            return None
        self._looked = (version, now)
        return version, adds

    def _fold(
        self, fresh: list[dict[str, Any]], version: int, files: set[str], reset: bool
    ) -> dict[str, PlacedStream]:
        """Fold the rows of the files ``fresh`` into the view (``reset``: into an empty one)."""
        assert self._dt is not None
        replicas = {} if reset else dict(self._replicas)  # a caller may hold the last answer
        if reset:
            self._newest = {}
        rows, _ = read_checked(self.root, self._dt, sch.CATALOG, sch.CATALOG_SCHEMA, fresh)
        # only the streams whose newest row changed are parsed again (all of them each tick
        # took a JSON parse per stream, on a thread holding the GIL beside the event loop)
        for name in _newest_stream_rows(rows, self._newest):
            _, deleted, body = self._newest[name]
            if deleted:
                replicas.pop(name, None)
            else:
                replicas[name] = PlacedStream.of(json.loads(body)["config"])
        self._files, self._version, self._replicas = files, version, replicas
        return replicas


def _newest_stream_rows(catalog: pa.Table, newest: dict[str, tuple[int, bool, str]]) -> set[str]:
    """Fold the catalog's rows ``catalog`` into ``newest``: per stream, its newest stream row
    by ``rev`` (rev, deleted, body). Returns the streams whose newest row this changed."""
    changed: set[str] = set()
    for rev, kind, name, deleted, body in zip(
        *(catalog.column(c).to_pylist() for c in CATALOG_COLUMNS), strict=True
    ):
        if kind == "stream" and (name not in newest or newest[name][0] < rev):
            newest[name] = (rev, deleted, body)
            changed.add(name)
    return changed


def _live_stream_bodies(catalog: pa.Table) -> dict[str, dict[str, Any]]:
    """Each live stream's newest catalog body (its ``created`` and ``config``)."""
    newest: dict[str, tuple[int, bool, str]] = {}
    _newest_stream_rows(catalog, newest)
    return {name: json.loads(body) for name, (_, deleted, body) in newest.items() if not deleted}


def load_stream_states(root: StoreRoot) -> dict[str, StreamLogicalState]:
    """The logical state of every live stream (streams with no removals included, with none). A
    damaged file of either table raises :class:`DamagedFile` (the jobs and the Spark source stop
    until ``jetlake repair``: without a removal's row its messages would count as live)."""
    live = live_streams(root)
    dt = open_existing(root, sch.REMOVALS)
    return stream_states_of(
        live, None if dt is None else read_whole(root, dt, sch.REMOVALS, sch.REMOVALS_SCHEMA)
    )


def stream_states_of(live: Mapping[str, int], removals: pa.Table | None) -> dict[str, StreamLogicalState]:
    """:func:`load_stream_states` of the live streams and the removal log's rows
    (:data:`REMOVAL_COLUMNS`; None: no removal log yet)."""
    states = {name: StreamLogicalState(name, created) for name, created in live.items()}
    if removals is None:
        return states
    ranges: dict[str, list[tuple[int, int]]] = {}
    for stream, created, first, last in zip(
        *(removals.column(c).to_pylist() for c in REMOVAL_COLUMNS), strict=True
    ):
        if live.get(stream) == created:
            ranges.setdefault(stream, []).append((first, last))
    for stream, found in ranges.items():
        states[stream].removed = merge_ranges(found)
    return states


def removals_version(root: StoreRoot) -> int:
    """The removal log's newest version (-1: no log yet)."""
    dt = open_existing(root, sch.REMOVALS)
    return -1 if dt is None else dt.version()


def recorded_at(root: StoreRoot, version: int) -> pa.Table:
    """Every row of the removal log's ``version`` (none for -1)."""
    dt = None if version < 0 else open_version(root, sch.REMOVALS, version)
    return (
        sch.REMOVALS_SCHEMA.empty_table()
        if dt is None
        else read_whole(root, dt, sch.REMOVALS, sch.REMOVALS_SCHEMA)
    )


def recorded_between(root: StoreRoot, after: int, through: int) -> pa.Table:
    """The rows the removal log gained in versions ``after`` + 1 to ``through``: the files those
    commits add as a change of data (a fold adds its file with ``dataChange`` false: no removal).
    Read from the log entries themselves, which the log keeps for its retention (``log_retention_ms``,
    :mod:`storage_delta.commit.checkpoint`)."""
    fs, base = root.filesystem()
    log_dir = f"{base}/{sch.REMOVALS}/_delta_log"
    parts = [sch.REMOVALS_SCHEMA.empty_table()]
    for version in range(after + 1, through + 1):
        with fs.open_input_stream(commit_path(log_dir, version)) as fh:
            lines = fh.read().decode().splitlines()
        for line in lines:
            add = json.loads(line).get("add") if line.strip() else None
            if add is not None and add.get("dataChange", True):
                full = f"{base}/{sch.REMOVALS}/{unquote(add['path'])}"
                parts.append(read_verified(fs, full, None, sch.REMOVALS_SCHEMA))
    return pa.concat_tables(parts)


def fold_removals(table: pa.Table, live: Mapping[str, int]) -> pa.Table:
    """The rows of ``table`` (the removals schema) that :func:`load_stream_states` would use, each
    live stream's ranges merged; a merged row keeps the newest ``ts`` of the rows it stands for.
    Rows of deleted streams and earlier incarnations are left out: no reader counts them, and an
    incarnation that is gone never comes back (a new one has a new ``created``)."""
    rows: dict[str, tuple[list[tuple[int, int]], int]] = {}
    for stream, created, first, last, ts in zip(
        *(table.column(c).to_pylist() for c in ("stream", "created", "first", "last", "ts")), strict=True
    ):
        if live.get(stream) == created:
            ranges, newest = rows.get(stream, ([], 0))
            ranges.append((first, last))
            rows[stream] = (ranges, max(newest, ts))
    out = [
        (stream, live[stream], first, last, newest)
        for stream, (ranges, newest) in sorted(rows.items())
        for first, last in merge_ranges(ranges)
    ]
    columns = [list(c) for c in zip(*out, strict=True)] if out else [[] for _ in sch.REMOVALS_SCHEMA]
    return pa.table(columns, schema=sch.REMOVALS_SCHEMA)


@dataclass(frozen=True, slots=True)
class RemovalCompaction:
    """What :func:`compact_removals` did: the table's files and rows before and after (equal when
    it found nothing to do or gave way to another compaction)."""

    files_before: int
    files_after: int
    rows_before: int
    rows_after: int


def compact_removals(root: StoreRoot) -> RemovalCompaction:
    """Replace the files of the ``removals`` table by one holding the folded rows, in one commit.

    Safe beside a gateway that keeps appending: the commit removes exactly the files it read (an
    append made meanwhile is a new file and stays), so every snapshot, before or after, gives the
    same :func:`load_stream_states`. The commit is the jobs' swap
    (:func:`storage_delta.maintenance.swap_actions`): it gives way, deleting its file, when another
    compaction removed the same files first; the gateway's ``RemovalLog`` retries an append that
    lands after it (delta-rs #3890). A checkpoint follows, so a reader replays a short log."""
    dt = open_existing(root, sch.REMOVALS)
    if dt is None:
        return RemovalCompaction(0, 0, 0, 0)
    files = pa.table(dt.get_add_actions(flatten=True))
    table = read_whole(root, dt, sch.REMOVALS, sch.REMOVALS_SCHEMA)  # a damaged file stops it
    # The catalog is read after the snapshot, so it knows every incarnation with rows in it.
    folded = fold_removals(table, live_streams(root))
    unchanged = RemovalCompaction(files.num_rows, files.num_rows, table.num_rows, table.num_rows)
    if files.num_rows <= 1 and folded.num_rows == table.num_rows:
        return unchanged
    # The fold records no removal (``dataChange`` false): a change feed that follows the log's new
    # rows (:func:`recorded_between`, Delta's own streaming source) skips it.
    removes = [
        RemoveAction(r.path, False, r.deletion_timestamp, r.size, r.partition_values)
        for r in removes_of(files)
    ]
    adds = (
        [replace(write_data_file(root, sch.REMOVALS, {}, folded), data_change=False)]
        if folded.num_rows
        else []
    )
    if not swap_actions(root, sch.REMOVALS, sch.REMOVALS_SCHEMA, [], removes, adds):
        delete_unreferenced(root, adds, sch.REMOVALS)
        return unchanged
    dt = open_existing(root, sch.REMOVALS)
    if dt is not None:
        checkpoint_table(root, dt, sch.REMOVALS)
    return RemovalCompaction(files.num_rows, len(adds), table.num_rows, folded.num_rows)
