"""Warm handles on the tables a planner consults again and again: a Spark streaming query asks for
the newest offset every few milliseconds while it is idle and plans a micro-batch right after.

Loading the ``messages`` table anew (its checkpoint and every commit since) for each of those calls
cost tens of milliseconds, several times per micro-batch, and most of a message's way from its
PubAck to a ``foreachBatch``. A :class:`StoreFollower` keeps one handle per table and brings it to the
newest version only when a commit has landed (:func:`~storage_delta.commit.store.catch_up`: one look
for the next commit file when none has), and derives the listings and the logical view again only
when their table's version moved.
"""

from __future__ import annotations

from deltalake import DeltaTable

from storage_delta.commit.store import StoreRoot, catch_up, open_existing, read_whole
from storage_delta.format import schema as sch
from storage_delta.maintenance.files import LiveFile, live_files_of
from storage_delta.tables.removals import StreamLogicalState, live_streams_of, stream_states_of


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
        """The stream's live files at the ``messages`` table's newest version."""
        dt = self._newest(sch.MESSAGES)
        if dt is None:
            return []
        key = (stream, dt.version())
        if self._files is None or self._files[0] != key:
            self._files = (key, live_files_of(dt, stream))
        return self._files[1]

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
