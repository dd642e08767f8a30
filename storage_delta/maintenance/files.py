"""The table side of jetlake's maintenance jobs: list live files, rewrite a block's files, swap files
in one commit, checkpoint, vacuum.

The jobs run beside a gateway that appends all the time. delta-rs counts a plain append as reading
the whole table (#3890), so whichever of a job's swap and an append commits second fails delta-rs's
conflict check, and under steady ingest a swap through delta-rs loses every race. On a local store
root and on S3 :func:`swap_files` therefore commits through
:class:`~storage_delta.commit.deltalog.LogAppender`, which conflicts a swap only with a commit that
removed one of the same files. On any other object store the swap goes through delta-rs and
retries lost races; there it carries an app transaction (``jetlake-jobs``, n) so that a commit
reported as failed but landed (#2509) is recognised.

Vacuum keeps removed files for a margin, so that a reader that planned on an older version still
finds them, and never deletes a file a concurrent writer has written but not committed yet (#3645):
see :func:`vacuum`.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from storage_delta.commit.checkpoint import checkpoint_table
from storage_delta.commit.deltalog import (
    ConcurrentRemoval,
    LogAppender,
    UnsupportedTable,
)
from storage_delta.commit.owner import OWNER_APP, check_epoch
from storage_delta.commit.store import (
    SEALED_PARQUET,
    CommitConflict,
    StoreRoot,
    blind_appends_allowed,
    catch_up,
    commit_adds,
    open_existing,
    retry_listing,
    write_data_file,
)
from storage_delta.commit.txns import app_version
from storage_delta.format import schema as sch
from storage_delta.format.integrity import verified_bytes

log = logging.getLogger(__name__)

APP_ID = "jetlake-jobs"


@dataclass(frozen=True)
class LiveFile:
    """One file of the ``messages`` table's current version, as its ``add`` action describes it."""

    stream: str
    block: int
    #: The path as the log holds it (URL-encoded): what a ``remove`` action must name.
    log_path: str
    size: int
    min_seq: int | None
    max_seq: int | None
    min_ts: int | None
    max_ts: int | None
    rows: int | None

    @property
    def path(self) -> str:
        """The path relative to the table directory, for reading the file."""
        return unquote(self.log_path)


def live_files(root: StoreRoot, stream: str | None = None) -> list[LiveFile]:
    """The live files of one stream, or of every stream."""
    dt = open_existing(root, sch.MESSAGES)
    return [] if dt is None else live_files_of(dt, stream)


def live_files_of(dt: DeltaTable, stream: str | None = None) -> list[LiveFile]:
    """The live files of a handle of the ``messages`` table, as its version holds them."""
    actions = pa.table(dt.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return []
    if stream is not None:
        actions = actions.filter(pc.equal(actions["partition.stream"], stream))
    return [
        LiveFile(
            stream=row["partition.stream"],
            block=int(row["partition.block"]),
            log_path=row["path"],
            size=int(row["size_bytes"]),
            min_seq=row.get("min.seq"),
            max_seq=row.get("max.seq"),
            min_ts=row.get("min.ts"),
            max_ts=row.get("max.ts"),
            rows=row.get("num_records"),
        )
        for row in actions.to_pylist()
    ]


def rewrite_files(
    root: StoreRoot,
    stream: str,
    block: int,
    paths: Sequence[str],
    drop: Sequence[tuple[int, int]] = (),
    created: int = 0,
    data_change: bool = False,
    encoding: Mapping[str, Any] = SEALED_PARQUET,
) -> tuple[bool, AddAction | None]:
    """Merge files of one block into one sequence-sorted file (``encoding``: the sealed one but for
    the compaction's merges in an active block), leaving out the sequence ranges ``drop``
    (inclusive) and rows stored before ``created`` (an earlier incarnation of the stream). Runs on a
    Spark executor and commits nothing: the driver swaps all rewritten blocks at once. Returns
    whether anything was left out (when nothing was and the rewrite removes rows, ``(False,
    None)``: statistics only showed the files *might* hold removed sequences) and the new file
    (``None`` when no row is left)."""
    fs, base = root.files()
    full = [f"{base}/{sch.MESSAGES}/{p}" for p in paths]
    # Each file checked (DamagedFile stops the job: a rewrite would give damaged rows a fresh
    # digest), then decoded from the bytes the check read, on this thread: the gateway's compaction
    # merges a thousand one-message files a round, where a dataset scan of the paths read every
    # file twice and cost half as much again (0.26 against 0.17 ms a file).
    table = (
        pa.concat_tables(
            [
                pq.ParquetFile(pa.BufferReader(verified_bytes(fs, path))).read(use_threads=False)
                for path in full
            ],
            promote_options="permissive",
        )
        .select(sch.MESSAGE_FILE_SCHEMA.names)
        .cast(sch.MESSAGE_FILE_SCHEMA)
    )
    kept = table.filter(visible(table, created, drop))
    changed = kept.num_rows < table.num_rows
    if kept.num_rows == 0 or (data_change and not changed):
        return changed, None
    add = write_data_file(
        root, sch.MESSAGES, {"stream": stream, "block": str(block)}, kept.sort_by("seq"), encoding
    )
    return changed, replace(add, data_change=data_change)


def visible(table: pa.Table, created: int, removed: Sequence[tuple[int, int]]) -> pa.BooleanArray:
    """Which rows (``seq``, ``ts`` columns) the logical stream shows: stored at or after the
    incarnation's ``created`` and in none of the ``removed`` ranges (ascending, disjoint). A binary
    search per row, so a work-queue stream with a range per acked message costs rows * log(ranges)."""
    seqs = table["seq"].to_numpy()
    keep = table["ts"].to_numpy() >= created
    if removed:
        firsts = np.fromiter((a for a, _ in removed), np.int64, len(removed))
        lasts = np.fromiter((b for _, b in removed), np.int64, len(removed))
        i = np.searchsorted(firsts, seqs, side="right") - 1
        inside = (i >= 0) & (seqs <= lasts[np.maximum(i, 0)])
        keep &= ~inside
    return pa.array(keep, pa.bool_())


def swap_files(
    root: StoreRoot,
    removes: Sequence[LiveFile],
    adds: Sequence[AddAction],
    data_change: bool,
    retries: int = 200,
    dt: DeltaTable | None = None,
) -> bool:
    """Remove ``removes`` and add ``adds`` in one commit of the ``messages`` table (through ``dt``,
    a handle the caller keeps, when given: see :func:`swap_actions`).

    Returns ``False``, committing nothing, when a file to remove is no longer live (another job got
    there first): the caller then deletes its new files, which no version references.

    A merge (``data_change`` false) on a local root first sets each removed file's modification time
    to now: its tombstone leaves the checkpoints (:mod:`storage_delta.commit.checkpoint`), and the
    full vacuum then keeps the file for its margin from this time, as it would from the tombstone.
    Before the commit, so no crash leaves a removed file that looks older than its removal (a swap
    that does not land leaves a live file younger, which changes nothing).
    """
    now = int(time.time() * 1000)
    local = root.local_path()
    if not data_change and local is not None:
        for f in removes:
            os.utime(os.path.join(local, sch.MESSAGES, f.path), ns=(now * 1_000_000,) * 2)
    remove_actions = [
        RemoveAction(
            path=f.log_path,
            data_change=data_change,
            deletion_timestamp=now,
            size=f.size,
            partition_values={"stream": f.stream, "block": str(f.block)},
        )
        for f in removes
    ]
    return swap_actions(
        root,
        sch.MESSAGES,
        sch.MESSAGE_TABLE_SCHEMA,
        sch.MESSAGE_PARTITIONS,
        remove_actions,
        adds,
        retries,
        dt,
    )


def swap_actions(
    root: StoreRoot,
    table: str,
    schema: pa.Schema,
    partitions: list[str],
    removes: Sequence[RemoveAction],
    adds: Sequence[AddAction],
    retries: int = 200,
    dt: DeltaTable | None = None,
) -> bool:
    """Commit ``removes`` and ``adds`` as one version of ``table`` (any of jetlake's tables: the
    ``removals`` compaction swaps its files this way too); ``False``, committing nothing, when a
    file to remove is no longer live. A job loads the table afresh; a caller that swaps again and
    again (the gateway's compaction) passes the handle ``dt`` it planned on (so the files are live
    in its version): the swap then checks only the commits since, as it does for a fresh load."""
    wanted = {r.path for r in removes}
    if dt is None:
        dt = open_existing(root, table)
        if dt is None or not wanted <= _live_paths(dt):
            return False
    # A gateway's swap (its compaction) stops at a newer owner's fence like its appends: one in the
    # version planned on, or (below) one among the commits landed since.
    check_epoch(app_version(root, table, dt, OWNER_APP), root.epoch)
    entries = root.log_entries(table)
    if entries is not None and blind_appends_allowed(dt):
        try:
            appender = LogAppender(entries, dt.version() + 1, root.epoch)
            appender.swap(removes, adds, "DELETE" if any(r.data_change for r in removes) else "OPTIMIZE")
            return True
        except ConcurrentRemoval as exc:
            log.info("swap abandoned: %s", exc)
            return False
        except UnsupportedTable:
            catch_up(dt)  # delta-rs's commit judges the new protocol
    before = dt.version()
    versions = partial(app_version, root, table, dt)
    swapped = _swap_delta_rs(dt, versions, schema, partitions, [*adds, *removes], wanted, retries, root.epoch)
    if swapped and root.local_path() is not None:
        catch_up(dt)
        root.settle_log_entries(table, before + 1, dt.version())
    return swapped


def _live_paths(dt: DeltaTable) -> set[str]:
    return set(pa.table(dt.get_add_actions(flatten=True))["path"].to_pylist())


def _swap_delta_rs(
    dt: DeltaTable,
    versions: Callable[[str], int],
    schema: pa.Schema,
    partitions: list[str],
    actions: list[AddAction | RemoveAction],
    wanted: set[str],
    retries: int,
    epoch: int | None = None,
) -> bool:
    """The swap through delta-rs's commit (object stores), retrying races lost to appends; a
    newer owner's epoch in the version caught up to stops it (``epoch``: the writer's);
    ``versions``: an app id's version in ``dt``'s snapshot."""
    version = versions(APP_ID) + 1
    for attempt in range(retries + 1):
        check_epoch(versions(OWNER_APP), epoch)
        if not wanted <= _live_paths(dt):
            return False
        try:
            commit_adds(dt, actions, schema, partitions, (APP_ID, version))
            return True
        except CommitConflict:
            # Catch up on the commits that won (an incremental read, not a reload), so the next
            # try's window between its snapshot and its commit is as short as it can be.
            catch_up(dt)
            if versions(APP_ID) >= version:
                return True  # it landed although the call reported an error
            log.info("swap of %d files lost a race (attempt %d), retrying", len(wanted), attempt + 1)
            time.sleep(random.uniform(0, min(0.005 * 2**attempt, 0.1)))
    raise CommitConflict(f"swap of {len(wanted)} files still conflicting after {retries} retries")


def removes_of(files: pa.Table) -> list[RemoveAction]:
    """A removal of every file of a ``get_add_actions`` listing: what a fold that replaces all the
    files it read (the ``removals`` and ``acks`` compactions) swaps out."""
    now = int(time.time() * 1000)
    return [
        RemoveAction(path=p, data_change=True, deletion_timestamp=now, size=n)
        for p, n in zip(files["path"].to_pylist(), files["size_bytes"].to_pylist(), strict=True)
    ]


def delete_unreferenced(root: StoreRoot, adds: Sequence[AddAction], table: str = sch.MESSAGES) -> None:
    """Delete files a job wrote but did not commit (its swap was abandoned)."""
    fs, base = root.filesystem()
    for a in adds:
        fs.delete_file(f"{base}/{table}/{unquote(a.path)}")


def checkpoint(root: StoreRoot) -> None:
    """A Delta checkpoint and removal of expired log files: readers replay less log."""
    dt = open_existing(root, sch.MESSAGES)
    if dt is not None:
        checkpoint_table(root, dt, sch.MESSAGES)


def vacuum(root: StoreRoot, margin_hours: int, dry_run: bool = False) -> list[str]:
    """Delete files removed from the table more than ``margin_hours`` ago; returns their paths.

    With a margin of an hour or more the vacuum is ``full``: it also finds removed files whose
    ``remove`` action is older than the last checkpoint (a lite vacuum looks only past it, #3644),
    and delta-rs spares unreferenced files younger than the margin (#3835), which is what protects a
    concurrent writer's written but not yet committed files (#3645). A zero margin is allowed only in
    lite mode, which never deletes an unreferenced file: run it before a checkpoint.
    """
    if margin_hours < 0:
        raise ValueError("the vacuum margin cannot be negative")
    dt = open_existing(root, sch.MESSAGES)
    if dt is None:
        return []
    return retry_listing(
        lambda: dt.vacuum(
            retention_hours=margin_hours,
            dry_run=dry_run,
            enforce_retention_duration=False,
            full=margin_hours >= 1,
        )
    )
