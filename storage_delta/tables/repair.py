"""Finding and dropping damaged files of jetlake's tables (``jetlake repair``, and the gateway's start).

What is damaged is found by :mod:`storage_delta.format.integrity`. What repair does, per kind:

* a checkpoint: set aside (moved to ``<table>/_jetlake_quarantine/``, ``_last_checkpoint`` dropped
  when it names it), so readers replay the JSON log entries instead; nothing is lost while those
  entries are still there (they expire after ``delta.logRetentionDuration``, 30 days). The gateway
  does this by itself at start: a checkpoint is derived data, like an index snapshot;
* a log entry: rewritten in place with its whole lines and the damaged lines that can be made
  again exactly (:class:`EntryRewrite`: from what survives of them, or an ``add`` cut before it named
  its file from its digest and the file no version names); a version cannot be removed, readers
  need every version after the last checkpoint. A dropped ``add`` line's file is no longer part of
  the table: its rows are lost, and which they were is unknown unless the line's start survived.
  An entry the gateway already set aside at start (``storage_delta.tables.unresolved``) is
  rewritten: repair records what its dropped lines still say and removes its marker;
* a data file of ``catalog`` or ``removals``: removed like any other; the dry run says which
  streams it concerned (``storage_delta.tables.scope``) and what dropping it does to them;
* a data file: removed with a Delta commit (``remove`` actions, the jobs' swap), so every reader
  reads the table again; for ``messages`` the file's sequence range is recorded in ``removals``, so
  the stream shows it as deleted (interior deletes, or a first sequence that moved) and keeps its
  last sequence: nothing is numbered again.

Run it with the gateway stopped (it appends to ``removals`` under the gateway's app id). Local store
roots only: on an object store a PUT is whole or absent, and a bit flip is the store's to detect.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from deltalake.transaction import AddAction, RemoveAction

from storage_delta.commit.append import TableSpec
from storage_delta.commit.deltalog import add_line, commit_info, remove_line
from storage_delta.commit.durable import fsync_path, make_dirs, sync_new_file
from storage_delta.commit.store import StoreRoot, add_actions, creation_lines, file_stats, open_existing
from storage_delta.commit.writer import MESSAGES_TABLE
from storage_delta.format import schema as sch
from storage_delta.format.integrity import (
    LINES_KEY,
    DamagedFile,
    LogDamage,
    lines_digest,
    scan_log,
    verified_bytes,
)
from storage_delta.maintenance.files import swap_actions
from storage_delta.tables.ackfloors import ACKFLOORS_TABLE
from storage_delta.tables.acklog import ACKS_TABLE
from storage_delta.tables.catalog import CATALOG_TABLE
from storage_delta.tables.jobruns import JOBRUNS_TABLE
from storage_delta.tables.removals import REMOVALS_TABLE, Removal, RemovalLog, live_streams
from storage_delta.tables.scope import Scope
from storage_delta.tables.unresolved import UnresolvedEntry, record, resolve, unresolved_entries

log = logging.getLogger(__name__)

TABLES = (MESSAGES_TABLE, ACKS_TABLE, CATALOG_TABLE, REMOVALS_TABLE, ACKFLOORS_TABLE, JOBRUNS_TABLE)
_SPECS = {spec.name: spec for spec in TABLES}


@dataclass(frozen=True, slots=True)
class Finding:
    """One damaged file: where, what it holds, why it is damaged and what repair does about it."""

    table: str
    kind: str  # "data file", "log entry" or "checkpoint"
    path: str  # relative to the table's folder
    holds: str
    reason: str
    action: str
    #: Messages it held, as far as known (stream, first and last sequence, newest ``ts``): a
    #: ``messages`` data file's, or what the damaged ``add`` lines of a log entry still say.
    lost: tuple[tuple[str, int, int, int], ...] = ()
    #: For a log entry: the positions of its damaged lines.
    bad_lines: tuple[int, ...] = ()
    #: For a data file: its partition values (its ``remove`` action names them).
    partition: tuple[tuple[str, str], ...] = ()
    #: For a log entry the gateway set aside at start: already rewritten, its marker to remove.
    set_aside: bool = False

    def line(self) -> str:
        return f"{self.table}/{self.path}: {self.kind}, {self.holds}; {self.reason} -> {self.action}"


#: (stream, created) → the sequences its index snapshot says were committed above the newest file
#: of the stream the table holds (``storage_delta.read.index_snapshot.unheld_tail``, passed in by
#: the command: reading snapshots is a layer above this one).
TailOf = Callable[[str, int], tuple[int, int] | None]


def find_damage(root: StoreRoot, tail_of: TailOf | None = None) -> list[Finding]:
    """Every damaged log entry, checkpoint and data file of every table. A table whose log is
    damaged has its data files checked once its log is repaired (its file list is not known).
    ``tail_of`` tells the lost tails of the streams a set-aside entry concerns."""
    local = _local(root)
    out: list[Finding] = []
    for spec in TABLES:
        table_path = os.path.join(local, spec.name)
        if not os.path.isdir(table_path):
            continue
        log_damage = [_log_finding(spec.name, table_path, d) for d in scan_log(table_path)]
        out += log_damage
        damaged_entries = {f.path for f in log_damage if f.kind == "log entry"}
        out += [
            _set_aside_finding(u, _snapshot_tails(root, u, tail_of))
            for u in unresolved_entries(table_path, spec.name)
            if u.entry not in damaged_entries  # else rewriting it resolves the marker too
        ]
        if not damaged_entries and not any(f.kind == HINT for f in log_damage):
            out += _data_damage(root, spec)
    return out


def _local(root: StoreRoot) -> str:
    local = root.local_path()
    if local is None:
        raise ValueError("repair works on a local store root only")
    return local


def _log_finding(table: str, table_path: str, d: LogDamage) -> Finding:
    rel = os.path.relpath(d.path, table_path)
    if d.kind == "checkpoint":
        return Finding(table, d.kind, rel, f"table state at version {d.version}", d.reason, "set aside")
    if d.kind == HINT:
        return Finding(
            table, d.kind, rel, "where readers start", d.reason, "set aside (readers list the log)"
        )
    plan = EntryRewrite.plan(table_path, rel, d.bad_lines)
    line_at = [*plan.raw, *([b""] * (max(d.bad_lines, default=0) + 1 - len(plan.raw)))]
    dropped = [line_at[i] for i in plan.dropped]
    lost = (
        tuple(r for r in (_add_range(line) for line in dropped) if r is not None)
        if table == sch.MESSAGES
        else ()
    )
    rebuilt = len(d.bad_lines) - len(plan.dropped)
    return Finding(
        table,
        d.kind,
        rel,
        f"version {d.version}: "
        + "; ".join(_describe_line(plan.raw[i] if i < len(plan.raw) else b"") for i in d.bad_lines),
        d.reason,
        "rewrite: "
        + ", ".join(
            [f"{rebuilt} line(s) rebuilt from what survives and the files they name"] * (rebuilt > 0)
            + _dropping(plan.dropped)
        ),
        lost=lost,
        bad_lines=d.bad_lines,
    )


def _snapshot_tails(
    root: StoreRoot, u: UnresolvedEntry, tail_of: TailOf | None
) -> tuple[tuple[str, int, int, int], ...]:
    """For a set-aside ``messages`` entry: the sequences of each live stream it may concern that the
    stream's index snapshot says were committed and that no file of the table holds any more
    (``tail_of``): the lost line's, when they were the stream's last ones. Recorded as removed,
    they are never given out again (the stream's last sequence stays); a range that was removed
    anyway is recorded twice, which is harmless. (stream, first, last, created) each."""
    if u.table != sch.MESSAGES or tail_of is None:
        return ()
    scopes = u.scopes()
    tails = []
    for stream, created in sorted(live_streams(root, skip_damaged=True).items()):
        if any(scope.names(stream) for scope in scopes) and (tail := tail_of(stream, created)) is not None:
            tails.append((stream, tail[0], tail[1], created))
    return tuple(tails)


def _dropping(dropped: tuple[int, ...]) -> list[str]:
    return [f"{len(dropped)} damaged line(s) dropped"] * bool(dropped) + [
        "its commitInfo is lost, and with it what the commit held: unknown"
    ] * (0 in dropped)


def _set_aside_finding(u: UnresolvedEntry, tails: tuple[tuple[str, int, int, int], ...]) -> Finding:
    """A log entry the gateway rewrote at start without its lines that cannot be made again, its
    streams offline until repair says so: what the dropped lines were, the ranges they still
    name and the ``tails`` (:func:`_snapshot_tails`) recorded as lost."""
    lines = sorted(u.dropped.items())
    ranges = (_add_range(raw) for _, raw in lines) if u.table == sch.MESSAGES else iter(())
    return Finding(
        u.table,
        "log entry",
        u.entry,
        f"version {u.version}: " + "; ".join(_describe_line(raw) for _, raw in lines),
        u.reason,
        "set aside at start (rewritten, the original in _jetlake_quarantine/, "
        f"{u.describe()} offline): "
        + ", ".join(_dropping(tuple(i for i, _ in lines)))
        + "".join(
            f", sequences {first}-{last} of stream {stream} (its index snapshot knew them, no file "
            "holds them) become deleted"
            for stream, first, last, _ in tails
        )
        + "; serve again",
        lost=tuple(r for r in ranges if r is not None) + tails,
        bad_lines=tuple(i for i, _ in lines),
        set_aside=True,
    )


def _describe_line(raw: bytes) -> str:
    """What a damaged line seems to have been (its start is often whole), for the operator."""
    found = _add_range(raw)
    if found is not None:
        return f"an add of stream {found[0]}, sequences {found[1]}-{found[2]} (as the damaged line says)"
    if not raw:
        return "a missing line"
    text = raw[:120].decode("utf-8", "replace")
    return f"{text!r}" + ("…" if len(raw) > 120 else "")


def _add_range(raw: bytes) -> tuple[str, int, int, int] | None:
    """(stream, first, last, newest ts) of a damaged line that still parses as a ``messages`` add:
    repair records the range as removed, so a stream's last sequences are never given out again."""
    try:
        add = json.loads(raw)["add"]
        stats = json.loads(add["stats"])
        return (
            str(add["partitionValues"]["stream"]),
            int(stats["minValues"]["seq"]),
            int(stats["maxValues"]["seq"]),
            int(stats["maxValues"]["ts"]),
        )
    except (ValueError, KeyError, TypeError):
        return None


def _data_damage(root: StoreRoot, spec: TableSpec) -> Iterator[Finding]:
    dt = open_existing(root, spec.name)
    if dt is None:
        return
    adds = add_actions(dt)
    fs, base = root.filesystem()
    for add in adds:
        path = str(add["path"])
        try:
            buf = verified_bytes(fs, f"{base}/{spec.name}/{path}")
            pq.read_table(pa.BufferReader(buf), page_checksum_verification=True)
        except DamagedFile as exc:
            reason = exc.reason
        except (OSError, pa.ArrowException) as exc:
            reason = f"parquet: {exc}"
        else:
            continue
        yield _data_finding(spec.name, path, add, reason)


def _data_finding(table: str, path: str, add: dict[str, object], reason: str) -> Finding:
    rows = add.get("num_records")
    partition = tuple(
        (k.removeprefix("partition."), str(v)) for k, v in add.items() if k.startswith("partition.")
    )
    if table in _SCOPED:
        holds = f"{rows} rows, {Scope.of(add).describe()}"
        return Finding(table, "data file", path, holds, reason, _SCOPED[table], partition=partition)
    if table != sch.MESSAGES:
        return Finding(table, "data file", path, f"{rows} rows", reason, "remove", partition=partition)
    stream = str(add.get("partition.stream"))
    first, last, newest = (int(str(add.get(k))) for k in ("min.seq", "max.seq", "max.ts"))
    return Finding(
        table,
        "data file",
        path,
        f"stream {stream}, sequences {first}-{last} ({rows} messages)",
        reason,
        "remove; the sequences become deleted",
        lost=((stream, first, last, newest),),
        partition=partition,
    )


#: What dropping a damaged file of these tables does to the streams it concerns (the gateway serves
#: them again after it, from the other rows, so the operator should know).
_SCOPED = {
    sch.CATALOG: (
        "remove; its streams come back from their other rows (a lost deletion brings a deleted "
        "stream back, a lost creation leaves its messages unreachable, a lost change undoes it)"
    ),
    sch.REMOVALS: "remove; its streams' deleted messages that only it recorded become live again",
}


def apply(root: StoreRoot, findings: list[Finding]) -> list[Finding]:
    """Do what each finding says: log entries first (then the tables load), checkpoints, then data
    files. Returns what a look afterwards still finds (data files behind a log entry it repaired
    included, which it drops too)."""
    local = _local(root)
    record_lost(root, [f for f in findings if f.kind == "log entry"])
    for f in findings:
        table_path = os.path.join(local, f.table)
        if f.kind == "log entry":
            if not f.set_aside:
                EntryRewrite.plan(table_path, f.path, f.bad_lines).write()
            resolve(table_path, int(os.path.basename(f.path)[:20]))
        elif f.kind == "checkpoint":
            set_aside_checkpoint(table_path, f.path)
        elif f.kind == HINT:
            set_aside_hint(table_path)
    data = [f for f in find_damage(root) if f.kind == "data file"]
    for spec in TABLES:
        drop_files(root, spec, [f for f in data if f.table == spec.name])
    # The snapshots are caches of what the tables held: they may show messages repair took away.
    shutil.rmtree(os.path.join(local, sch.INDEX_SNAPSHOTS), ignore_errors=True)
    return find_damage(root)


def record_lost(root: StoreRoot, findings: list[Finding]) -> None:
    """Append the live streams' lost ranges the findings know of to ``removals``, before anything is
    dropped (a crash between leaves them removed twice, which is harmless; the other order could
    let a stream number its last sequences again)."""
    if not any(f.lost for f in findings):
        return
    created = live_streams(root, skip_damaged=True)
    removals = [
        Removal(stream, created[stream], first, last)
        for f in findings
        for stream, first, last, newest in f.lost
        if stream in created and newest >= created[stream]
    ]
    RemovalLog(root).append(removals)


_ACTION = re.compile(rb'^\{"(add|remove)":\{"path":"([^"\\]+)"')
_TXN = re.compile(rb'^\{"txn":\{"appId":"([^"\\]+)","version":(\d+)[,}]')
_DATA_CHANGE = re.compile(rb'"dataChange":(true|false)')
#: Operations whose ``add``/``remove`` change no reader's answer (compaction); ``dataChange`` false.
_REARRANGING = {"OPTIMIZE"}


@dataclass(frozen=True, slots=True)
class EntryRewrite:
    """A damaged log entry's whole lines, its damaged lines made again where what survives of them
    says exactly what they were, and the rest dropped.

    Made again: an ``add`` whose path survived and whose file is whole (its size, partition values and
    statistics are read from the file itself, as the commit computed them), a ``remove`` whose path
    survived and whose ``dataChange`` survived or follows from the operation, a ``txn`` whose app id
    and version survived, the ``commitInfo``. A cut tail usually leaves the last line's start, so an
    entry cut by a crash of the disk loses nothing."""

    table_path: str
    rel: str
    raw: list[bytes]
    bad: tuple[int, ...]
    lines: list[bytes]  # the entry's lines after the rewrite, commitInfo excluded
    dropped: tuple[int, ...]

    @classmethod
    def plan(cls, table_path: str, rel: str, bad_lines: tuple[int, ...]) -> EntryRewrite:
        with open(os.path.join(table_path, rel), "rb") as fh:
            raw = fh.read().split(b"\n")
        if raw and raw[-1] == b"":
            raw.pop()
        info = None if 0 in bad_lines else _json_line(raw[0]).get("commitInfo", {})
        expected = len(info.get(LINES_KEY, raw[1:])) if info is not None else len(raw) - 1
        operation = str(info.get("operation", "")) if info is not None else None
        lines: list[bytes] = []
        # A lost commitInfo (a cut inside it, or to nothing) took with it how many lines followed:
        # what the entry held is unknown, never "nothing" (version 0 is delta-rs's creation).
        dropped: list[int] = [0] if info is None and int(os.path.basename(rel)[:20]) > 0 else []
        for i in range(1, max(len(raw), expected + 1)):
            line = raw[i] if i < len(raw) else b""
            if i not in bad_lines:
                lines.append(line)
            elif i <= expected and (again := _rebuild(table_path, line, operation)) is not None:
                lines.append(again)
            elif i <= expected:  # a line nobody wrote (past the digests) is no loss
                dropped.append(i)
        if dropped and info is not None and isinstance(info.get(LINES_KEY), list):
            found = _find_lost_adds(table_path, rel, info, dropped, lines)
            dropped = [i for i in dropped if i not in found]
            for i in sorted(found):  # at its place among the lines kept
                lines.insert(i - 1 - sum(1 for d in dropped if d < i), found[i])
        spec = _SPECS.get(os.path.basename(table_path))
        if int(os.path.basename(rel)[:20]) == 0 and spec is not None:
            damaged = [raw[i] if i < len(raw) else b"" for i in bad_lines]
            lines = _creation(spec, lines, damaged, os.path.join(table_path, rel))
            dropped = [i for i in dropped if not _creation_line(raw[i] if i < len(raw) else b"")]
        return cls(table_path, rel, raw, bad_lines, lines, tuple(dropped))

    @property
    def leaves_a_hole(self) -> bool:
        """Whether a Delta reader of the entry as it is would refuse the table or read it without a
        word of what is lost: a dropped line that does not parse or is missing, or a lost
        ``commitInfo`` (the count of the lines with it). A dropped line that parses (a flipped bit
        only its digest notices) is read as it is, and its file's absence reported by the reader."""
        return any(i == 0 or i >= len(self.raw) or not _json_line(self.raw[i]) for i in self.dropped)

    def set_aside(self, table: str, reason: str) -> UnresolvedEntry:
        """Rewrite the entry without the lines that cannot be made again, the marker that keeps the
        streams they may concern offline written first (``storage_delta.tables.unresolved``)."""
        version = int(os.path.basename(self.rel)[:20])
        dropped = {i: self.raw[i] if i < len(self.raw) else b"" for i in self.dropped}
        entry = UnresolvedEntry(table, version, reason, dropped)
        record(self.table_path, entry)
        self.write()
        return entry

    def write(self) -> None:
        """Keep the damaged original in ``_jetlake_quarantine/`` and replace the entry by the rewrite
        (a fresh ``commitInfo``): written beside it, synced, renamed over it, the log directory
        synced."""
        path = os.path.join(self.table_path, self.rel)
        quarantine = os.path.join(self.table_path, "_jetlake_quarantine")
        new_entries = make_dirs(quarantine)
        kept = os.path.join(quarantine, os.path.basename(path))
        shutil.copyfile(path, kept)
        sync_new_file(kept, new_entries)
        info = commit_info("REPAIR", False, int(time.time() * 1000))
        info["commitInfo"][LINES_KEY] = lines_digest(self.lines)
        body = b"\n".join([json.dumps(info, separators=(",", ":")).encode(), *self.lines]) + b"\n"
        tmp = f"{path}.jetlake-repair"
        with open(tmp, "wb") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        fsync_path(os.path.dirname(path))
        log.warning(
            "rewrote %s: damaged lines %s, of them dropped %s (the original is in %s)",
            path,
            [i + 1 for i in self.bad],
            [i + 1 for i in self.dropped],
            kept,
        )


#: The first bytes of the lines of a table's creation that its spec makes again.
_CREATION_KINDS = {"protocol": b'{"protocol":', "metaData": b'{"metaData":'}
_TABLE_ID = re.compile(rb'"id":"([0-9a-fA-F-]{36})"')
_CREATED_TIME = re.compile(rb'"createdTime":(\d+)[,}]')


def _creation_line(raw: bytes) -> bool:
    """Whether a damaged line of a table's creation can have been its protocol or metaData (what
    survives is the start of one; a missing line too): made again from the spec, it is no loss."""
    return any(raw[: len(start)] == start[: len(raw)] for start in _CREATION_KINDS.values())


def _creation(spec: TableSpec, lines: list[bytes], damaged: list[bytes], path: str) -> list[bytes]:
    """The lines of a damaged creation (version 0) with its protocol and metaData, when damaged,
    made again from the table's spec: jetlake wrote them (``store.creation_lines``), so the same
    call in a scratch folder writes them again, byte for byte but for the metaData's table id and
    creation time, which are taken from what survives of the damaged lines (a fresh id and the
    entry's modification time when nothing does). No checkpoint holds them yet (else the start
    would not read this entry), and no later entry repeats them."""
    whole = {kind for kind in _CREATION_KINDS if any(_json_line(line).get(kind) for line in lines)}
    if len(whole) == len(_CREATION_KINDS):
        return lines
    made_lines = creation_lines(spec.schema, list(spec.partition_by))
    fresh = {next(iter(obj)): obj for obj in map(_json_line, made_lines) if obj}
    meta = fresh["metaData"]["metaData"]
    table_id = next((m.group(1) for raw in damaged if (m := _TABLE_ID.search(raw))), None)
    created = next((m.group(1) for raw in damaged if (m := _CREATED_TIME.search(raw))), None)
    meta["id"] = table_id.decode() if table_id is not None else str(uuid.uuid4())
    meta["createdTime"] = int(created) if created is not None else int(os.stat(path).st_mtime * 1000)
    made = {kind: json.dumps(fresh[kind], separators=(",", ":")).encode() for kind in _CREATION_KINDS}
    kept = {next(iter(_json_line(line)), None): line for line in lines}
    head = [kept[kind] if kind in whole else made[kind] for kind in _CREATION_KINDS]
    log.warning("%s: the table's %s made again from its spec", path, ", ".join(sorted(set(made) - whole)))
    return head + [line for line in lines if next(iter(_json_line(line)), None) not in _CREATION_KINDS]


#: How long before its commit a lost ``add`` line's file may have been written and still be looked
#: for (a commit writes its files, syncs them and then commits: milliseconds, seconds under load).
MATCH_WINDOW_MS = 60_000


def _find_lost_adds(
    table_path: str, rel: str, info: dict[str, Any], lost: list[int], kept: list[bytes]
) -> dict[int, bytes]:
    """The ``add`` lines of a log entry cut before they named their files, found again by their
    digests: the entry's ``commitInfo`` holds each line's CRC-32, and a line is determined by its
    file (path, size, partition values, statistics: what :func:`_rebuild` reads from it) and its
    ``modificationTime``, which the writer took after the file was written and before the commit's
    ``timestamp``. So every file that no other version can have added (not live before this one,
    not added by a line of it or of a later one) and was written within :data:`MATCH_WINDOW_MS`
    before the commit
    is tried with every millisecond between its write and the commit; a line whose CRC-32 matches
    is the lost line, byte for byte. Returns line position → line."""
    digests, commit_ms = info[LINES_KEY], info.get("timestamp")
    version = int(os.path.basename(rel)[:20])
    if not isinstance(commit_ms, int) or version == 0:
        return {}
    named = _named_files(table_path, version, kept)
    if named is None:
        return {}
    want = {str(digests[i - 1]): i for i in lost if i - 1 < len(digests)}
    data_change = str(info.get("operation", "")) not in _REARRANGING
    found: dict[int, bytes] = {}
    for full, written_ms in _orphans(table_path, named, commit_ms):
        if len(found) == len(want):
            break
        line = _add_template(table_path, full, data_change)
        if line is None:
            continue
        head, tail = line
        head_crc = zlib.crc32(head)
        for ms in range(written_ms, commit_ms + 1):
            body = b"%d" % ms + tail
            i = want.get(f"{zlib.crc32(body, head_crc) & 0xFFFFFFFF:08x}")
            if i is not None and i not in found:
                found[i] = head + body
                log.warning("lost add line %d of %s found again from its file %s", i + 1, rel, full)
                break
    return found


def _named_files(table_path: str, version: int, kept: list[bytes]) -> set[str] | None:
    """The names of the data files live at ``version - 1`` or added by the ``kept`` lines or by a
    later log entry (None when the version before cannot be loaded). A file only a later entry
    removes stays a candidate: compaction may have merged the lost line's file since, and no
    version but this one can have added it."""
    try:
        before = DeltaTable(table_path, version=version - 1)
    except (DeltaError, OSError):
        return None
    named = {
        p.rsplit("/", 1)[-1]
        for p in pa.table(before.get_add_actions(flatten=True)).column("path").to_pylist()
    }
    log_dir = os.path.join(table_path, "_delta_log")
    later = [n for n in os.listdir(log_dir) if n.endswith(".json") and int(n[:20]) > version]
    for raw in [*kept, *(line for n in later for line in _lines(os.path.join(log_dir, n)))]:
        action = _ACTION.match(raw)
        if action is not None and action.group(1) == b"add":
            named.add(action.group(2).decode().rsplit("/", 1)[-1])
    return named


def _lines(path: str) -> list[bytes]:
    with open(path, "rb") as fh:
        return fh.read().split(b"\n")


def _orphans(table_path: str, named: set[str], commit_ms: int) -> Iterator[tuple[str, int]]:
    """Data files of a table that no version names, written in the window before ``commit_ms``,
    newest first, with their write time (ms)."""
    found = []
    for folder, dirs, files in os.walk(table_path):
        dirs[:] = [d for d in dirs if not d.startswith("_")]
        for name in files:
            if name.endswith(".parquet") and name not in named:
                written_ms = os.stat(os.path.join(folder, name)).st_mtime_ns // 1_000_000
                if commit_ms - MATCH_WINDOW_MS <= written_ms <= commit_ms:
                    found.append((os.path.join(folder, name), written_ms))
    yield from sorted(found, key=lambda f: -f[1])


#: Stands in for the ``modificationTime`` of a line being matched (no file's size or statistics
#: hold it, being longer than any of them).
_SENTINEL = 987654321987654321987


def _add_template(table_path: str, full: str, data_change: bool) -> tuple[bytes, bytes] | None:
    """The ``add`` line of a whole file, split around its ``modificationTime``."""
    path = os.path.relpath(full, table_path)
    raw = f'{{"add":{{"path":"{path}","dataChange":{str(data_change).lower()}}}}}'.encode()
    line = _rebuild(table_path, raw, None)
    if line is None:
        return None
    obj = json.loads(line)
    obj["add"]["modificationTime"] = _SENTINEL
    head, _, tail = json.dumps(obj, separators=(",", ":")).encode().partition(b"%d" % _SENTINEL)
    return head, tail


def _json_line(raw: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(raw)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def _rebuild(table_path: str, line: bytes, operation: str | None) -> bytes | None:
    """A damaged line made again, or None when what survives does not say exactly what it was."""
    if (txn := _TXN.match(line)) is not None:
        now = int(time.time() * 1000)
        again: dict[str, Any] = {
            "txn": {"appId": txn.group(1).decode(), "version": int(txn.group(2)), "lastUpdated": now}
        }
        return json.dumps(again, separators=(",", ":")).encode()
    action = _ACTION.match(line)
    if action is None:
        return None
    kind, rel = action.group(1).decode(), action.group(2).decode()
    change = _DATA_CHANGE.search(line)
    if change is not None:
        data_change = change.group(1) == b"true"
    elif operation:
        data_change = operation not in _REARRANGING
    else:
        return None
    partition: dict[str, str | None] = {}
    for part in rel.split("/")[:-1]:
        key, value = part.split("=", 1)
        partition[key] = value
    full = os.path.join(table_path, rel)
    if kind == "remove":
        removed = RemoveAction(
            path=rel,
            data_change=data_change,
            deletion_timestamp=int(time.time() * 1000),
            partition_values=partition,
        )
        return json.dumps(remove_line(removed), separators=(",", ":")).encode()
    try:
        body = verified_bytes(pafs.LocalFileSystem(), full)
        rows = pq.read_table(pa.BufferReader(body), page_checksum_verification=True)
    except (DamagedFile, OSError, pa.ArrowException):
        return None  # the file is gone or damaged too: its rows are lost
    added = AddAction(
        path=rel,
        size=body.size,
        partition_values=partition,
        modification_time=int(os.stat(full).st_mtime * 1000),
        data_change=data_change,
        stats=file_stats(rows.drop_columns([c for c in partition if c in rows.column_names])),
    )
    return json.dumps(add_line(added), separators=(",", ":")).encode()


#: ``_last_checkpoint`` naming a checkpoint that is not there (``integrity.scan_log``).
HINT = "checkpoint hint"


def set_aside_hint(table_path: str) -> None:
    """Move ``_last_checkpoint`` out of ``_delta_log``: it is a hint, and without it readers list
    the log for the newest checkpoint; naming a missing one it makes them refuse the table."""
    log_dir = os.path.join(table_path, "_delta_log")
    quarantine = os.path.join(table_path, "_jetlake_quarantine")
    new_entries = make_dirs(quarantine)
    kept = os.path.join(quarantine, "_last_checkpoint")
    shutil.move(os.path.join(log_dir, "_last_checkpoint"), kept)
    sync_new_file(kept, new_entries)
    fsync_path(log_dir)
    log.warning("%s/_last_checkpoint names a checkpoint that is not there: set aside", log_dir)


def set_aside_checkpoint(table_path: str, rel: str) -> bool:
    """Move a damaged checkpoint out of ``_delta_log`` (and drop a ``_last_checkpoint`` naming
    it) so readers replay the JSON entries; only when those entries are all still there. Returns
    whether it was set aside."""
    path = os.path.join(table_path, rel)
    log_dir = os.path.dirname(path)
    version = int(os.path.basename(path)[:20])
    present = {n for n in os.listdir(log_dir) if n.endswith(".json")}
    earlier = [int(n[:20]) for n in os.listdir(log_dir) if ".checkpoint" in n and n != os.path.basename(path)]
    start = max([v for v in earlier if v < version], default=-1) + 1
    if any(f"{v:020d}.json" not in present for v in range(start, version + 1)):
        log.error("checkpoint %s is damaged and the log entries it stands for are gone", path)
        return False
    quarantine = os.path.join(table_path, "_jetlake_quarantine")
    os.makedirs(quarantine, exist_ok=True)
    last = os.path.join(log_dir, "_last_checkpoint")
    try:
        with open(last, "rb") as fh:
            names_it = int(json.load(fh)["version"]) == version
    except (OSError, ValueError, KeyError, TypeError):
        names_it = True  # unreadable: readers list the log instead
    if names_it and os.path.exists(last):
        os.unlink(last)
    shutil.move(path, os.path.join(quarantine, os.path.basename(path)))
    sync_new_file(os.path.join(quarantine, os.path.basename(path)), [table_path])
    fsync_path(log_dir)
    log.warning("damaged checkpoint %s set aside; readers replay the log entries instead", path)
    return True


def drop_files(root: StoreRoot, spec: TableSpec, damaged: list[Finding]) -> None:
    """Remove damaged data files of one table in one commit; for ``messages``, their live streams'
    sequence ranges are recorded as removed first (:func:`record_lost`)."""
    if not damaged:
        return
    record_lost(root, damaged)
    now = int(time.time() * 1000)
    removes = [
        RemoveAction(
            path=f.path, data_change=True, deletion_timestamp=now, partition_values=dict(f.partition)
        )
        for f in damaged
    ]
    if not swap_actions(root, spec.name, spec.schema, list(spec.partition_by), removes, []):
        raise RuntimeError(f"{spec.name}: the damaged files changed while repairing; run it again")
    log.warning("removed %d damaged files from %s", len(removes), spec.name)


#: Tables whose data files the gateway's reads check themselves: ``messages`` (the reader), the
#: catalog and the removal log (``storage_delta.tables.scope``, which reports them).
_READ_CHECKED = {sch.MESSAGES, sch.CATALOG, sch.REMOVALS}


@dataclass(frozen=True, slots=True)
class StartCheck:
    """What the start's look found: the problems, one line each, and the stream names that log
    entries set aside (``storage_delta.tables.unresolved``) may concern, with why, to take offline."""

    problems: list[str]
    offline: list[tuple[Scope, str]]


def check_at_start(root: StoreRoot) -> StartCheck:
    """The gateway's look at the store before it opens the tables. Every table's log, as far as a
    load of the newest version reads it (``scan_log(newest_only=True)``): a damaged
    checkpoint is set aside (readers replay the log entries; nothing is lost), a damaged log entry
    whose damaged lines can all be made again is rewritten (:class:`EntryRewrite`; nothing is lost
    either), one with a line that cannot and that delta-rs would refuse or read with a hole is
    set aside (rewritten without it, a marker keeping the streams it may concern offline until
    ``jetlake repair``: ``storage_delta.tables.unresolved``), any other is reported (it waits for
    ``jetlake repair``, which drops data). The data
    files of the tables other than ``messages`` (small: the catalog, the compacted ack and removal
    logs): the ack log's and the others' reported here (the ack log leaves them out); the catalog's
    and the removal log's are checked and reported by their read at start, which takes the streams
    they concern offline (``storage_delta.tables.scope``); ``messages`` files by the reader
    (:meth:`MessageReader.verify`)."""
    local = root.local_path()
    if local is None:
        return StartCheck([], [])
    problems = []
    offline: list[tuple[Scope, str]] = []
    for spec in TABLES:
        table_path = os.path.join(local, spec.name)
        entries_whole = True
        for d in scan_log(table_path, newest_only=True):
            log.error("damaged %s %s: %s", d.kind, d.path, d.reason)
            rel = os.path.relpath(d.path, table_path)
            if d.kind == "checkpoint" and set_aside_checkpoint(table_path, rel):
                continue
            if d.kind == HINT:
                set_aside_hint(table_path)  # a hint: nothing is lost
                continue
            if d.kind == "log entry":
                plan = EntryRewrite.plan(table_path, rel, d.bad_lines)
                if not plan.dropped:
                    plan.write()  # every damaged line made again exactly: nothing is lost, nothing to decide
                    continue
                if plan.leaves_a_hole:  # a creation's protocol and metaData are made again from its spec
                    plan.set_aside(spec.name, d.reason)  # reported below, with the other markers
                    continue
            entries_whole = False
            problems.append(f"damaged {d.kind} {spec.name}/{rel}: {d.reason}; see jetlake repair")
        for u in unresolved_entries(table_path, spec.name):
            described = u.describe()
            log.error("log entry %s/%s was set aside at start, %s offline", spec.name, u.entry, described)
            problems.append(
                f"damaged log entry {spec.name}/{u.entry}: {u.reason}; set aside at start, "
                f"{described} offline, see jetlake repair"
            )
            why = (
                f"a damaged {spec.name} log entry whose content is unknown, see jetlake repair"
                if u.content_unknown or any(scope.last is None for scope in u.scopes())
                else f"a damaged {spec.name} log entry {u.entry} lost a line of it, see jetlake repair"
            )
            offline += [(scope, why) for scope in u.scopes()]
        if spec.name not in _READ_CHECKED and entries_whole:
            for f in _data_damage(root, spec):
                log.error("damaged data file %s/%s: %s", spec.name, f.path, f.reason)
                problems.append(
                    f"damaged data file {spec.name}/{f.path} ({f.holds}): {f.reason}; see jetlake repair"
                )
    return StartCheck(problems, offline)
