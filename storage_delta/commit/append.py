"""The one way rows get into a jetlake table: an append tagged with an app transaction, idempotent,
retried, conflict-aware. Every table (messages, acks, catalog, removals, job runs, ack floors) appends
through :class:`TableAppender`; only the jobs' swap of files (:mod:`storage_delta.maintenance.files`)
commits otherwise, because it removes what it read.

The rules, in the order a commit meets them (docs/storage.md):

* a commit carries the Delta ``txn`` ``(app_id, version)``; ``version`` grows by one per commit of an
  appender and is recovered from the table (``transaction_version``) when one opens. Fenced per
  stream (per-stream ownership, docs/perstream-status.md) it carries ``(app_id/<S>, base + version)``
  for each stream ``S`` it touches instead, and the stream's owner epoch;
* a version at or below what the table already holds for ``app_id`` is not written again: that is
  how a retry after an error that hid a success (delta-rs #2509) lands once;
* on a local store root and on S3 the commit is a blind append through :class:`LogAppender`
  (put-if-absent of the next log entry; it reads no table state), on any other object store
  delta-rs commits it through a live handle; a lost race there is a :class:`CommitConflict`, after
  which the handle catches up and the txn marker decides between "it landed" and "try again",
  ``retries`` times;
* every ``checkpoint_every`` commits (and, for a table that asks, no sooner than
  ``checkpoint_min_interval_s`` after the previous one unless ten intervals of commits have passed)
  a checkpoint and the log's trim run beside the commits, on a thread of their own, one at a time,
  so a restart replays little and no commit waits for one, on a root that syncs too
  (:mod:`storage_delta.commit.checkpoint`);
* on a root that syncs (``sync_interval`` ``always``) a commit's data files, its log entry and the
  directory entries it made are on stable storage when ``append`` returns
  (:mod:`storage_delta.commit.durable`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from deltalake.transaction import AddAction

from storage_delta.commit.checkpoint import checkpoint_local, checkpoint_table, trim_log
from storage_delta.commit.deltalog import BelowTrim, LogAppender, UnsupportedTable, checkpointed_version
from storage_delta.commit.durable import sync_together
from storage_delta.commit.owner import (
    OWNER_APP,
    StreamEpochs,
    StreamFenced,
    check_epoch,
    commit_without_fenced,
    stream_count_base,
    stream_owner_app,
)
from storage_delta.commit.store import (
    CommitConflict,
    StoreRoot,
    blind_appends_allowed,
    catch_up,
    commit_adds,
    newest_version,
    open_or_create,
    write_data_file,
)
from storage_delta.commit.txns import app_version, note_commit

log = logging.getLogger(__name__)

#: One data file of a commit: its partition values and its rows.
Part = tuple[Mapping[str, str], pa.Table]


@dataclass(frozen=True, slots=True)
class TableSpec:
    """What a table is: its name under the store root, its schema and its partition columns."""

    name: str
    schema: pa.Schema
    partition_by: tuple[str, ...] = ()


class TableAppender:
    """Appends to one table under one app id. Blocking: call it on a worker thread. Commits of one
    appender are serialized (a lock), so callers on several threads keep its versions in order."""

    def __init__(
        self,
        root: StoreRoot,
        spec: TableSpec,
        app_id: str | None,
        checkpoint_every: int = 100,
        retries: int = 5,
        log_keep_entries: int | None = None,
        streams: StreamEpochs | None = None,
        checkpoint_min_interval_s: float = 0.0,
    ) -> None:
        self.root = root
        self.spec = spec
        self.app_id = app_id
        self.dt = open_or_create(root, spec.name, spec.schema, list(spec.partition_by))
        entries = root.log_entries(spec.name)
        #: The stream leases this appender's writer holds, when each stream has an owner of its own:
        #: then every commit is fenced per stream (the streams it touches) instead of by the
        #: store's epoch, which other gateways' commits to the same table do not carry.
        self.streams = streams
        #: The owner epoch of the store's lease this appender writes under (None: outside it, or
        #: fenced per stream).
        self.epoch = root.epoch if app_id is not None and streams is None else None
        #: jetlake's own commit (put-if-absent of the log entry), where the store allows it;
        #: None: delta-rs's (another object store, or a table beyond what a blind append assumes).
        self._log = (
            LogAppender(entries, self.dt.version() + 1, self.epoch, streams, self._stream_epoch)
            if entries is not None and app_id is not None and blind_appends_allowed(self.dt)
            else None
        )
        self._retries = retries
        self._checkpoint_every = checkpoint_every
        self._checkpoint_min_interval_s = checkpoint_min_interval_s
        #: This appender's commits when its last hygiene round started, and when (monotonic).
        self._hygiene_at = (0, -float("inf"))
        #: The trim's bound on the log by entries (:func:`~storage_delta.commit.checkpoint.trim_log`).
        self._log_keep_entries = log_keep_entries
        #: Per stream, the epoch this appender fenced it under and the base of its count there
        #: (:func:`~storage_delta.commit.owner.stream_count_base`): its commits carry ``base +
        #: version``, so the stream's versions keep growing across owners whatever each writer's
        #: own count is. A stream held under another epoch than fenced here is not written.
        self._bases: dict[str, tuple[int, int]] = {}
        #: Per stream, the version of the handle it was asked at and its owner epoch there
        #: (:meth:`_stream_epoch`); answers as of ``_epochs_from`` or later hold.
        self._epochs: dict[str, tuple[int, int]] = {}
        self._epochs_from = self.dt.version()
        self._commits = 0
        self._lock = threading.Lock()
        self._hygiene_pool: ThreadPoolExecutor | None = None
        self._hygiene_running: Future[None] | None = None
        if self.epoch is not None:
            self._fence(self.epoch)
        self._landed = self.committed_version()

    def _fence(self, epoch: int) -> None:
        """Commit the owner epoch ``epoch`` alone, before anything of the table is read to recover:
        a writer of an older epoch meets it on its way to any later version and stops
        (:mod:`storage_delta.commit.owner`)."""
        if self._log is not None:
            self._log.append([], (OWNER_APP, epoch))
        else:
            self._commit_delta_rs([], None, [(OWNER_APP, epoch)])

    def _stream_epoch(self, stream: str, exact: bool = False) -> int:
        """``stream``'s owner epoch as of the handle's version, or a newer one: delta-rs reads a
        snapshot's app transactions from its log entries when first asked, and those of a handle
        left behind a trim are gone (another writer's checkpoint went past it), so that handle
        catches up first. A newer version's epoch only refuses sooner what a fence already
        refuses (it landed before any commit of ours still to come).

        Asked of delta-rs once and remembered (each ask scans the snapshot's app transactions,
        which grow with the streams, and it came at every commit): an answer as of a version at
        or past :attr:`_epochs_from` still holds. Through jetlake's own commit the log appender reads
        every version it passes after that one itself (``LogAppender.seen``), so older answers are
        never needed; through delta-rs, the handle's version is where a commit goes on from.
        ``exact``: as of the handle's version, whatever the log appender read."""
        dt = self.dt  # hygiene may swap it meanwhile: one handle for the version and the answer
        floor = self._epochs_from if self._log is not None and not exact else dt.version()
        known = self._epochs.get(stream)
        if known is not None and known[0] >= floor:
            return known[1]
        version = dt.version()
        try:
            epoch = app_version(self.root, self.spec.name, dt, stream_owner_app(stream))
        except DeltaError:
            catch_up(dt)
            version = dt.version()
            epoch = app_version(self.root, self.spec.name, dt, stream_owner_app(stream))
        self._epochs[stream] = (version, epoch)
        return epoch

    def _jumped(self) -> None:
        """The log appender goes on from the handle's version (caught up), past versions it has
        not read: the epochs remembered from before are asked again (:meth:`_stream_epoch`)."""
        self._epochs_from = max(self._epochs_from, self.dt.version())

    def version_now(self) -> int:
        """The handle's version: a stream first claimed after this call has no epoch in it
        (:meth:`take_unwritten`)."""
        return self.dt.version()

    def follow(self) -> None:
        """Bring this writer forward to the table's newest version (other gateways' commits), so
        that its next commit, a claim's fence among them, does not catch up on all of them first:
        a handle that had not committed yet read every entry since the checkpoint one after
        another at its first fence (0.3 to 0.9 s of the S3 takeover test's acks fence, against
        0.1 s for the tables it had written). Through jetlake's own commit the log appender reads
        the new entries itself (:meth:`LogAppender.follow`: a GET each, and one when nothing
        changed, where a delta-rs catch-up lists the log first); a table beyond what it appends to
        blindly is left to the next commit, which turns to delta-rs."""
        with self._lock:
            if self._log is not None:
                with contextlib.suppress(UnsupportedTable):
                    self._log.follow()
                return
            catch_up(self.dt)
            self._jumped()
            app_version(self.root, self.spec.name, self.dt, OWNER_APP)

    def _check_streams(self, streams: Collection[str]) -> None:
        """:class:`StreamFenced` for the streams of ``streams`` the handle shows fenced."""
        if self.streams is not None and streams:
            fenced = self.streams.fenced(streams, self._stream_epoch)
            if fenced:
                raise StreamFenced(fenced)

    def fence_streams(self, streams: Collection[str], before: int) -> frozenset[str]:
        """Commit the owner epochs held for ``streams`` (in :attr:`streams`), all in one commit,
        before anything of them is read to recover: a writer of an older epoch of one meets the
        fence on its way to any later version and drops that stream's rows. Returns the streams
        not fenced here: not held, or a newer epoch is there already (the lease moved on again);
        the others are fenced. ``before``: as for :meth:`take_unwritten`."""
        assert self.streams is not None, "fence_streams on an appender fenced by the store's epoch"
        held = self.streams
        lost = frozenset(s for s in streams if held.epoch(s) is None)
        self._claimed_after(streams, before)

        def attempt(left_out: frozenset[str]) -> None:
            names = sorted(set(streams) - lost - left_out)
            if not names:
                return
            if self._log is not None:
                epoch = held.epoch(names[0])
                if epoch is None:
                    raise StreamFenced(frozenset(names[:1]))
                self._log.append([], (stream_owner_app(names[0]), epoch), streams=names)
            else:
                self._commit_delta_rs([], None, [], names)

        with self._lock:
            lost |= commit_without_fenced(attempt)
            # After the fence no older owner's commit of a stream lands; ours are counted above
            # every one of theirs.
            for stream in set(streams) - lost:
                epoch = held.epoch(stream)
                if epoch is None:  # dropped meanwhile
                    lost |= {stream}
                    continue
                self._bases[stream] = (epoch, stream_count_base(epoch))
        return lost

    def take_unwritten(self, streams: Collection[str], before: int) -> None:
        """Write ``streams`` from now on without a fence: streams whose lease this writer claimed
        as its first epoch, with no name in the catalog from before (``StreamClaims.claim``), so no
        writer has ever committed a row of them (a per-stream writer needs a claim, and the store's
        single owner a catalog entry). There is no previous owner to fence, nothing to read back,
        and each one's dedup count starts at its base. A later owner fences them as any other.
        ``before``: a version of the table (:meth:`version_now`) taken before the claims."""
        assert self.streams is not None, "take_unwritten on an appender fenced by the store's epoch"
        self._claimed_after(streams, before)
        with self._lock:
            for stream in streams:
                epoch = self.streams.epoch(stream)
                if epoch is not None:
                    self._bases[stream] = (epoch, stream_count_base(epoch))

    def _claimed_after(self, streams: Collection[str], before: int) -> None:
        """``streams`` were just claimed, after the table was at version ``before``: an epoch of
        one there is below the one claimed (a lease's epochs are claimed one after another, and
        each is fenced after its claim). Remembered as 0 (:meth:`_stream_epoch`), which decides
        as the true one does: the epoch is only ever compared with the one held, the claimed
        one or a later claim's. So a claim of many streams asks delta-rs nothing."""
        with self._lock:
            for stream in streams:
                self._epochs[stream] = (before, 0)

    def dedup_app(self, stream: str) -> str:
        """The app id of ``stream``'s commits in the table when fenced per stream: the landed
        check of a commit asks it, and it is continued by each next owner of the stream (one app
        id per stream, not one per writer: a writer's would add an app id to the table's snapshot
        for every process ever started)."""
        assert self.app_id is not None
        return f"{self.app_id}/{stream}"

    def _txns(self, version: int | None, streams: Collection[str]) -> list[tuple[str, int]]:
        """The dedup txns a commit of ``version`` carries: ``(app_id, version)``, or fenced per
        stream one ``(dedup_app(S), base + version)`` per stream ``S`` it touches."""
        if self.app_id is None or version is None:
            return []
        if self.streams is None:
            return [(self.app_id, version)]
        return [(self.dedup_app(s), self.stream_version(s, version)) for s in sorted(set(streams))]

    def stream_version(self, stream: str, version: int) -> int:
        """The version of ``stream``'s dedup txn a commit of ``version`` carries (fenced per stream;
        the stream fenced by this appender): a table whose rows record their commit's number (the
        catalog's ``rev``) records this one, which grows across the stream's owners."""
        return self._bases[stream][1] + version

    def _check_fenced_here(self, streams: Collection[str]) -> None:
        """:class:`StreamFenced` for the streams of ``streams`` not fenced by this appender under
        the epoch held now: a writer must fence a stream before it writes it (the count of the
        stream's dedup txn is taken there)."""
        if self.streams is not None:
            unfenced = frozenset(
                s for s in streams if (b := self._bases.get(s)) is None or b[0] != self.streams.epoch(s)
            )
            if unfenced:
                raise StreamFenced(unfenced)

    def committed_version(self) -> int:
        """The newest version of this appender's app id the table holds (0 before the first);
        fenced per stream, the newest of this appender's versions among the streams it still
        holds. :class:`~storage_delta.commit.owner.Fenced` when a newer owner holds the table: its
        versions are not ours, so they must not be taken for commits of ours that landed."""
        if self.app_id is None:
            return 0
        catch_up(self.dt)
        check_epoch(app_version(self.root, self.spec.name, self.dt, OWNER_APP), self.epoch)
        if self.streams is None:
            return app_version(self.root, self.spec.name, self.dt, self.app_id)
        # Fenced per stream: the newest of our versions among the streams we still hold (a
        # fenced stream's count goes on under its new owner and says nothing of ours).
        held = self.streams.streams()
        ours = held - self.streams.fenced(held, lambda s: self._stream_epoch(s, exact=True))
        return max(
            [
                0,  # (a stream not yet committed by us holds a version below our base, or none)
                *(
                    app_version(self.root, self.spec.name, self.dt, self.dedup_app(s)) - b[1]
                    for s in ours
                    if (b := self._bases.get(s)) is not None and b[0] == self.streams.epoch(s)
                ),
            ]
        )

    def transaction_version(self, app_id: str) -> int:
        """The newest version the table holds of another app id (a stream source's position)."""
        with self._lock:
            catch_up(self.dt)
            return app_version(self.root, self.spec.name, self.dt, app_id)

    def next_version(self) -> int:
        """The version the next commit should carry: one past what is committed or in hand."""
        return max(self._landed, self.committed_version()) + 1

    def append(
        self,
        parts: Sequence[Part],
        version: int | None,
        more_txns: Sequence[tuple[str, int]] = (),
        streams: Collection[str] = (),
    ) -> None:
        """Write ``parts`` as data files and commit them as one version tagged ``(app_id, version)``.

        A version that already landed is not stored again. Without an app id (``version`` None) the
        append is not idempotent: for rows that are never retried after a reported success.
        ``streams``: the streams whose rows ``parts`` hold, when :attr:`streams` fences per stream;
        :class:`StreamFenced` names those this writer may no longer commit, and nothing is
        committed then (the caller commits the rest without them)."""
        with self._lock:
            if version is not None and version <= self._landed:
                return
            self._check_fenced_here(streams)
            self._check_streams(streams)
            # On a root that syncs, the data files (and their directories) are synced together
            # with the log entry, just before it is linked: one round of syncs per commit.
            unsynced: list[str] = []
            adds = [
                write_data_file(self.root, self.spec.name, partition, rows, later=unsynced)
                for partition, rows in parts
            ]
            self._commit(adds, version, more_txns, unsynced, streams)
            if version is not None:
                self._landed = version
            self._commits += 1
            if self._checkpoint_due():
                self._start_hygiene()

    def _commit(
        self,
        adds: list[AddAction],
        version: int | None,
        more_txns: Sequence[tuple[str, int]],
        unsynced: Sequence[str],
        streams: Collection[str],
    ) -> None:
        """Commit ``adds``; ``unsynced``: the paths of their files still to be synced before
        anything names them."""
        txns = self._txns(version, streams)
        txn = txns[0] if txns else None
        more_txns = [*txns[1:], *more_txns]
        if self._log is not None and txn is not None:
            try:
                self._log.append(adds, txn, more_txns, unsynced, streams)
                return
            except BelowTrim:
                # Behind a trim: the versions in between are in the checkpoint only. Look again
                # from there (the owner's fence and our txn are in the snapshot) and go on past it.
                if self._catch_up_landed(txn, streams):
                    return  # it landed before the trim
                self._log.next_version = self.dt.version() + 1
                self._log.append(adds, txn, more_txns, unsynced, streams)
                return
            except UnsupportedTable:
                # Someone changed the table beyond what a blind append may assume: look again, and
                # let delta-rs judge it from now on unless it still allows blind appends.
                catch_up(self.dt)
                self._jumped()
                check_epoch(app_version(self.root, self.spec.name, self.dt, OWNER_APP), self.epoch)
                if blind_appends_allowed(self.dt):
                    self._log.next_version = self.dt.version() + 1
                    self._log.append(adds, txn, more_txns, unsynced, streams)
                    return
                self._log = None
        if unsynced:
            sync_together(unsynced)
        self._commit_delta_rs(adds, txn, more_txns, streams)

    def _catch_up_landed(self, txn: tuple[str, int] | None, streams: Collection[str]) -> bool:
        """Catch the handle up and say whether it holds ``txn`` (the commit landed; never without
        a txn). The epochs are looked at first: a newer owner's versions of a stream are not ours.
        The log appender goes on from here if it did not land."""
        catch_up(self.dt)
        self._jumped()
        check_epoch(app_version(self.root, self.spec.name, self.dt, OWNER_APP), self.epoch)
        self._check_streams(streams)
        return txn is not None and app_version(self.root, self.spec.name, self.dt, txn[0]) >= txn[1]

    def _commit_delta_rs(
        self,
        adds: list[AddAction],
        txn: tuple[str, int] | None,
        more_txns: Sequence[tuple[str, int]],
        streams: Collection[str] = (),
    ) -> None:
        if self.epoch is not None and not any(app == OWNER_APP for app, _ in more_txns):
            more_txns = [*more_txns, (OWNER_APP, self.epoch)]
        if self.streams is not None and streams:
            # Two commits carrying one stream's owner app id conflict in delta-rs (its check of
            # the app transactions a commit depends on): a stale writer of a stream loses the
            # version to the new owner's fence, and the check below judges it by the epoch.
            more_txns = [*more_txns, *self.streams.txns(streams)]
        before = self.dt.version()
        for attempt in range(self._retries + 1):
            # A handle loaded after a newer owner's fence (hygiene's fresh one) commits on top of it
            # without a conflict: the fence must be looked for in its snapshot first.
            check_epoch(app_version(self.root, self.spec.name, self.dt, OWNER_APP), self.epoch)
            self._check_streams(streams)
            try:
                partitions = list(self.spec.partition_by)
                at = self.dt.version()
                commit_adds(self.dt, adds, self.spec.schema, partitions, txn, more_txns=more_txns)
                # The handle does not advance past its own commit; without this the next commit
                # would conflict with this one (same app id) and pay for a reload and a retry.
                catch_up(self.dt)
                if self.dt.version() == at + 1:  # the one new entry is this commit
                    txns = [*([txn] if txn else []), *more_txns]
                    note_commit(self.root, self.spec.name, self.dt, at + 1, txns)
                break
            except CommitConflict:
                if self._catch_up_landed(txn, streams):
                    break  # it landed although the call reported an error (delta-rs #2509)
                if attempt == self._retries:
                    raise
        self.root.settle_log_entries(self.spec.name, before + 1, self.dt.version())

    def checkpoint_if_behind(self) -> bool:
        """Start a checkpoint (on the hygiene thread) when the table's newest checkpoint is a whole
        interval or more behind the version this appender opened at; whether one started. The
        interval counts this appender's commits only, so versions it did not make (a compaction's
        swaps, a job's, those of a writer killed while its checkpoints lagged) leave every later
        load replaying them, restarts and takeovers included, until this appender has made another
        interval of commits: a gateway calls this once it serves."""
        local = self.root.local_path()
        if local is None:
            return False
        log_dir = os.path.join(local, self.spec.name, "_delta_log")
        with self._lock:  # the commit path starts hygiene too, under the same lock
            behind = self.dt.version() - checkpointed_version(log_dir) >= self._checkpoint_every
            if behind or self._log_keep_entries is not None:
                # not behind: the trim alone, for a log longer than the bound left from before it
                self._start_hygiene(checkpoint=behind)
        return behind

    def checkpoint_if_newer(self) -> bool:
        """Start a checkpoint when the table has any version past its newest checkpoint (others'
        included: a compaction's swaps); whether one started. For a table gone quiet: every loader
        (a restart, DuckDB, deltalake, Spark) then reads one checkpoint instead of a checkpoint and
        up to an interval of entries, 10 to 40 ms of each independent reader's open."""
        local = self.root.local_path()
        if local is None:
            return False
        log_dir = os.path.join(local, self.spec.name, "_delta_log")
        with self._lock:  # called from the compactor's thread while commits go on
            newer = newest_version(log_dir, self.dt.version()) > checkpointed_version(log_dir)
            if newer:
                self._start_hygiene()
        return newer

    def _checkpoint_due(self) -> bool:
        """Under ``_lock``: an interval of commits since the last round started, and the table's
        shortest time between two rounds passed too, or ten intervals of commits (what a load
        replays stays bounded). A checkpoint's cost grows with the live files and the entries it
        takes in, not with the rows: of a table written one message per commit at hundreds of
        commits a second, a round every 100 commits cost as much CPU as a tenth of the commits
        themselves, with the loads its fresh handle and the compaction's catch-ups made (#23)."""
        commits = self._commits - self._hygiene_at[0]
        if commits < self._checkpoint_every:
            return False
        waited = time.monotonic() - self._hygiene_at[1]
        return waited >= self._checkpoint_min_interval_s or commits >= 10 * self._checkpoint_every

    def _start_hygiene(self, checkpoint: bool = True) -> None:
        """Under ``_lock``: one pool, one round at a time, whichever thread asks."""
        if self._hygiene_running is not None and not self._hygiene_running.done():
            return  # the previous round is still at it; a later commit tries again
        if self._hygiene_pool is None:
            self._hygiene_pool = ThreadPoolExecutor(1, thread_name_prefix=f"jetlake-{self.spec.name}-ckpt")
        if checkpoint:  # a trim alone (a start's) does not put the next checkpoint off
            self._hygiene_at = (self._commits, time.monotonic())
        self._hygiene_running = self._hygiene_pool.submit(self.hygiene if checkpoint else self._trim)

    def _trim(self) -> None:
        """The log's trim alone (a log longer than the bound, left from before it), logged when it
        fails as a checkpoint is: the next checkpoint trims again."""
        local = self.root.local_path()
        assert local is not None  # only local roots are trimmed by jetlake
        try:
            trim_log(
                os.path.join(local, self.spec.name),
                self.root.log_retention_s,
                keep_entries=self._log_keep_entries,
            )
        except Exception:
            log.exception("trim of %s failed", self.spec.name)

    def hygiene(self) -> None:
        """Checkpoint and trim the log, and serve from a fresh handle (a long-lived ``DeltaTable``
        grows slower with every commit made through it). The load reads the last checkpoint and
        the commits since (locally at a version found without listing ``_delta_log``, so it does
        not lose races with the commits meanwhile). Commits go on meanwhile: the checkpoint is
        written and synced beside the log before it enters it. On a local root the checkpoint
        comes first, at the newest version, and the fresh handle loads from it: one replay of the
        interval's entries per round instead of two (the stage's load and the handle's), which
        a log written one message per commit paid every 100 publishes (#23)."""
        local = self.root.local_path()
        try:
            if local is not None:
                log_dir = os.path.join(local, self.spec.name, "_delta_log")
                version = newest_version(log_dir, self.dt.version())
                checkpoint_local(self.root, self.spec.name, version, self._log_keep_entries)
            dt = open_or_create(self.root, self.spec.name, self.spec.schema, list(self.spec.partition_by))
            if local is None:
                checkpoint_table(self.root, dt, self.spec.name, self._log_keep_entries)
        except Exception:  # hygiene is best effort; the next interval tries again
            log.exception("checkpoint of %s failed", self.spec.name)
            return
        self.dt = dt

    def fresh(self) -> DeltaTable:
        """The handle, caught up with every commit (for reads that must see them all)."""
        catch_up(self.dt)
        return self.dt

    def close(self) -> None:
        """Wait for a checkpoint in progress (a process that exits mid-checkpoint leaves a partial
        one for the next reader to skip, which costs it a full replay)."""
        if self._hygiene_pool is not None:
            self._hygiene_pool.shutdown(wait=True)


class WriterTable:
    """A table one writer appends to through one :class:`TableAppender` (messages, the ack log,
    removals): :attr:`SPEC` under the app id :attr:`APP_ID` and the store's owner epoch, or, given
    ``streams`` (the stream leases the writer holds), fenced per stream, each stream's commits
    counted under ``<APP_ID>/<stream>`` (:meth:`TableAppender.dedup_app`)."""

    SPEC: TableSpec
    APP_ID: str
    #: The bound on the table's log by entries (:func:`~storage_delta.commit.checkpoint.trim_log`),
    #: for a table nothing of jetlake reads older versions of; None: by ``log_retention_ms`` only.
    LOG_KEEP_ENTRIES: int | None = None
    #: Whether each stream is fenced on its own (a commit may leave a stream's rows out).
    per_stream = False
    #: The shortest time between two of the writer's checkpoints (besides ``checkpoint_every``
    #: commits; see :meth:`TableAppender._checkpoint_due`).
    CHECKPOINT_MIN_INTERVAL_S = 0.0

    def __init__(
        self,
        root: StoreRoot,
        checkpoint_every: int = 100,
        streams: StreamEpochs | None = None,
        checkpoint_min_interval_s: float | None = None,
    ) -> None:
        self.root = root
        self.per_stream = streams is not None
        keep = self.LOG_KEEP_ENTRIES
        self._appender = TableAppender(
            root,
            self.SPEC,
            self.APP_ID,
            checkpoint_every,
            log_keep_entries=keep,
            streams=streams,
            checkpoint_min_interval_s=(
                self.CHECKPOINT_MIN_INTERVAL_S
                if checkpoint_min_interval_s is None
                else checkpoint_min_interval_s
            ),
        )

    def fence_streams(self, streams: Collection[str], before: int) -> frozenset[str]:
        """Commit the epochs held for ``streams`` in one commit (their new owner's first write);
        returns those not fenced (:meth:`TableAppender.fence_streams`)."""
        return self._appender.fence_streams(streams, before)

    def fence_stream(self, stream: str) -> None:
        """:meth:`fence_streams` of one stream claimed before this call; :class:`StreamFenced`
        when it was not fenced."""
        lost = self.fence_streams([stream], -1)
        if lost:
            raise StreamFenced(lost)

    def take_unwritten(self, streams: Collection[str], before: int) -> None:
        """Write never-written ``streams`` without a fence (:meth:`TableAppender.take_unwritten`)."""
        self._appender.take_unwritten(streams, before)

    def version_now(self) -> int:
        """The table's version as its handle knows it (:meth:`TableAppender.version_now`)."""
        return self._appender.version_now()

    def follow(self) -> None:
        """:meth:`TableAppender.follow`."""
        self._appender.follow()
