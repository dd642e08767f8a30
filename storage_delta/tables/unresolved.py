"""Damaged log entries the gateway set aside at start, which wait for ``jetlake repair``.

Two kinds of damage leave a log entry with a line nothing can make again: an ``add`` cut before it
named its file whose file is gone too (its digest has nothing to match), and a ``commitInfo`` cut
inside or to nothing (it took the count of the entry's lines and their digests). Such an entry
does not parse, or parses with a hole, and delta-rs refuses the whole table or reads it without a
word. The damage concerns one commit, though, often of one stream: so the gateway rewrites the entry
as repair would (:class:`~storage_delta.tables.repair.EntryRewrite`: whole lines kept, the others
made again where they can be, the rest dropped, the original kept in ``_jetlake_quarantine/``),
having first written, durably, a **marker** beside the original: which lines were dropped and their
surviving bytes. Every start reads the markers and takes the streams the dropped lines may concern
offline (``storage_delta.tables.scope``), until ``jetlake repair`` records what it can of the loss
and removes the marker: without it the rewritten entry would parse and those streams would come
back with a hole, silently, on the next start.

Which streams, from what survives of a dropped line of ``messages``: a path partitioned by stream
(``stream=<name>/…``) names its stream, or, cut inside the name, a prefix of it; any other line
(a missing one, one cut before its path, a lost ``commitInfo``) may have concerned every stream. A
dropped line of ``catalog`` or ``removals`` may concern every stream (their rows are of many). The
other tables concern no stream's definition or messages (a lost ack log row is redelivery, as for a
damaged ack log file).
"""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass
from urllib.parse import unquote

from storage_delta.commit.durable import fsync_path, make_dirs, sync_new_file
from storage_delta.format import schema as sch
from storage_delta.tables.scope import Scope

QUARANTINE = "_jetlake_quarantine"
_MARKER = re.compile(r"^(\d{20})\.unresolved\.json$")
#: A ``messages`` add or remove line up to its stream partition value (whole when a ``/`` follows).
_STREAM_PATH = re.compile(rb'^\{"(?:add|remove)":\{"path":"stream=([^"/\\]*)(/?)')
#: The highest code point: every name with a prefix lies between the prefix and it followed by this.
_LAST_CHAR = "\U0010ffff"


@dataclass(frozen=True, slots=True)
class UnresolvedEntry:
    """A log entry of ``table`` (version ``version``) set aside at start: the lines it dropped
    (position → the bytes that survived of the line; ``b""`` for a missing one)."""

    table: str
    version: int
    reason: str
    dropped: dict[int, bytes]

    @property
    def entry(self) -> str:
        """The entry's path relative to its table."""
        return f"_delta_log/{self.version:020d}.json"

    @property
    def content_unknown(self) -> bool:
        """Whether its ``commitInfo`` is lost, and with it how many lines the commit held."""
        return 0 in self.dropped

    def scopes(self) -> list[Scope]:
        """The names of the streams the dropped lines may concern (``Scope.names``); empty for a
        table that holds no stream's definition or messages."""
        if self.table in (sch.CATALOG, sch.REMOVALS):
            return [Scope("", None, None)]
        if self.table != sch.MESSAGES:
            return []
        return [
            _scope_of_line(raw) if i > 0 else Scope("", None, None) for i, raw in sorted(self.dropped.items())
        ]

    def describe(self) -> str:
        """What the dropped lines were, as far as known, for ``/healthz`` and the log."""
        parts = []
        for scope in self.scopes():
            if scope.last is None:
                return "its content is unknown: every stream"
            parts.append(
                f"stream {scope.first}" if scope.first == scope.last else f"a stream named {scope.first}…"
            )
        return ", ".join(dict.fromkeys(parts)) or "no stream"


def _scope_of_line(raw: bytes) -> Scope:
    found = _STREAM_PATH.match(raw)
    if found is None:
        return Scope("", None, None)
    value, whole = found.group(1).decode("utf-8", "ignore"), found.group(2) == b"/"
    if whole:
        name = unquote(value)
        return Scope(name, name, None)
    prefix = unquote(re.sub(r"%[0-9A-Fa-f]?$", "", value))  # an escape cut in two says nothing yet
    return Scope(prefix, prefix + _LAST_CHAR, None)


def record(table_path: str, entry: UnresolvedEntry) -> None:
    """Write the entry's marker and make it durable (written beside, synced, renamed, the folder
    synced): before the entry is rewritten, so a crash between leaves the damaged entry and its
    marker, and the next start does both again."""
    folder = os.path.join(table_path, QUARANTINE)
    new_entries = make_dirs(folder)
    path = os.path.join(folder, f"{entry.version:020d}.unresolved.json")
    body = {
        "version": entry.version,
        "reason": entry.reason,
        "dropped": {str(i): base64.b64encode(raw).decode() for i, raw in sorted(entry.dropped.items())},
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w") as out:
        json.dump(body, out)
    fsync_path(tmp)
    os.replace(tmp, path)
    sync_new_file(path, new_entries)


def unresolved_entries(table_path: str, table: str) -> list[UnresolvedEntry]:
    """The table's entries set aside at start and not yet repaired, oldest first."""
    folder = os.path.join(table_path, QUARANTINE)
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if _MARKER.match(name) is None:
            continue
        with open(os.path.join(folder, name)) as fh:
            body = json.load(fh)
        dropped = {int(i): base64.b64decode(raw) for i, raw in body["dropped"].items()}
        out.append(UnresolvedEntry(table, int(body["version"]), str(body["reason"]), dropped))
    return out


def resolve(table_path: str, version: int) -> None:
    """Remove the entry's marker (``jetlake repair`` has recorded what it could of the loss): its
    streams are served again from the next start."""
    folder = os.path.join(table_path, QUARANTINE)
    path = os.path.join(folder, f"{version:020d}.unresolved.json")
    if os.path.exists(path):
        os.unlink(path)
        fsync_path(folder)


#: The tables whose set-aside entries may take streams offline (``UnresolvedEntry.scopes``).
_SCOPED_TABLES = (sch.MESSAGES, sch.CATALOG, sch.REMOVALS)


def taking_offline(local_root: str, stream: str) -> list[UnresolvedEntry]:
    """The set-aside entries, not yet repaired, that take ``stream`` offline: what the gateway
    refuses to serve it for, and what a reader of the tables must not read without a word (the
    rewritten entries parse, so every Delta reader reads the stream with a hole). A few listings;
    blocking."""
    return [
        entry
        for table in _SCOPED_TABLES
        for entry in unresolved_entries(os.path.join(local_root, table), table)
        if any(scope.names(stream) for scope in entry.scopes())
    ]
