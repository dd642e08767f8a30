"""The ``catalog`` table: stream and consumer definitions, durable before the API confirms them.

Append-only: each change is a row with a growing ``rev``; the newest row per (kind, stream, name)
is the entity, and a ``deleted`` row ends it. The txn marker ``(jetlake-catalog, rev)`` makes a
retried change land once. Fenced per stream (per-stream ownership, docs/perstream-status.md), a
stream's rows are written by the stream's owner like its messages: ``rev`` is then the stream's own
count (``(jetlake-catalog/<S>, rev)``), which goes on growing under each next owner, so an entity's
newest row is still the one of its highest ``rev``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from storage_delta.commit.append import TableSpec, WriterTable
from storage_delta.commit.owner import commit_without_fenced
from storage_delta.commit.store import read_whole
from storage_delta.format import schema as sch

APP_ID = "jetlake-catalog"
CATALOG_TABLE = TableSpec(sch.CATALOG, sch.CATALOG_SCHEMA, tuple(sch.CATALOG_PARTITIONS))


@dataclass(frozen=True, slots=True)
class CatalogChange:
    """A definition to record (``body``) or an entity to end (``body`` None)."""

    kind: str
    stream: str
    name: str
    body: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    kind: str
    stream: str
    name: str
    body: dict[str, Any]


class CatalogTable(WriterTable):
    """Blocking access to the catalog; callers run it on a worker thread."""

    SPEC = CATALOG_TABLE
    APP_ID = APP_ID

    @property
    def dt(self) -> DeltaTable:
        return self._appender.fresh()

    def committed_version(self) -> int:
        """The newest catalog commit of the gateway's (its txn version; 0 before any)."""
        return self._appender.committed_version()

    def put(self, kind: str, stream: str, name: str, body: dict[str, Any] | None) -> None:
        """Record a definition (``body``) or its deletion (``None``) in a commit of its own."""
        self.commit([CatalogChange(kind, stream, name, body)], self._appender.next_version())

    def commit(self, changes: list[CatalogChange], version: int) -> frozenset[str]:
        """Record ``changes`` as one commit tagged ``(jetlake-catalog, version)`` (the group
        commit of the gateway's concurrent API requests). Every row gets ``version`` as its
        ``rev``, which still grows from commit to commit, so an entity's newest row is the one
        of its last commit; of two changes to one entity in a commit only the later is stored,
        as a reader could not order rows of equal ``rev``. Fenced per stream, a row's ``rev`` is
        its stream's count for ``version``, the changes of streams a newer owner holds are left
        out, and those streams are returned."""
        last = {(c.kind, c.stream, c.name): c for c in changes}
        if not self.per_stream:
            self._appender.append([({}, self._rows(list(last.values()), lambda _stream: version))], version)
            return frozenset()

        def attempt(left_out: frozenset[str]) -> None:
            kept = [c for c in last.values() if c.stream not in left_out]
            if kept:
                rows = self._rows(kept, lambda stream: self._appender.stream_version(stream, version))
                self._appender.append([({}, rows)], version, streams={c.stream for c in kept})

        return commit_without_fenced(attempt)

    @staticmethod
    def _rows(changes: list[CatalogChange], rev: Callable[[str], int]) -> pa.Table:
        now = time.time_ns()
        return pa.table(
            {
                "rev": [rev(c.stream) for c in changes],
                "kind": [c.kind for c in changes],
                "stream": [c.stream for c in changes],
                "name": [c.name for c in changes],
                "ts": [now] * len(changes),
                "deleted": [c.body is None for c in changes],
                "body": [json.dumps(c.body or {}, separators=(",", ":")) for c in changes],
            },
            schema=sch.CATALOG_SCHEMA,
        )

    def load(self) -> list[CatalogEntry]:
        """The live entities, streams before their consumers, in the order they were defined. A
        damaged file raises :class:`DamagedFile` (the jobs stop); the gateway reads the catalog
        through :mod:`storage_delta.tables.scope`, which sets the streams it concerns aside."""
        return entries_of(read_whole(self.root, self.dt, sch.CATALOG, sch.CATALOG_SCHEMA))


def entries_of(table: pa.Table) -> list[CatalogEntry]:
    """The live entities the catalog rows ``table`` define: the newest row per (kind, stream,
    name) unless it ends the entity; streams before their consumers, in the order they were defined."""
    latest: dict[tuple[str, str, str], tuple[int, bool, str]] = {}
    for rev, kind, stream, name, deleted, body in zip(
        *(table.column(c).to_pylist() for c in ("rev", "kind", "stream", "name", "deleted", "body")),
        strict=True,
    ):
        key = (kind, stream, name)
        if key not in latest or latest[key][0] < rev:
            latest[key] = (rev, deleted, body)
    live = [
        (rev, CatalogEntry(k[0], k[1], k[2], json.loads(body)))
        for k, (rev, deleted, body) in latest.items()
        if not deleted
    ]
    live.sort(key=lambda item: (item[1].kind != "stream", item[0]))
    return [entry for _, entry in live]
