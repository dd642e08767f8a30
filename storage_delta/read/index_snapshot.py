"""Per-stream index snapshots: what a restart would otherwise scan every message file for.

A snapshot is one parquet file per stream, ``_jetlake_index/<stream>.parquet`` under the store root,
written by the gateway: (``seq``, ``ts``, ``subject``, ``size``) of every message of one stream
incarnation (``created``) that was live at some moment, up to sequence ``through``, all of them
committed. It is a cache derived from the tables, never the truth: recovery reads it, then only the
files holding sequences above ``through`` (and the header blocks it still needs), and replays the
removal log as before. A snapshot that is missing or of another incarnation is ignored and recovery
scans the files instead, as it would without one; so is a damaged one (parquet's page checksums or
its ``jetlake.digest`` fail), which is also reported (:class:`DamagedSnapshot`): the gateway lists
it on ``/healthz`` and ``/lake`` until it has written a good one over it.

What makes it exact: a sequence at or below ``through`` that the snapshot leaves out was removed,
and the gateway writes a snapshot only after every removal it shows is in the removal log
(``gateway/snapshots.py``), so a reader of the tables sees the same holes. The file is replaced
atomically (a rename on a local root; an object store's put is atomic), so a crash leaves the old
snapshot or the new one; on a root that syncs, the new file is synced before the rename and its
directory after, so a power cut does too.
"""

from __future__ import annotations

import logging
import os
import uuid
import zlib
from dataclasses import dataclass
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from storage_delta.commit.durable import fsync_path, make_dirs
from storage_delta.commit.store import StoreRoot
from storage_delta.format import schema as sch
from storage_delta.read.reader import MessageReader, StoredIndex

log = logging.getLogger(__name__)

DIR = sch.INDEX_SNAPSHOTS
#: 2: the metadata holds ``jetlake.digest`` (a snapshot of format 1 is ignored once, and rewritten).
FORMAT = b"2"

SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("subject", pa.dictionary(pa.int32(), pa.string()), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
    ]
)


@dataclass(frozen=True, slots=True)
class IndexSnapshot:
    """The live messages of incarnation ``created`` up to sequence ``through`` (no headers)."""

    created: int
    through: int
    index: StoredIndex


def _location(root: StoreRoot, stream: str) -> tuple[pafs.FileSystem, str, str]:
    fs, base = root.filesystem()
    return fs, f"{base}/{DIR}", f"{base}/{DIR}/{quote(stream, safe='')}.parquet"


def write(root: StoreRoot, stream: str, snapshot: IndexSnapshot) -> None:
    """Replace the stream's snapshot. Blocks: belongs on a worker thread."""
    idx = snapshot.index
    table = pa.table(
        {
            "seq": idx.seq,
            "ts": idx.ts,
            "subject": pa.DictionaryArray.from_arrays(
                pa.array(idx.subject_codes, pa.int32()), pa.array(idx.subjects, pa.string())
            ),
            "size": idx.size,
        },
        schema=SCHEMA,
    ).replace_schema_metadata(
        {
            b"jetlake.format": FORMAT,
            b"jetlake.created": str(snapshot.created).encode(),
            b"jetlake.through": str(snapshot.through).encode(),
            b"jetlake.digest": _digest(snapshot.created, snapshot.through, idx).encode(),
        }
    )
    fs, folder, path = _location(root, stream)
    options = {
        "compression": "zstd",
        "column_encoding": {"seq": "DELTA_BINARY_PACKED", "ts": "DELTA_BINARY_PACKED"},
        "use_dictionary": ["subject"],
        "write_page_checksum": True,
    }
    if isinstance(fs, pafs.LocalFileSystem):
        new_entries = make_dirs(folder)
        staged = f"{folder}/.{uuid.uuid4().hex}.tmp"
        pq.write_table(table, staged, filesystem=fs, **options)
        if root.synced_path() is not None:
            fsync_path(staged)  # the bytes first: a durable rename of unsynced bytes is an empty file
        os.replace(staged, path)  # atomic: a reader sees the old file or the new one
        root.settle_file(path, new_entries)
    else:
        pq.write_table(table, path, filesystem=fs, **options)


class DamagedSnapshot(Exception):
    """A stream's snapshot that cannot be trusted: never read, reported, and written again."""

    def __init__(self, stream: str, reason: str) -> None:
        super().__init__(f"index snapshot of {stream} damaged: {reason}")
        self.stream = stream
        self.reason = reason


def read(root: StoreRoot, stream: str, created: int) -> IndexSnapshot | None:
    """The stream incarnation's snapshot, None when there is none (or one of another incarnation,
    or of an older format); raises :class:`DamagedSnapshot` for a damaged one."""
    fs, _, path = _location(root, stream)
    try:
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        # ParquetFile, not read_table: that one goes through pyarrow.dataset, which imports pandas.
        with pq.ParquetFile(
            path, filesystem=fs, read_dictionary=["subject"], page_checksum_verification=True
        ) as parquet:
            table = parquet.read()
    except (OSError, pa.ArrowException) as exc:
        raise DamagedSnapshot(stream, f"unreadable ({exc})") from exc
    meta = table.schema.metadata or {}
    if meta.get(b"jetlake.format") != FORMAT or meta.get(b"jetlake.created") != str(created).encode():
        return None
    subject = table.column("subject").unify_dictionaries()
    names = subject.chunk(0).dictionary.to_pylist() if subject.num_chunks else []
    codes = [c.indices.to_numpy(zero_copy_only=False) for c in subject.chunks]
    index = StoredIndex(
        table.column("seq").to_numpy(),
        table.column("ts").to_numpy(),
        table.column("size").to_numpy(),
        np.concatenate(codes).astype(np.int64) if codes else np.zeros(0, np.int64),
        names,
        [],
    )
    through = meta.get(b"jetlake.through", b"")
    if not through.isdigit() or meta.get(b"jetlake.digest") != _digest(created, int(through), index).encode():
        # A flipped bit that parquet's checks passed (a value, the footer's metadata): not trusted.
        raise DamagedSnapshot(stream, "its digest does not match what it holds")
    return IndexSnapshot(created, int(through), index)


def unheld_tail(root: StoreRoot, reader: MessageReader, stream: str, created: int) -> tuple[int, int] | None:
    """The sequences the incarnation's snapshot says were committed above the newest file of the
    stream the table holds, None when none (or no snapshot): ``jetlake repair`` records them as
    removed when a log entry that may have added them was set aside, so they are never given out
    again."""
    try:
        snapshot = read(root, stream, created)
    except DamagedSnapshot as exc:
        log.warning("%s: it tells no lost tail", exc)
        return None
    held = max((f.max_seq for f in reader.stream_files(stream)), default=0)
    return (held + 1, snapshot.through) if snapshot is not None and snapshot.through > held else None


def _digest(created: int, through: int, index: StoredIndex) -> str:
    """CRC-32 of everything a snapshot says (its arrays, its subjects, what it covers), over the
    values as recovery uses them: a damaged snapshot is ignored, never half believed."""
    crc = zlib.crc32(f"{created}:{through}:".encode())
    for array in (index.seq, index.ts, index.size, index.subject_codes):
        crc = zlib.crc32(np.ascontiguousarray(array, np.int64).tobytes(), crc)
    crc = zlib.crc32("\0".join(index.subjects).encode(), crc)
    return f"{crc & 0xFFFFFFFF:08x}"


def load_index(
    root: StoreRoot,
    reader: MessageReader,
    stream: str,
    created: int,
    headers_since: int,
    overhead: tuple[int, int],
    at_least: int | None = None,
) -> tuple[StoredIndex, int, DamagedSnapshot | None]:
    """Recovery's index of a stream: its snapshot and the files above it (every file without
    one, or with a damaged one) as of version ``at_least`` of the table or a newer one
    (``MessageReader.stream_files``); how far the snapshot went (0 without one); and the snapshot's
    damage, to report. Sizes count ``overhead`` (the stream's ``RECORD_OVERHEAD``; the snapshot
    holds the sizes the stream counted). Blocks: belongs on a worker thread."""
    try:
        snapshot, damage = read(root, stream, created), None
    except DamagedSnapshot as exc:
        log.error("%s; recovering from the message files", exc)
        snapshot, damage = None, exc
    through = snapshot.through if snapshot is not None else 0
    tail = reader.stored_index(stream, created, headers_since, through, overhead, at_least)
    return (snapshot.index.after(tail) if snapshot is not None else tail), through, damage


def written_times(root: StoreRoot) -> dict[str, int]:
    """When each stream's snapshot was last written (Unix ns, the file's modification time), by
    stream name: the monitor shows their age. One listing; blocks: belongs on a worker thread."""
    fs, folder, _ = _location(root, "")
    infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    return {
        unquote(info.base_name[: -len(".parquet")]): int(info.mtime_ns or 0)
        for info in infos
        if info.base_name.endswith(".parquet")
    }


def remove_others(root: StoreRoot, live: set[str]) -> None:
    """Delete the snapshots of streams that no longer exist."""
    fs, folder, _ = _location(root, "")
    try:
        infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    except OSError:
        return
    for info in infos:
        name = info.base_name
        if name.endswith(".parquet") and unquote(name[: -len(".parquet")]) not in live:
            fs.delete_file(info.path)
