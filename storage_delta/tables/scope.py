"""The streams a damaged ``catalog`` or ``removals`` data file concerns, set aside so that the
gateway starts and serves every other stream exactly.

Both tables are read whole at start and hold rows of many streams. Without a damaged file's rows a
stream could be wrong with nothing to show it: a lost deletion brings a deleted stream back, a lost
creation takes a live one away, a lost removal brings deleted messages back (and a lost change of a
consumer is a consumer with the wrong config). So the streams the file may concern are
**quarantined** (answered as the real server answers an offline stream) until ``jetlake repair``,
and the others are served: none of their rows is in the file, so what the whole files say of them is
all there is.

Which streams, from the file's ``add`` statistics, which live in the log, not in the damaged file:

* min and max of its ``stream`` column (``file_stats`` records them): every row it holds is of a
  stream whose name lies in that range. A catalog file holds one change (one row), so one name; a
  name in the range is quarantined whether or not a whole row knows it (the damaged row may be its
  creation, so a create of that name is refused too);
* for ``removals``, min and max of ``created`` as well: a row counts for a live stream only when it
  carries the stream's ``created``, so a live stream created outside that range is not concerned.
  A compacted ``removals`` file folds every stream's rows: its damage quarantines the streams it
  folded (their names and incarnations lie in its ranges), not more.

A file with no such statistics (written before they were recorded) concerns every stream: for the
catalog every name is quarantined, creates included (the gateway starts and answers, serving none);
for removals every live stream created in its ``created`` range.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from storage_delta.commit.store import CheckedRows, DamagedAdd, StoreRoot, open_existing, read_checked
from storage_delta.format import schema as sch
from storage_delta.tables.catalog import CatalogEntry, entries_of
from storage_delta.tables.removals import StreamLogicalState, live_streams_of, stream_states_of


@dataclass(frozen=True, slots=True)
class Scope:
    """What a damaged file's statistics say its rows concern: stream names from ``first`` to
    ``last`` (None: no bound) and, for ``removals``, incarnations created in ``created``."""

    first: str
    last: str | None
    created: tuple[int, int] | None

    @classmethod
    def of(cls, add: dict[str, Any]) -> Scope:
        first, last = add.get("min.stream"), add.get("max.stream")
        low, high = add.get("min.created"), add.get("max.created")
        named = isinstance(first, str) and isinstance(last, str)
        return cls(
            str(first) if named else "",
            str(last) if named else None,
            (int(low), int(high)) if low is not None and high is not None else None,
        )

    def names(self, name: str) -> bool:
        return self.first <= name and (self.last is None or name <= self.last)

    def concerns(self, name: str, created: int) -> bool:
        return self.names(name) and (self.created is None or self.created[0] <= created <= self.created[1])

    def describe(self) -> str:
        if self.last is None:
            return "streams unknown (no statistics): every stream"
        return f"stream {self.first}" if self.first == self.last else f"streams {self.first} to {self.last}"


@dataclass(slots=True)
class Quarantine:
    """Streams set aside because a damaged file may hold rows of theirs: ``streams`` (name → why)
    and, for the catalog, whole name ranges (a name in one is set aside even if no whole row knows
    it)."""

    streams: dict[str, str] = field(default_factory=dict)
    ranges: list[tuple[Scope, str]] = field(default_factory=list)

    def reason(self, name: str) -> str | None:
        """Why the stream ``name`` is offline, None when it is served."""
        found = self.streams.get(name)
        if found is not None:
            return found
        return next((why for scope, why in self.ranges if scope.names(name)), None)

    def __bool__(self) -> bool:
        return bool(self.streams or self.ranges)


@dataclass(frozen=True, slots=True)
class StoreState:
    """What the gateway recovers from the catalog and the removal log: the served streams'
    definitions (streams before consumers) and logical states, and the quarantined streams."""

    entries: list[CatalogEntry]
    streams: dict[str, StreamLogicalState]
    quarantine: Quarantine
    #: The damaged files, one line each (``/healthz``): this read is their check at start.
    problems: list[str]
    #: Every stream name in the catalog's rows read (live, deleted, or of a consumer's row).
    catalogued: frozenset[str] = frozenset()

    def may_hold(self, name: str) -> bool:
        """Whether the store as read may hold rows of stream ``name``: its name is in the
        catalog, or in a damaged catalog file's range."""
        return name in self.catalogued or any(scope.names(name) for scope, _ in self.quarantine.ranges)


@dataclass(frozen=True, slots=True)
class KeptRows:
    """The rows a stream's new owner reads back after its fences (per-stream ownership), kept
    read from one claim to the next and between them (:class:`CheckedRows`)."""

    catalog: CheckedRows
    removals: CheckedRows
    acks: CheckedRows

    @classmethod
    def of(cls, root: StoreRoot) -> KeptRows:
        return cls(
            CheckedRows(root, sch.CATALOG, sch.CATALOG_SCHEMA),
            CheckedRows(root, sch.REMOVALS, sch.REMOVALS_SCHEMA),
            CheckedRows(root, sch.ACKS, sch.ACK_SCHEMA),
        )

    def follow(self) -> None:
        """Read what was added since the last read. Blocking."""
        for rows in (self.catalog, self.removals, self.acks):
            rows.read()


def load_store_state(
    root: StoreRoot,
    offline: Collection[tuple[Scope, str]] = (),
    only: Collection[str] | None = None,
    kept: KeptRows | None = None,
) -> StoreState:
    """Read ``catalog`` and ``removals`` with every file checked; the streams a damaged file may
    concern are quarantined and left out, the others come back exactly. ``offline`` adds the names
    a damaged log entry set aside at start may concern, with why (``repair.check_at_start``,
    ``storage_delta.tables.unresolved``). ``only``: the streams to recover (a gateway that just took
    them over, per-stream ownership); None: all. ``kept``: read through these (None: afresh).
    Blocking."""
    if kept is not None:
        (catalog, catalog_damage), (removals, removals_damage) = kept.catalog.read(), kept.removals.read()
    else:
        catalog, catalog_damage = _read(root, sch.CATALOG, sch.CATALOG_SCHEMA)
        removals, removals_damage = _read(root, sch.REMOVALS, sch.REMOVALS_SCHEMA)
    live = live_streams_of(catalog)
    known = set(catalog.column("stream").to_pylist())
    quarantine = Quarantine()
    # a catalog file's bounds are names of its rows (the one it lost may be the only row of it)
    damaged = [(Scope.of(bad.add), _why(sch.CATALOG, bad), True) for bad in catalog_damage]
    for scope, why, bounds_named in [*((scope, why, False) for scope, why in offline), *damaged]:
        quarantine.ranges.append((scope, why))
        named = {scope.first, scope.last or ""} if bounds_named else set()
        for name in sorted(known | named):
            if name and scope.names(name):
                quarantine.streams.setdefault(name, why)
    for bad in removals_damage:
        scope, why = Scope.of(bad.add), _why(sch.REMOVALS, bad)
        for name, created in live.items():
            if scope.concerns(name, created):
                quarantine.streams.setdefault(name, why)
    served = {
        name: created
        for name, created in live.items()
        if quarantine.reason(name) is None and (only is None or name in only)
    }
    problems = [
        f"damaged data file {table}/{bad.path} ({bad.add.get('num_records')} rows, "
        f"{Scope.of(bad.add).describe()}): {bad.reason}; see jetlake repair"
        for table, damage in ((sch.CATALOG, catalog_damage), (sch.REMOVALS, removals_damage))
        for bad in damage
    ]
    return StoreState(
        [e for e in entries_of(catalog) if e.stream in served],
        stream_states_of(served, removals),
        quarantine,
        problems,
        frozenset(known),
    )


def _read(root: StoreRoot, name: str, schema: pa.Schema) -> tuple[pa.Table, list[DamagedAdd]]:
    dt = open_existing(root, name)
    if dt is None:
        return schema.empty_table(), []
    return read_checked(root, dt, name, schema)


def _why(table: str, bad: DamagedAdd) -> str:
    return f"damaged {table} file {bad.path}, see jetlake repair"
