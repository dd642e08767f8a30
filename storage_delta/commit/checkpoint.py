"""Delta checkpoints written off the commit path, and the trim of ``_delta_log`` (#22).

A checkpoint is derived data: every reader can replay the log entries instead. Two rules keep it so:

* **No commit waits for a checkpoint.** delta-rs writes a checkpoint straight into ``_delta_log``
  and syncs nothing; a commit's sync of the log directory could then make the checkpoint's name
  durable before its bytes, and a power cut would leave an empty checkpoint every reader trusts. So
  on a local root the checkpoint is made in a staging table beside the log
  (``_jetlake_checkpoints/stage/<id>``: hard links to the previous checkpoint and the entries since, which
  is all a load of that version reads), synced there, and only then renamed into ``_delta_log``,
  ``_last_checkpoint`` after it the same way. A crash at any step leaves the old checkpoint and a
  stale stage that the next checkpoint clears; nothing any commit does can expose a partial file.
* **The log is trimmed as Delta trims it.** Entries and checkpoints below the newest checkpoint
  that is older than the retention (``log_retention_ms``, Delta's ``delta.logRetentionDuration``)
  are deleted, so every version committed within the retention stays loadable (time travel, the
  change feed's removal offsets) and the log of a table written one message per commit stays
  bounded: about (commit rate × retention) entries plus two checkpoint intervals. Unlike Delta,
  the newest checkpoint is never that floor: a whole checkpoint below it always remains, so a
  damaged newest one can be set aside and replayed from there (#16).
* **A checkpoint carries no tombstone of a merge.** A ``remove`` with ``dataChange`` false (the
  gateway's compaction, the ``seal`` job: the rows live on in the merged file) is needed by no
  reader of a checkpoint: a read of the version it belongs to, or of any later one, never opens a
  removed file; a read of an earlier version loads that version's own checkpoint and entries; the
  change feed reads the ``removals`` table, a swap's conflict check the entries since its version.
  Only the vacuum looks at tombstones: a full one spares what a tombstone younger than its margin
  names. So the merge sets each file's modification time to the time of its removal before it
  commits (:func:`storage_delta.maintenance.files.swap_files`), which the full vacuum's margin
  counts from when no tombstone names the file. Delta keeps them for
  ``delta.deletedFileRetentionDuration`` (an hour here): a stream written one message per commit then
  had a checkpoint of 8.7 MB, 104,831 actions for 75 live files, after 105,523 commits, which every
  load (a restart, a takeover, deltalake, DuckDB, Spark through the data source) decoded.

On an object store delta-rs writes the checkpoint (a completed PUT is atomic and durable) and
removes expired entries by the table's own ``delta.logRetentionDuration``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import time
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from storage_delta.commit.deltalog import commit_path
from storage_delta.commit.durable import fsync_path
from storage_delta.commit.incremental import Unsupported, carried_checkpoint, write_carried
from storage_delta.commit.store import StoreRoot, retry_listing
from storage_delta.format.integrity import checkpoint_digest_path, record_checkpoint_digest

log = logging.getLogger(__name__)

#: Age after which a checkpoint stage is a crash's leftover (a checkpoint takes seconds).
STALE_STAGE_S = 3600.0

#: A log file's version and kind: a commit entry, a checkpoint (one file or a part of several) or
#: a Delta checksum file.
_LOG_FILE = re.compile(r"^(\d{20})\.(json|checkpoint(?:\.\d+\.\d+)?\.parquet|crc)$")


def checkpoint_table(root: StoreRoot, dt: DeltaTable, name: str, keep_entries: int | None = None) -> None:
    """A checkpoint of table ``name`` at ``dt``'s version, then the trim of its expired log files
    (``keep_entries``: see :func:`trim_log`). Never holds anything a commit waits for; call it on
    a thread of its own."""
    if root.local_path() is None:
        retry_listing(dt.create_checkpoint)
        retry_listing(dt.cleanup_metadata)
        return
    checkpoint_local(root, name, dt.version(), keep_entries)


def checkpoint_local(root: StoreRoot, name: str, version: int, keep_entries: int | None = None) -> None:
    """:func:`checkpoint_table` of a table on a local root at ``version`` (a version whose entry
    exists), without a handle: the stage loads what it needs."""
    local = root.local_path()
    assert local is not None, "checkpoint_local of a table on an object store"
    table_path = os.path.join(local, name)
    if _staged_checkpoint(root, table_path, version):
        digest = record_checkpoint_digest(table_path, version)
        if digest is not None:
            root.settle_file(digest, [table_path])
    trim_log(table_path, root.log_retention_s, keep_entries=keep_entries)


def _last_checkpoint(log_dir: str) -> dict[str, object] | None:
    """What ``_last_checkpoint`` says (None: absent or unreadable)."""
    try:
        with open(os.path.join(log_dir, "_last_checkpoint"), "rb") as fh:
            found = json.load(fh)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and isinstance(found.get("version"), int) else None


def _checkpoint_names(version: int, parts: object) -> list[str]:
    """The file names of the checkpoint at ``version``: one file, or ``parts`` parts."""
    if isinstance(parts, int) and parts > 1:
        return [f"{version:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, parts + 1)]
    return [f"{version:020d}.checkpoint.parquet"]


def _staged_checkpoint(root: StoreRoot, table_path: str, version: int) -> bool:
    """Write the checkpoint at ``version`` in the stage and move it into the log once synced;
    False when there is nothing to do (already checkpointed there)."""
    log_dir = os.path.join(table_path, "_delta_log")
    last = _last_checkpoint(log_dir)
    base = int(str(last["version"])) if last is not None else -1
    if base >= version:
        return False
    stages = os.path.join(table_path, "_jetlake_checkpoints", "stage")
    _clear_stale_stages(stages)
    stage = os.path.join(stages, uuid.uuid4().hex)  # its own: a job may checkpoint the table too
    stage_log = os.path.join(stage, "_delta_log")
    os.makedirs(stage_log)
    carried = _carried(table_path, last, base, version)
    if carried is not None:
        names = _checkpoint_names(version, None)
        write_carried(carried, stage_log, version)
    else:
        names = _delta_rs_checkpoint(log_dir, stage, last, base, version)
    for file_name in [*names, "_last_checkpoint"]:
        fsync_path(os.path.join(stage_log, file_name))  # bytes down before the name is in the log
    # The checkpoint first: a ``_last_checkpoint`` naming a checkpoint not yet there would send
    # every reader to a missing file.
    for file_name in [*names, "_last_checkpoint"]:
        os.replace(os.path.join(stage_log, file_name), os.path.join(log_dir, file_name))
    if root.fsync:
        fsync_path(log_dir)
    elif root.unsynced is not None:
        root.unsynced.log([os.path.join(log_dir, n) for n in [*names, "_last_checkpoint"]], log_dir)
    shutil.rmtree(stage, ignore_errors=True)
    return True


def _carried(table_path: str, last: dict[str, object] | None, base: int, version: int) -> pa.Table | None:
    """The checkpoint at ``version`` carried forward from the one at ``base``
    (:mod:`storage_delta.commit.incremental`); None where delta-rs makes it (no previous
    checkpoint, one of several parts, an entry it does not handle)."""
    if last is None or _checkpoint_names(base, last.get("parts")) != [f"{base:020d}.checkpoint.parquet"]:
        return None
    try:
        return carried_checkpoint(table_path, base, version, int(time.time() * 1000))
    except Unsupported as exc:
        log.info("checkpoint at %d of %s by delta-rs: %s", version, table_path, exc)
        return None


def _delta_rs_checkpoint(
    log_dir: str, stage: str, last: dict[str, object] | None, base: int, version: int
) -> list[str]:
    """delta-rs's checkpoint at ``version`` in the stage, without merge tombstones; returns its
    file names."""
    stage_log = os.path.join(stage, "_delta_log")
    # What a load of ``version`` reads: the previous checkpoint and the entries after it. Links, not
    # copies: entries and checkpoints are never rewritten.
    linked = _checkpoint_names(base, last.get("parts")) if last is not None else []
    linked += [os.path.basename(commit_path(log_dir, v)) for v in range(base + 1, version + 1)]
    for file_name in linked:
        os.link(os.path.join(log_dir, file_name), os.path.join(stage_log, file_name))
    if last is not None:
        pointer = "_last_checkpoint"
        shutil.copyfile(os.path.join(log_dir, pointer), os.path.join(stage_log, pointer))
    DeltaTable(stage, version=version).create_checkpoint()
    written = _last_checkpoint(stage_log)
    if written is None or written["version"] != version:
        raise RuntimeError(f"delta-rs wrote no checkpoint at version {version} in {stage_log}")
    names = _checkpoint_names(version, written.get("parts"))
    _drop_merge_tombstones(stage_log, names, written)
    return names


def _drop_merge_tombstones(log_dir: str, names: list[str], pointer: dict[str, object]) -> None:
    """Rewrite the checkpoint ``names`` in ``log_dir`` without the ``remove`` actions whose
    ``dataChange`` is false, and ``_last_checkpoint`` (``pointer``) with the new action count and
    bytes; nothing when it holds none."""
    kept_rows, size_bytes, changed = 0, 0, False
    for name in names:
        path = os.path.join(log_dir, name)
        with pq.ParquetFile(path) as parquet:  # not read_table: pyarrow.dataset imports pandas
            actions = parquet.read()
        removes = actions.column("remove")
        keep = pc.fill_null(pc.or_kleene(pc.is_null(removes), pc.struct_field(removes, "dataChange")), True)
        if not pc.all(keep).as_py():
            changed = True
            pq.write_table(actions.filter(keep), path)
            actions = actions.filter(keep)
        kept_rows += actions.num_rows
        size_bytes += os.path.getsize(path)
    if changed:
        pointer = {**pointer, "size": kept_rows, "sizeInBytes": size_bytes}
        with open(os.path.join(log_dir, "_last_checkpoint"), "w") as fh:
            json.dump(pointer, fh, separators=(",", ":"))


def _clear_stale_stages(stages: str) -> None:
    """Remove stages a crash left behind (never read, never needed); a stage younger than
    :data:`STALE_STAGE_S` may be another writer's checkpoint under way."""
    try:
        with os.scandir(stages) as entries:
            stale = [e.path for e in entries if _mtime(e.path) < time.time() - STALE_STAGE_S]
    except FileNotFoundError:
        return
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)


def trim_log(
    table_path: str, retention_s: float, now: float | None = None, keep_entries: int | None = None
) -> int:
    """Delete the log entries, checkpoints and checksums of a local table below its newest
    checkpoint written at least ``retention_s`` ago, never the newest checkpoint itself (and the
    checkpoints' digests); returns how many log files went. Every version at or above that
    checkpoint stays loadable, and so does a damaged newest checkpoint's table: a whole one below
    it and the entries since remain, so the start can set the damaged one aside
    (``storage_delta.tables.repair.set_aside_checkpoint``) even on a table idle for longer than
    the retention, for one checkpoint interval of entries more. With ``keep_entries`` a checkpoint
    that many versions below the newest entry is old enough too, whatever its age: the log of a
    table written one message per commit then stays at about that many entries (an hour of them
    cost every load of the table a listing of hundreds of thousands of files)."""
    log_dir = os.path.join(table_path, "_delta_log")
    cutoff = (time.time() if now is None else now) - retention_s
    files: list[tuple[int, str]] = []
    old: list[int] = []  # checkpoints written before the cutoff
    with os.scandir(log_dir) as entries:
        for entry in entries:
            found = _LOG_FILE.match(entry.name)
            if found is None:
                continue
            version = int(found.group(1))
            files.append((version, entry.name))
            if found.group(2).startswith("checkpoint") and _mtime(entry.path) <= cutoff:
                old.append(version)
    newest = max((v for v, name in files if ".checkpoint" in name), default=-1)
    if keep_entries is not None and files:
        last = max(v for v, _ in files)
        old += [v for v, name in files if ".checkpoint" in name and v <= last - keep_entries]
    floor = max((v for v in old if v < newest), default=-1)
    removed = 0
    for version, file_name in files:
        if version < floor:
            with contextlib.suppress(FileNotFoundError):  # another trim (a job's) got there first
                os.unlink(os.path.join(log_dir, file_name))
                removed += 1
            if ".checkpoint" in file_name:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(checkpoint_digest_path(table_path, version))
    if removed:
        log.info("trimmed %d log files of %s below version %d", removed, table_path, floor)
    return removed


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return float("inf")
