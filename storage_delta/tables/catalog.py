"""The ``catalog`` table: stream and consumer definitions, durable before the API confirms them.

Append-only: each change is a row with a growing ``rev``; the newest row per (kind, stream, name)
is the entity, and a ``deleted`` row ends it. The txn marker ``(jetlake-catalog, rev)`` makes a
retried change land once.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from storage_delta.commit.append import TableAppender, TableSpec
from storage_delta.commit.store import StoreRoot, read_whole
from storage_delta.format import schema as sch

APP_ID = "jetlake-catalog"
CATALOG_TABLE = TableSpec(sch.CATALOG, sch.CATALOG_SCHEMA, tuple(sch.CATALOG_PARTITIONS))


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    kind: str
    stream: str
    name: str
    body: dict[str, Any]


class CatalogTable:
    """Blocking access to the catalog; callers run it on a worker thread."""

    def __init__(self, root: StoreRoot) -> None:
        self.root = root
        self._appender = TableAppender(root, CATALOG_TABLE, APP_ID)
        self._rev = self._appender.committed_version()

    @property
    def dt(self) -> DeltaTable:
        return self._appender.fresh()

    def put(self, kind: str, stream: str, name: str, body: dict[str, Any] | None) -> None:
        """Record a definition (``body``) or its deletion (``None``)."""
        self._rev += 1
        row = pa.table(
            {
                "rev": [self._rev],
                "kind": [kind],
                "stream": [stream],
                "name": [name],
                "ts": [time.time_ns()],
                "deleted": [body is None],
                "body": [json.dumps(body or {}, separators=(",", ":"))],
            },
            schema=sch.CATALOG_SCHEMA,
        )
        self._appender.append([({}, row)], self._rev)

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
