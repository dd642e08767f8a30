"""A commit path for Delta tables that reads no table state: one JSON file per version, published with
put-if-absent, checked against the commits that landed meanwhile; on a local filesystem and on an
object store with conditional writes (S3).

Why not ``DeltaTable.create_write_transaction`` on the hot path: a delta-rs handle does not advance
past its own commit, so the next commit through it conflicts with the previous one (both carry a
``txn`` for the same app id) and must reload and retry; reload and commit each cost ~10 ms on this
kind of machine and grow with the table's state (on an object store about 10 requests a commit,
three of them listings of the log: 214 ms a commit on moto). And delta-rs never marks an append as
blind, so an append conflicts with any ``remove`` a retention or sealing job committed meanwhile,
even in another partition (delta-rs #3890), and a job's swap of files conflicts with every append
the gateway made meanwhile: under steady ingest the swap never wins. What really conflicts is
narrower, and this path checks just that: an append of new files reads nothing, so nothing
conflicts with it; a swap read the files it removes, so it conflicts only with a commit that removed
one of them too.

The protocol facts relied on (Delta protocol, "Delta Log Entries"): version ``n`` is the file
``_delta_log/<n:020>.json``, one action per line; a writer claims a version by creating that file
only if it does not exist (local filesystems: ``link(2)``, which fails on an existing name; S3: a
PUT with ``If-None-Match: *``; the mechanisms delta-rs uses too, so its commits and these exclude
each other); a table with ``minWriterVersion`` 2 and no writer features needs nothing beyond
``add``/``remove``/``txn``/``commitInfo`` from such a writer. Other object stores keep delta-rs's
commit, see :meth:`storage_delta.commit.store.StoreRoot.log_entries`.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

import obstore
from deltalake.transaction import AddAction, RemoveAction
from obstore.exceptions import AlreadyExistsError
from obstore.store import ObjectStore

from storage_delta.commit.durable import Unsynced, fsync_path, syncing
from storage_delta.commit.owner import (
    OWNER_APP,
    StreamEpochs,
    StreamFenced,
    check_epoch,
    stream_of_owner_app,
)
from storage_delta.format.integrity import LINES_KEY, lines_digest, side_by_side

Found = TypeVar("Found")

#: The ``commitInfo`` key of an entry's nonce: what makes an entry its writer's alone.
NONCE_KEY = "jetlakeNonce"

#: Writer protocol this appender understands; a table that asks for more is left to delta-rs.
SUPPORTED_WRITER_VERSION = 2


class UnsupportedTable(Exception):
    """A concurrent commit changed the table's protocol or metadata: blind appends are not safe."""


class ConcurrentRemoval(Exception):
    """A commit that landed meanwhile removed a file this swap removes: the swap's plan is stale."""


class BelowTrim(ConcurrentRemoval):
    """The version this writer would claim is at or below the newest checkpoint and its entry is
    gone: the log was trimmed there, so the version's free name does not mean a free version, and
    the commits in between cannot be looked at. Only a writer that fell behind by a trim gets there
    (a swap planned on a stale handle: abandoned, as a swap that lost a race is; an append: it
    catches up from the checkpoint, :meth:`~storage_delta.commit.append.TableAppender._commit`).
    Versions at or below the checkpoint whose entries are still there are passed one by one, as
    any version another writer took (a compaction's swaps and the checkpoint after them)."""


def commit_path(log_dir: str, version: int) -> str:
    return os.path.join(log_dir, f"{version:020d}.json")


def checkpointed_version(log_dir: str) -> int:
    """The version ``_last_checkpoint`` names (its commits from there on are all present), or -1."""
    try:
        with open(os.path.join(log_dir, "_last_checkpoint"), "rb") as fh:
            return version_named(fh.read())
    except OSError:
        return -1


def version_named(last_checkpoint: bytes) -> int:
    """The version a ``_last_checkpoint``'s bytes name, or -1 when they do not parse."""
    try:
        return int(json.loads(last_checkpoint)["version"])
    except (ValueError, KeyError, TypeError):
        return -1


def add_line(add: AddAction) -> dict[str, Any]:
    return {
        "add": {
            "path": add.path,
            "partitionValues": dict(add.partition_values),
            "size": add.size,
            "modificationTime": add.modification_time,
            "dataChange": add.data_change,
            "stats": add.stats,
        }
    }


def remove_line(remove: RemoveAction) -> dict[str, Any]:
    return {
        "remove": {
            "path": remove.path,
            "deletionTimestamp": remove.deletion_timestamp,
            "dataChange": remove.data_change,
            "extendedFileMetadata": True,
            "partitionValues": dict(remove.partition_values or {}),
            "size": remove.size,
        }
    }


def commit_info(operation: str, blind: bool, now: int) -> dict[str, Any]:
    return {
        "commitInfo": {
            "timestamp": now,
            "operation": operation,
            "clientVersion": "jetlake",
            "isBlindAppend": blind,
        }
    }


class LogEntries(ABC):
    """Where a table's log entries are: each version's entry created only if that version is free
    (put-if-absent), and read back by version."""

    @abstractmethod
    def staged(
        self, encode: Callable[[], bytes], unsynced: Sequence[str]
    ) -> AbstractContextManager[Callable[[int], bytes | None]]:
        """The entry ``encode`` makes, ready to be claimed: the context gives ``claim(version)``,
        None once the entry holds that version (and is durable), else the entry of the other writer
        that holds it (:class:`BelowTrim` when it was trimmed before it could be read).
        ``unsynced``: local files the entry names, on stable storage before it can be claimed (a
        root that syncs)."""

    @abstractmethod
    def read(self, version: int) -> bytes | None:
        """The entry of ``version``; None when there is none."""

    def taken_from(self, version: int) -> list[tuple[int, bytes]]:
        """The versions taken from ``version`` on, up to the first free one as one look finds
        them (others may be taken meanwhile), each with its entry, in order."""
        taken = []
        while (entry := self.read(version)) is not None:
            taken.append((version, entry))
            version += 1
        return taken

    @abstractmethod
    def trimmed(self, version: int) -> bool:
        """Whether ``version`` is at or below the newest checkpoint and its entry is gone: a free
        name that is not a free version (:class:`BelowTrim`)."""


def _held(version: int, entry: Found | None) -> Found:
    """The entry found holding ``version`` when a claim of it failed: gone means trimmed since."""
    if entry is None:
        raise BelowTrim(f"version {version} was trimmed while this writer passed it")
    return entry


class LocalLogEntries(LogEntries):
    """A local table's log: an entry is written and synced beside the log, then linked to its
    version's name (``link(2)`` fails on an existing name, the mechanism delta-rs uses locally),
    and the log directory synced after: two rounds of syncs per commit."""

    def __init__(self, table_path: str, sync: bool = True, unsynced: Unsynced | None = None) -> None:
        #: Whether a commit is on stable storage when it returns (``sync_interval`` ``always``).
        self.sync = sync
        #: Without ``sync``: where a linked entry is noted for the flusher (a duration interval).
        self.unsynced = unsynced
        self.log_dir = os.path.join(table_path, "_delta_log")
        # Commits are staged beside the log, not in it: every create and unlink in ``_delta_log``
        # is a chance for a concurrent listing to miss an entry (see ``tables.retry_listing``).
        self.staging_dir = os.path.join(table_path, "_jetlake_staging")
        os.makedirs(self.staging_dir, exist_ok=True)

    @contextmanager
    def staged(
        self, encode: Callable[[], bytes], unsynced: Sequence[str]
    ) -> Iterator[Callable[[int], bytes | None]]:
        tmp = os.path.join(self.staging_dir, f"{uuid.uuid4().hex}.json")
        # the entry's bytes, and the files it names, are down before its name can be (the files'
        # syncs start first and run while the entry is encoded and written)
        with syncing(unsynced if self.sync else ()):
            body = encode()
            with open(tmp, "wb") as fh:
                fh.write(body)
            if self.sync:
                fsync_path(tmp)

        def claim(version: int) -> bytes | None:
            try:
                os.link(tmp, commit_path(self.log_dir, version))
            except FileExistsError:
                return _held(version, self.read(version))
            if self.sync:
                fsync_path(self.log_dir)  # the new name: now the commit survives a power cut
            elif self.unsynced is not None:
                self.unsynced.log([commit_path(self.log_dir, version)], self.log_dir)
            return None

        try:
            yield claim
        finally:
            os.unlink(tmp)

    def read(self, version: int) -> bytes | None:
        try:
            with open(commit_path(self.log_dir, version), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    def trimmed(self, version: int) -> bool:
        return version <= checkpointed_version(self.log_dir) and not os.path.exists(
            commit_path(self.log_dir, version)
        )


class ObjectLogEntries(LogEntries):
    """A table's log on an object store with conditional writes (S3's ``If-None-Match: *``, which
    delta-rs's own commits there use too, so the two exclude each other): an entry is one PUT that
    fails on an existing name, durable once it returns. A PUT whose answer was lost and which was
    retried finds its own entry there: an entry holding exactly the same bytes is ours (each
    carries a nonce), so a commit never lands unawares, which a swap without a ``txn`` relies on."""

    def __init__(self, store: ObjectStore, retention_s: float) -> None:
        #: The store, rooted at the table's folder.
        self.store = store
        #: A bound below the age at which the log's entries may be trimmed (delta-rs trims those
        #: older than the table's ``delta.logRetentionDuration``, 30 days unless set; jetlake's
        #: ``log_retention_ms``, an hour by default, is not longer on the tables it makes).
        self.retention_s = retention_s
        #: The version after this writer's last claim, and until when it cannot be trimmed
        #: (monotonic): see :meth:`trimmed`.
        self._untrimmed: tuple[int, float] = (-1, 0.0)

    @contextmanager
    def staged(
        self, encode: Callable[[], bytes], unsynced: Sequence[str]
    ) -> Iterator[Callable[[int], bytes | None]]:
        assert not unsynced, "nothing to sync on an object store"
        body = encode()

        def claim(version: int) -> bytes | None:
            try:
                obstore.put(self.store, _entry_key(version), body, mode="create")
            except AlreadyExistsError:
                held, age = _held(version, self._read_aged(version))
                if held != body:
                    self._young(version, age)
                    return held
            self._young(version, 0.0)
            return None

        yield claim

    def read(self, version: int) -> bytes | None:
        found = self._read_aged(version)
        return None if found is None else found[0]

    def _read_aged(self, version: int) -> tuple[bytes, float] | None:
        """The entry of ``version`` and its age in seconds (by the store's clock against ours)."""
        try:
            got = obstore.get(self.store, _entry_key(version))
        except FileNotFoundError:
            return None
        return bytes(got.bytes()), time.time() - got.meta["last_modified"].timestamp()

    def _young(self, version: int, age: float) -> None:
        """``version``'s entry is ``age`` seconds old: every later entry is younger, so for half
        the log retention less that age none of them can have been trimmed, and the claim of the
        next version need not look (:meth:`trimmed`)."""
        if age < self.retention_s / 2:
            self._untrimmed = (version + 1, time.monotonic() + self.retention_s / 2 - age)

    def taken_from(self, version: int) -> list[tuple[int, bytes]]:
        """One listing of the log from ``version`` on, then the entries it shows read side by
        side. A writer that lost a version to a busy one read the versions one after another
        (a PUT refused, a GET, a look for a trim: 0.1 s each on a loaded moto) and fell further
        behind a writer committing more often than that: a stream's fence took 11 s while the
        other gateway's sync publishers committed (bench.several_gateways on S3, #19)."""
        ages: dict[int, float] = {}
        now = time.time()
        for page in obstore.list(
            self.store, "_delta_log/", offset=_entry_key(version - 1) if version else None
        ):
            for meta in page:
                name = str(meta["path"]).rpartition("/")[2]
                if _ENTRY.fullmatch(name) is not None and int(name[:20]) >= version:
                    ages[int(name[:20])] = now - meta["last_modified"].timestamp()
            if len(ages) > TAKEN_AT_ONCE:  # a writer far behind: the rest at the next look
                break
        run = list(itertools.takewhile(lambda v: v in ages, range(version, version + TAKEN_AT_ONCE)))
        if run:
            self._young(run[-1], ages[run[-1]])
        taken = []
        for v, entry in zip(run, side_by_side(self.read, run), strict=True):
            if entry is None:  # trimmed since the listing: a claim of it finds out
                break
            taken.append((v, entry))
        return taken

    def trimmed(self, version: int) -> bool:
        """Without a request for the version after this writer's last claim, for half the
        retention after it: that version's entry, if there is one, was written after ours (its
        writer saw ours taken), so it is younger than that and no trim removed it. A sync
        publisher's commits then cost two PUTs, not two PUTs and a GET of ``_last_checkpoint``."""
        after, until = self._untrimmed
        if version == after and time.monotonic() < until:
            return False
        try:
            found = bytes(obstore.get(self.store, "_delta_log/_last_checkpoint").bytes())
        except FileNotFoundError:
            return False
        if version > version_named(found):
            return False
        try:
            obstore.head(self.store, _entry_key(version))
        except FileNotFoundError:
            return True
        return False


#: Versions another writer took that one look (:meth:`ObjectLogEntries.taken_from`) reads at most:
#: a writer far behind holds no more entries than these at once.
TAKEN_AT_ONCE = 1000

#: The name of a log entry (a version's JSON) in ``_delta_log``.
_ENTRY = re.compile(r"\d{20}\.json")


def _entry_key(version: int) -> str:
    """The object key of ``version``'s log entry, under a table's folder."""
    return f"_delta_log/{version:020d}.json"


class LogAppender:
    """Claims the next version of a Delta table's log (:class:`LogEntries`: local or on an object
    store) for a commit of ``add`` actions, or of a swap of files (``remove`` and ``add`` actions).

    Not thread-safe: one appender per table per process, used from one thread at a time.
    """

    def __init__(
        self,
        entries: LogEntries,
        next_version: int,
        owner: int | None = None,
        streams: StreamEpochs | None = None,
        table_epoch: Callable[[str], int] | None = None,
    ) -> None:
        self.entries = entries
        #: The stream leases this writer holds, when each stream is fenced on its own (per-stream
        #: ownership): a commit carries the epochs of the streams it touches, and a version met on
        #: the way with a higher one of a touched stream stops it (:class:`StreamFenced`).
        self.streams = streams
        #: A stream's owner epoch in the table as of the version this appender started from;
        #: :attr:`seen` adds the epochs of every version it found taken since, so together they
        #: are the table's epochs up to ``next_version - 1`` (versions are contiguous).
        self.table_epoch = table_epoch
        self.seen: dict[str, int] = {}
        #: The owner epoch this writer commits under: carried by each commit, and a commit met on
        #: the way to a free version with a higher one stops it (:class:`~storage_delta.commit.owner.Fenced`).
        self.owner = owner
        #: The newest owner epoch met in the versions passed: once past :attr:`owner` this writer
        #: stays fenced, whatever free version it comes to next.
        self.owner_seen = 0
        self.next_version = next_version

    def append(
        self,
        adds: Iterable[AddAction],
        txn: tuple[str, int],
        more_txns: Iterable[tuple[str, int]] = (),
        unsynced: Sequence[str] = (),
        streams: Collection[str] = (),
    ) -> int:
        """Commit ``adds`` with the app transaction ``txn`` (and ``more_txns``) as one version;
        returns that version. ``unsynced``: paths (the added files, their directories) that must
        be on stable storage before the entry is linked; with ``sync`` they are synced together
        with the entry. ``streams``: the streams whose rows ``adds`` hold, checked against the
        stream leases (:class:`StreamFenced` before anything is linked when one was fenced).

        Versions other writers claimed meanwhile are skipped after a look at their actions: a
        ``txn`` of ours at or past ``txn`` means this very commit landed before (a retry after an
        error, delta-rs #2509), so nothing is written twice; a protocol or metadata change stops
        the blind append (:class:`UnsupportedTable`).
        """
        now = int(time.time() * 1000)
        fence = [(OWNER_APP, self.owner)] if self.owner is not None and txn[0] != OWNER_APP else []
        if self.streams is not None and streams:
            self._check_streams(streams)
            fence += [t for t in self.streams.txns(streams) if t[0] != txn[0]]
        lines = [
            commit_info("WRITE", True, now),
            *(
                {"txn": {"appId": app, "version": v, "lastUpdated": now}}
                for app, v in [txn, *more_txns, *fence]
            ),
            *(add_line(a) for a in adds),
        ]
        return self._claim(lines, lambda v, entry: self._landed_or_check(v, entry, txn, streams), unsynced)

    def _epoch_in_table(self, stream: str) -> int:
        base = self.table_epoch(stream) if self.table_epoch is not None else 0
        return max(base, self.seen.get(stream, 0))

    def _check_streams(self, streams: Collection[str]) -> None:
        """:class:`StreamFenced` for the streams of ``streams`` this writer may not commit."""
        assert self.streams is not None
        fenced = self.streams.fenced(streams, self._epoch_in_table)
        if fenced:
            raise StreamFenced(fenced)

    def swap(self, removes: Sequence[RemoveAction], adds: Iterable[AddAction], operation: str) -> int:
        """Commit the removal of ``removes`` and the addition of ``adds`` as one version; returns it.

        The caller read ``removes`` as live at version ``next_version - 1``. Commits that landed
        since are checked, not reloaded: one that removed any of the same files raises
        :class:`ConcurrentRemoval` (another job got there first), a protocol or metadata change
        :class:`UnsupportedTable`; appends of other files are no conflict. No ``txn`` is needed:
        a claim takes the version or fails (a retried PUT knows its own entry), so a swap never
        lands unawares.
        """
        gone = {r.path for r in removes}
        lines = [
            commit_info(operation, False, int(time.time() * 1000)),
            *(remove_line(r) for r in removes),
            *(add_line(a) for a in adds),
        ]
        return self._claim(lines, lambda v, entry: self._check_removals(v, entry, gone))

    def _claim(
        self,
        lines: list[dict[str, Any]],
        landed: Callable[[int, bytes], bool],
        unsynced: Sequence[str] = (),
    ) -> int:
        """Claim the first free version for the commit; ``landed(v, entry)`` judges a version
        taken by another writer (True: our commit is already there). After two versions lost in a
        row, the ones taken after them are passed as one look finds them
        (:meth:`LogEntries.taken_from`) before the next claim: one lost version (two writers
        committing side by side) costs a refused PUT and a GET, a writer behind a busy one a
        listing for all it missed."""
        check_epoch(self.owner_seen, self.owner)

        def encode() -> bytes:
            rest = [json.dumps(line, separators=(",", ":")).encode() for line in lines[1:]]
            # The commitInfo (first) records a CRC-32 per following line: a flipped bit that still
            # parses, or a tail cut at a line's end, is found, and by its line (format/integrity.py).
            # Its nonce makes the entry this writer's alone (ObjectLogEntries).
            info = {**lines[0]["commitInfo"], LINES_KEY: lines_digest(rest), NONCE_KEY: uuid.uuid4().hex}
            head = {"commitInfo": info}
            return b"\n".join([json.dumps(head, separators=(",", ":")).encode(), *rest]) + b"\n"

        lost = 0  # versions lost in a row: one is the usual race, more a writer behind
        with self.entries.staged(encode, unsynced) as claim:
            while True:
                version = self.next_version
                if self.entries.trimmed(version):
                    raise BelowTrim(f"version {version} is below the newest checkpoint and trimmed")
                held = claim(version)
                self.next_version = version + 1
                if held is None:
                    return version
                passed = [(version, held)]
                if lost:  # behind by more than one version: the rest as one look finds them
                    passed += self.entries.taken_from(version + 1)
                lost += 1
                for taken, entry in passed:
                    self.next_version = taken + 1
                    if landed(taken, entry):
                        return taken

    def _passed(self, version: int, entry: bytes) -> list[dict[str, Any]]:
        """The actions of another writer's commit; a protocol or metadata change stops us, and so
        does a newer owner's epoch (before anything in the commit is taken for ours: a new owner's
        txn versions may equal the ones we are committing)."""
        actions = [json.loads(raw) for raw in entry.splitlines()]
        for action in actions:
            t = action.get("txn")
            if t is None:
                continue
            app = str(t.get("appId"))
            if app == OWNER_APP:
                self.owner_seen = max(self.owner_seen, int(t.get("version", 0)))
                check_epoch(self.owner_seen, self.owner)
            elif (stream := stream_of_owner_app(app)) is not None:
                self.seen[stream] = max(self.seen.get(stream, 0), int(t.get("version", 0)))
        if any("protocol" in action or "metaData" in action for action in actions):
            raise UnsupportedTable(f"version {version} changed the table's protocol or schema")
        return actions

    def follow(self) -> None:
        """Pass the versions other writers made since, up to the first free one, as a claim would
        (their epochs remembered; :class:`Fenced` or :class:`UnsupportedTable` as there), without
        claiming anything: a standby keeps its position so, and its first commit after a takeover
        does not read all of them then. One read when nothing changed; else the versions taken as
        one look finds them (:meth:`LogEntries.taken_from`: on an object store one listing from
        there, not a delta-rs handle's catch-up, which lists the whole log)."""
        entry = self.entries.read(self.next_version)  # what a quiet table costs: this one request
        if entry is None:
            return
        self._passed(self.next_version, entry)
        self.next_version += 1
        while True:  # another look only after one that stopped at its bound, not to confirm the end
            taken = self.entries.taken_from(self.next_version)
            for version, passed in taken:
                self._passed(version, passed)
                self.next_version = version + 1
            if len(taken) < TAKEN_AT_ONCE:
                return

    def _landed_or_check(
        self, version: int, entry: bytes, txn: tuple[str, int], streams: Collection[str] = ()
    ) -> bool:
        """True when another writer's commit holds our ``txn`` (so ours is already committed);
        :class:`StreamFenced` when it fenced a stream of ``streams`` (the epochs are looked at
        first: a new owner's txn versions are not ours)."""
        actions = self._passed(version, entry)
        if self.streams is not None and streams:
            self._check_streams(streams)
        for action in actions:
            t = action.get("txn")
            if t is not None and t.get("appId") == txn[0] and int(t.get("version", -1)) >= txn[1]:
                return True
        return False

    def _check_removals(self, version: int, entry: bytes, gone: set[str]) -> bool:
        for action in self._passed(version, entry):
            r = action.get("remove")
            if r is not None and r.get("path") in gone:
                raise ConcurrentRemoval(f"version {version} removed {r.get('path')} first")
        return False
