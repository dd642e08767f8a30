"""Opening, creating and appending to jetlake's Delta tables under a store root URI.

Only this package imports ``deltalake``. Appends write parquet with pyarrow and commit ``add``
actions through one live table handle (``create_write_transaction``) rather than calling
``write_deltalake``, which replays the whole log on every call (delta-rs #3410).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import unquote

import obstore.exceptions
import obstore.store
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction
from obstore.store import ObjectStore, S3Store

from storage_delta.commit.deltalog import (
    LocalLogEntries,
    LogEntries,
    ObjectLogEntries,
    checkpointed_version,
    commit_path,
)
from storage_delta.commit.durable import (
    Unsynced,
    make_dirs,
    new_file_paths,
    sync_log_entries,
    sync_new_file,
    sync_tree,
)
from storage_delta.format.integrity import (
    FETCH_AHEAD,
    LINES_KEY,
    DamagedFile,
    ReadFiles,
    crc_hex,
    fetched_ahead,
    lines_digest,
    parse_verified,
)


class CommitConflict(Exception):
    """A commit lost a race with another writer; reload, re-check the txn marker and retry."""


@dataclass(frozen=True)
class StoreRoot:
    """Where the tables live: a local directory or an object-store URI understood by delta-rs."""

    uri: str
    storage_options: Mapping[str, str] | None = None
    #: ``sync_interval`` ``always``: every write of a commit is synced before the commit returns
    #: (:mod:`storage_delta.commit.durable`). False: the gateway's flusher syncs every interval
    #: what ``unsynced`` noted.
    fsync: bool = True
    unsynced: Unsynced | None = field(default=None, compare=False)
    #: The owner epoch a gateway holds the store under (:mod:`storage_delta.commit.owner`): its
    #: appenders fence every table first and refuse to commit once a newer epoch is there. None:
    #: a writer outside the lease (jobs, tools, an object-store root).
    epoch: int | None = None
    #: How long log entries and checkpoints stay loadable (Delta's ``delta.logRetentionDuration``,
    #: the gateway's ``log_retention_ms``): the log is trimmed below the newest checkpoint older
    #: than this (:mod:`storage_delta.commit.checkpoint`).
    log_retention_s: float = 3600.0

    def table_uri(self, name: str) -> str:
        return f"{self.uri.rstrip('/')}/{name}"

    def local_path(self) -> str | None:
        """The root as an absolute local path, or None for an object store."""
        if "://" in self.uri and not self.uri.startswith("file://"):
            return None
        return os.path.abspath(self.uri.removeprefix("file://"))

    def synced_path(self) -> str | None:
        """The local root when writes must be synced as they are made (None: an object store,
        whose completed PUT is the durable point, or a relaxed ``sync_interval``)."""
        return self.local_path() if self.fsync else None

    def settle_file(self, path: str, new_entries: Sequence[str] = (), later: list[str] | None = None) -> None:
        """A new local file (and the directories ``make_dirs`` created above it): synced now on a
        root that syncs (or, given ``later``, added to the paths the caller syncs before anything
        names the file), noted for the flusher on one that does not."""
        if self.synced_path() is not None:
            if later is None:
                sync_new_file(path, new_entries)
            else:
                later.extend(new_file_paths(path, new_entries))
        elif self.unsynced is not None:
            self.unsynced.data([path], [os.path.dirname(path), *new_entries])

    def settle_log_entries(self, table: str, first: int, last: int) -> None:
        """Log entries ``first`` to ``last`` of ``table`` that delta-rs wrote (it syncs nothing)."""
        local = self.local_path()
        if local is None:
            return
        log_dir = os.path.join(local, table, "_delta_log")
        if self.fsync:
            sync_log_entries(log_dir, first, last)
        elif self.unsynced is not None:
            self.unsynced.log([f"{log_dir}/{v:020d}.json" for v in range(first, last + 1)], log_dir)

    def log_entries(self, table: str) -> LogEntries | None:
        """Where ``table``'s log entries are claimed by jetlake's own commit
        (:class:`~storage_delta.commit.deltalog.LogAppender`): the local folder, or an S3 bucket
        (conditional writes); None for any other object store, whose commits delta-rs makes."""
        local = self.local_path()
        if local is not None:
            return LocalLogEntries(os.path.join(local, table), self.fsync, self.unsynced)
        if self.uri.startswith("s3://"):
            return ObjectLogEntries(self.objects(table), self.log_retention_s)
        return None

    def objects(self, folder: str) -> ObjectStore:
        """A client of the object store rooted at ``folder`` of this root (an object-store root),
        for conditional writes, which neither pyarrow's filesystems nor delta-rs's API offer."""
        options = tuple(sorted((self.storage_options or {}).items()))
        if self.uri.startswith("s3://"):
            bucket, _, prefix = self.table_uri(folder)[len("s3://") :].partition("/")
            return _s3_store(bucket, prefix, options)
        return _store_at(self.table_uri(folder), options)

    def files(self) -> tuple[ReadFiles, str]:
        """Where whole files are read from, and the root path within it: :meth:`filesystem`'s,
        but on S3 one GET a file (:class:`ObjectFiles`)."""
        if self.uri.startswith("s3://"):
            base = self.uri[len("s3://") :].rstrip("/")  # as filesystem() names it
            options = tuple(sorted((self.storage_options or {}).items()))
            return ObjectFiles(base.partition("/")[0], options), base
        return self.filesystem()

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow filesystem and the root path within it, for writing parquet ourselves."""
        if "://" not in self.uri:
            path = os.path.abspath(self.uri)
            os.makedirs(path, exist_ok=True)
            return pafs.LocalFileSystem(), path
        if self.uri.startswith("s3://"):
            opts = dict(self.storage_options or {})
            fs = pafs.S3FileSystem(
                access_key=opts.get("AWS_ACCESS_KEY_ID"),
                secret_key=opts.get("AWS_SECRET_ACCESS_KEY"),
                endpoint_override=opts.get("AWS_ENDPOINT_URL"),
                region=opts.get("AWS_REGION", "us-east-1"),
                allow_bucket_creation=False,
                # a file smaller than an upload part (a commit's data file, a beat, a record) goes
                # up as one PUT when it is closed, not as a multipart upload's three requests
                allow_delayed_open=True,
            )
            return fs, self.uri[len("s3://") :].rstrip("/")
        fs, path = pafs.FileSystem.from_uri(self.uri)
        return fs, path.rstrip("/")


class ObjectFiles:
    """Whole files of an S3 bucket read through obstore, one GET each: pyarrow's S3 filesystem
    asks for a file's size first (a HEAD), so a small file cost two requests, 11-13 ms each on moto
    on this machine against 4-6 ms (ad-hoc probe, bench/RESULTS.md). A takeover reads every file
    of its streams above their index snapshots, and after a burst of sync publishing those are
    tens of small files per stream (#19)."""

    def __init__(self, bucket: str, options: tuple[tuple[str, str], ...]) -> None:
        self.bucket = bucket
        self.store = _s3_store(bucket, "", options)

    def open_input_file(self, path: str) -> pa.BufferReader:
        """``path`` (``<bucket>/<key>``, as :meth:`StoreRoot.filesystem` names files) read whole;
        OSError when it cannot be (as pyarrow's filesystems raise)."""
        bucket, _, key = path.partition("/")
        assert bucket == self.bucket, f"{path} is not in bucket {self.bucket}"
        try:
            got = obstore.get(self.store, key)
            return pa.BufferReader(pa.py_buffer(got.bytes()))
        except obstore.exceptions.BaseError as exc:
            raise OSError(f"{path}: {exc}") from exc


@functools.lru_cache(maxsize=64)
def _s3_store(bucket: str, prefix: str, options: tuple[tuple[str, str], ...]) -> S3Store:
    """One client per table folder (its connections are kept): the store root's storage options
    are delta-rs's names, which object_store (under both delta-rs and obstore) reads alike."""
    config = {k.lower(): v for k, v in options if k.upper() != "AWS_ALLOW_HTTP"}
    allow_http = dict(options).get("AWS_ALLOW_HTTP", "false").lower() == "true"
    return S3Store(bucket, prefix=prefix, config=config, client_options={"allow_http": allow_http})  # type: ignore[arg-type]


@functools.lru_cache(maxsize=64)
def _store_at(url: str, options: tuple[tuple[str, str], ...]) -> ObjectStore:
    """Any other object store obstore knows (GCS, Azure), configured as :func:`_s3_store`."""
    store: ObjectStore = obstore.store.from_url(url, config={k.lower(): v for k, v in options})  # type: ignore[call-overload]
    return store


T = TypeVar("T")


def retry_listing(load: Callable[[], T], attempts: int = 20) -> T:
    """Run a delta-rs load again when its listing of ``_delta_log`` saw a gap in the versions.

    A directory listing that runs while commits are created may return a newer commit file and miss
    an older one (``readdir`` makes no promise about entries created during the listing), and
    delta-rs then refuses the log as non-contiguous. A later listing sees both; in a large log under
    a steady stream of commits several listings in a row can race, hence the many backed-off tries."""
    for attempt in range(attempts):
        try:
            return load()
        except DeltaError as exc:
            if "contiguous" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(min(0.01 * 2**attempt, 0.25))
    raise AssertionError("unreachable")


#: Table properties of every table jetlake creates. Checkpoints keep a removed file's tombstone for
#: ``deletedFileRetentionDuration`` (a week by default): with the jobs removing files all day, the
#: checkpoints, and the memory of every handle that loads them (the writer's checkpoint opens one
#: every 100 commits), would grow with a week of tombstones. Nothing of jetlake needs them that long:
#: its vacuum with a margin of an hour or more is a full one, which finds unreferenced files without
#: tombstones, and readers of older versions read those versions' own log.
TABLE_PROPERTIES = {
    "delta.checkpointInterval": "100",
    "delta.deletedFileRetentionDuration": "interval 1 hours",
}


def _local_log_dir(table_uri: str) -> str | None:
    """A local table's ``_delta_log`` directory (None for an object store)."""
    if "://" in table_uri and not table_uri.startswith("file://"):
        return None
    return os.path.join(unquote(table_uri.removeprefix("file://")), "_delta_log")


def newest_version(log_dir: str, known: int) -> int:
    """The newest version of a local table's log at or after ``known`` (a version whose commit
    exists, or -1), found by looking for commit files by name rather than listing the directory:
    a gallop past ``known``, then a binary search. Versions are contiguous, commit files are only
    ever created above the newest and deleted only below a checkpoint, so "version v exists" holds
    up to the newest version and not after it, whatever commits land meanwhile; a commit that
    existed when the search began is at or below what it returns. When the log was trimmed past
    ``known`` the search starts from the checkpoint ``_last_checkpoint`` names."""
    low, step = known, 1
    high = low + 1
    if not os.path.exists(commit_path(log_dir, high)):
        # Either nothing after ``known``, or a handle that lagged behind the log's trim: the entries
        # after its version are gone below a newer checkpoint, from which the log goes on.
        checkpointed = checkpointed_version(log_dir)
        if checkpointed <= known:
            return known
        low, high = checkpointed, checkpointed + 1
    while os.path.exists(commit_path(log_dir, high)):
        low, step = high, step * 2
        high = low + step
    while high - low > 1:
        middle = (low + high) // 2
        if os.path.exists(commit_path(log_dir, middle)):
            low = middle
        else:
            high = middle
    return low


def _load(uri: str, opts: dict[str, str] | None) -> DeltaTable:
    """A handle at the table's newest version. Locally at the version :func:`newest_version`
    found, so delta-rs's listing of ``_delta_log`` needs only commit files that existed before it
    began, and a listing that misses one being created meanwhile (``readdir`` promises nothing
    about those) no longer shows a gap it refuses: under a sync publisher (hundreds of commits a
    second into a directory of tens of thousands) loads of the newest version kept failing so."""
    log_dir = _local_log_dir(uri)
    if log_dir is None:
        return retry_listing(lambda: DeltaTable(uri, storage_options=opts))
    newest = newest_version(log_dir, checkpointed_version(log_dir))
    version = newest if newest >= 0 else None
    return retry_listing(lambda: DeltaTable(uri, version=version, storage_options=opts))


def catch_up(dt: DeltaTable) -> None:
    """Bring ``dt`` to the table's newest version, replaying only the commits since its own
    (locally through :func:`newest_version`, see :func:`_load`; nothing at all when no commit
    landed since)."""
    log_dir = _local_log_dir(dt.table_uri)
    if log_dir is None:
        retry_listing(dt.update_incremental)
        return
    newest = newest_version(log_dir, dt.version())
    if newest > dt.version():
        retry_listing(lambda: dt.load_as_version(newest))


def create_table(
    uri: str, schema: pa.Schema, partition_by: list[str], opts: dict[str, str] | None = None
) -> None:
    """Create an empty table (its version 0: the protocol and metaData delta-rs writes for this
    schema, partitioning and :data:`TABLE_PROPERTIES`), unless one is there. Also how a damaged
    creation is made again (``storage_delta.tables.repair``): the same call gives the same lines."""
    write_deltalake(
        uri,
        schema.empty_table(),
        partition_by=partition_by or None,
        mode="ignore",
        storage_options=opts,
        configuration=TABLE_PROPERTIES,
    )


def open_or_create(root: StoreRoot, name: str, schema: pa.Schema, partition_by: list[str]) -> DeltaTable:
    uri = root.table_uri(name)
    opts = dict(root.storage_options) if root.storage_options else None
    if DeltaTable.is_deltatable(uri, storage_options=opts):
        return _load(uri, opts)
    local = root.local_path()
    if local is None:
        create_table(uri, schema, partition_by, opts)
    else:
        _create_with_digests(os.path.join(local, name), schema, partition_by)
        # synced whatever the sync_interval: a table whose first entry a power cut took cannot be
        # opened at all
        sync_tree(os.path.join(local, name))
    return DeltaTable(uri, storage_options=opts)


def creation_lines(schema: pa.Schema, partition_by: list[str]) -> list[bytes]:
    """The lines of a table's creation (version 0) as :func:`create_table` writes them for this
    schema and partitioning (``commitInfo``, ``protocol``, ``metaData``: byte for byte but for the
    table id and the times), made in a scratch folder: what jetlake writes, and what repair makes
    a damaged creation again from (``storage_delta.tables.repair``)."""
    with tempfile.TemporaryDirectory(prefix="jetlake-creation-") as scratch:
        create_table(scratch, schema, partition_by)
        with open(commit_path(os.path.join(scratch, "_delta_log"), 0), "rb") as fh:
            return fh.read().splitlines()


def _create_with_digests(path: str, schema: pa.Schema, partition_by: list[str]) -> None:
    """A local table's creation (version 0) as delta-rs writes it, with the CRC-32 of its protocol
    and metaData lines in its ``commitInfo`` (``format.integrity.LINES_KEY``), as every later
    entry has: without them a flipped bit that still parses (a letter of a column name in the
    schema) is taken at its word by every reader, and the start cannot know the entry is damaged.
    Staged beside the log, as the commits are, then linked into place (put-if-absent: a gateway
    that created the table first wins)."""
    lines = creation_lines(schema, partition_by)
    info = json.loads(lines[0])
    info["commitInfo"][LINES_KEY] = lines_digest(lines[1:])
    log_dir, staging = os.path.join(path, "_delta_log"), os.path.join(path, "_jetlake_staging")
    make_dirs(log_dir)
    make_dirs(staging)
    staged = os.path.join(staging, f"{uuid.uuid4().hex}.json")
    with open(staged, "wb") as out:
        out.write(b"\n".join([json.dumps(info, separators=(",", ":")).encode(), *lines[1:]]) + b"\n")
    try:
        with contextlib.suppress(FileExistsError):
            os.link(staged, commit_path(log_dir, 0))
    finally:
        os.unlink(staged)


def blind_appends_allowed(dt: DeltaTable) -> bool:
    """Whether the table's protocol asks nothing of a writer beyond what
    :class:`storage_delta.commit.deltalog.LogAppender` does (writer version 2, no writer features)."""
    protocol = dt.protocol()
    return protocol.min_writer_version <= 2 and not protocol.writer_features


def open_existing(root: StoreRoot, name: str) -> DeltaTable | None:
    uri = root.table_uri(name)
    opts = dict(root.storage_options) if root.storage_options else None
    if not DeltaTable.is_deltatable(uri, storage_options=opts):
        return None
    return _load(uri, opts)


def open_version(root: StoreRoot, name: str, version: int) -> DeltaTable | None:
    """Table ``name`` as of ``version``: a replayed read sees what the first one saw."""
    uri = root.table_uri(name)
    opts = dict(root.storage_options) if root.storage_options else None
    if not DeltaTable.is_deltatable(uri, storage_options=opts):
        return None
    return retry_listing(lambda: DeltaTable(uri, version=version, storage_options=opts))


def file_stats(table: pa.Table) -> str:
    """Delta file statistics (min/max/nulls of the numeric columns) so readers prune by sequence,
    and of a ``stream`` column held in the file (``catalog``, ``removals``, the ack tables): the
    names of the streams its rows concern lie in that range, which is what the gateway quarantines
    when the file is damaged (``storage_delta.tables.scope``) instead of refusing to start."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in table.column_names:
        col = table.column(name)
        nulls[name] = col.null_count
        if (pa.types.is_integer(col.type) or name == "stream") and len(col) > col.null_count:
            mm = pc.min_max(col)
            mins[name] = mm["min"].as_py()
            maxs[name] = mm["max"].as_py()
    return json.dumps(
        {"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    )


#: Parquet settings of a commit file: written on the hot path, so cheap to encode. Dictionary pages
#: for the subject (few distinct values), zstd at a fast level for everything.
HOT_PARQUET: dict[str, Any] = {"compression": "zstd", "compression_level": 1, "use_dictionary": ["subject"]}

#: A commit file whose columns hold fewer bytes than this is not compressed (:data:`TINY_PARQUET`):
#: a one-message commit's file is mostly parquet's footer, which no codec touches (1,736 bytes with
#: zstd, 1,766 without, for a 100-byte message), and zstd was about 75 µs of its 170 µs encoding on
#: the synchronous publish path (#23). Compaction and sealing rewrite these files compressed.
TINY_FILE_BYTES = 2048
TINY_PARQUET: dict[str, Any] = {"compression": "none", "use_dictionary": ["subject"]}

#: Parquet settings of a sealed block: written once by maintenance and kept, so worth the CPU.
#: Sequences and times are sorted and nearly regular, which delta encoding reduces to almost nothing;
#: large pages give zstd room to find the repetition between JSON payloads.
SEALED_PARQUET: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 9,
    "use_dictionary": ["subject"],
    "column_encoding": {"seq": "DELTA_BINARY_PACKED", "ts": "DELTA_BINARY_PACKED"},
    "data_page_size": 1 << 20,
}

#: Parquet settings of a merge in a stream's active block (the gateway's continuous compaction): the
#: sealed layout with zstd at its fastest level. Such a file is rewritten again, a tier up or with
#: its whole block once the block is full, so level 9's CPU would be paid on every tier: on the
#: bench's JSON messages 0.5 µs a message against 4.0, for 11% more bytes (32 against 29 a message;
#: bench/RESULTS.md, 2026-11-29) until the block is sealed. A block that fills while it is one such
#: file keeps it: sealing merges blocks of two files or more (#23).
ACTIVE_MERGE_PARQUET: dict[str, Any] = {**SEALED_PARQUET, "compression_level": 1}


def encode_parquet(data: pa.Table, encoding: Mapping[str, Any]) -> pa.Buffer:
    """A data file's bytes: ``data`` with the parquet settings ``encoding``, statistics and page
    checksums (which the reads verify) and row groups of 64k rows."""
    sink = pa.BufferOutputStream()
    pq.write_table(
        data, sink, write_statistics=True, write_page_checksum=True, row_group_size=64 * 1024, **encoding
    )
    return sink.getvalue()


def write_data_file(
    root: StoreRoot,
    table_name: str,
    partition: Mapping[str, str],
    data: pa.Table,
    encoding: Mapping[str, Any] | None = None,
    later: list[str] | None = None,
) -> AddAction:
    """Write one parquet file into the table's directory and describe it as a Delta ``add`` action.
    ``encoding``: parquet settings (such as :data:`SEALED_PARQUET`); by default a commit file's,
    chosen by its size. On a root that syncs, the file and its directory entries are on stable
    storage when it returns, or, given ``later``, are added to it for the caller to sync with the
    rest of its commit."""
    tiny = data.nbytes < TINY_FILE_BYTES
    body = encode_parquet(data, encoding if encoding is not None else TINY_PARQUET if tiny else HOT_PARQUET)
    # The CRC-32 of the whole file is part of its name: the commit records it wherever the path goes.
    name = f"part-{uuid.uuid4().hex}-c{crc_hex(body)}.parquet"
    rel_dir = "/".join(f"{k}={v}" for k, v in partition.items())
    rel = f"{rel_dir}/{name}" if rel_dir else name
    local = root.local_path()
    if local is not None:
        # A local root is written with plain file I/O: no pyarrow filesystem made per file (and
        # no makedirs of the root with it) on the commit path.
        full = f"{local}/{table_name}/{rel}"
        new_entries = make_dirs(full.rsplit("/", 1)[0])
        with open(full, "wb") as fh:
            fh.write(body)
        # before the log entry that names it can be published
        root.settle_file(full, new_entries, later)
    else:
        fs, base = root.filesystem()
        with fs.open_output_stream(f"{base}/{table_name}/{rel}") as out:
            out.write(body)
    return AddAction(
        path=rel,
        size=body.size,
        partition_values=dict(partition),
        modification_time=int(time.time() * 1000),
        data_change=True,
        stats=file_stats(data),
    )


def commit_adds(
    dt: DeltaTable,
    actions: Sequence[AddAction | RemoveAction],
    schema: pa.Schema,
    partition_by: list[str],
    txn: tuple[str, int] | None = None,
    mode: Literal["append", "overwrite"] = "append",
    more_txns: Sequence[tuple[str, int]] = (),
) -> None:
    """Commit ``add`` (and ``remove``) actions as one Delta version, tagged with an app transaction
    when given (and ``more_txns``: the positions of sourced origins, which land with the rows).

    ``overwrite`` also removes every file of the handle's snapshot (and only those: files another
    writer appended since stay), which is how a rewrite of what was read commits.

    A lost race surfaces as :class:`CommitConflict`; the caller decides whether the commit landed by
    reading the txn marker (a commit can report an error and still land, delta-rs #2509).
    """
    txns = [*([txn] if txn else []), *more_txns]
    props = CommitProperties(
        app_transactions=[Transaction(app_id=app, version=v) for app, v in txns] or None,
    )
    try:
        dt.create_write_transaction(
            list(actions),
            mode=mode,
            schema=schema,
            partition_by=partition_by or None,
            commit_properties=props,
        )
    except (CommitFailedError, DeltaError) as exc:
        raise CommitConflict(str(exc)) from exc


@dataclass(frozen=True, slots=True)
class DamagedAdd:
    """A file of a snapshot that failed its checks: its path, why, and its ``add`` action as
    ``get_add_actions(flatten=True)`` gives it (its statistics say what its rows concerned)."""

    path: str
    reason: str
    add: dict[str, Any]


def read_checked(
    root: StoreRoot, dt: DeltaTable, name: str, schema: pa.Schema, adds: list[dict[str, Any]] | None = None
) -> tuple[pa.Table, list[DamagedAdd]]:
    """Every row of an unpartitioned table's snapshot ``dt``, each file checked first (its CRC-32,
    its pages): the rows of the files that pass, and those that do not. Where
    ``dt.to_pyarrow_table`` would fail on a damaged file, or hand its garbage on. ``adds``: of the
    snapshot's add actions (:func:`add_actions`), those to read (None: all)."""
    fs, base = root.files()
    if adds is None:
        adds = add_actions(dt)
    tables, damaged = [schema.empty_table()], []
    by_path = {f"{base}/{name}/{add['path']}": add for add in adds}
    ahead = FETCH_AHEAD if root.local_path() is None else 1
    for full, buf in fetched_ahead(fs, list(by_path), ahead):
        add = by_path[full]
        try:
            if isinstance(buf, DamagedFile):
                raise buf
            tables.append(parse_verified(buf, full, schema.names, schema))
        except DamagedFile as exc:
            damaged.append(DamagedAdd(str(add["path"]), exc.reason, add))
    return pa.concat_tables(tables), damaged


class CheckedRows:
    """Every row of an unpartitioned table as :func:`read_checked` gives them, kept from one read
    to the next: a read brings its own handle forward and reads only the files added since
    (checked as they come); when a file went (a compaction's swap, a repair), the whole snapshot
    again. A stream's new owner reads the catalog, the removal log and the ack log back right
    after its fences: a fresh load of each replayed its log and fetched every file, a third of a
    move's time on an object store (#19); kept warm by the gateway's ticks, it fetches the few
    files since. Its rows are held in memory (the tables' own, small per stream). Blocking;
    one read at a time."""

    def __init__(self, root: StoreRoot, name: str, schema: pa.Schema) -> None:
        self.root, self.name, self.schema = root, name, schema
        self._lock = threading.Lock()
        self._dt: DeltaTable | None = None
        self._files: set[str] = set()
        self._rows = schema.empty_table()
        self._damaged: list[DamagedAdd] = []

    def read(self) -> tuple[pa.Table, list[DamagedAdd]]:
        """The rows of the table's newest snapshot, and its damaged files."""
        with self._lock:
            if self._dt is None:
                self._dt = open_existing(self.root, self.name)
                if self._dt is None:
                    return self.schema.empty_table(), []
            else:
                catch_up(self._dt)
            # the paths alone of every file, the whole add actions only of the new ones
            actions = pa.table(self._dt.get_add_actions(flatten=True))
            paths = actions.column("path").to_pylist()
            files = set(paths)
            if not self._files <= files:
                self._files, self._rows, self._damaged = set(), self.schema.empty_table(), []
            fresh = [i for i, path in enumerate(paths) if path not in self._files]
            if fresh:
                adds = actions.take(pa.array(fresh, pa.int64())).to_pylist()
                rows, damaged = read_checked(self.root, self._dt, self.name, self.schema, adds)
                self._rows = pa.concat_tables([self._rows, rows])
                self._damaged += damaged
                self._files = files
            return self._rows, list(self._damaged)


def add_actions(dt: DeltaTable) -> list[dict[str, Any]]:
    """The add actions of snapshot ``dt``, one dict each (``path``, ``size_bytes``, stats...)."""
    adds: list[dict[str, Any]] = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    return adds


def read_whole(
    root: StoreRoot, dt: DeltaTable, name: str, schema: pa.Schema, adds: list[dict[str, Any]] | None = None
) -> pa.Table:
    """Every row of an unpartitioned table's snapshot (``adds``: of its files, those to read),
    each file checked; a damaged file raises :class:`DamagedFile`: for the jobs, which must not
    act on a table missing rows (a catalog without a stream's deletion, a removal log without a
    stream's deletes)."""
    table, damaged = read_checked(root, dt, name, schema, adds)
    if damaged:
        raise DamagedFile(f"{name}/{damaged[0].path}", f"{damaged[0].reason}; see jetlake repair")
    return table
