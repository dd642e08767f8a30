"""Reading messages back: by sequence range, the first sequence at or after a time, the last
message per subject, and the compact scan that rebuilds stream state on start.

Every read picks its files from the Delta log's per-file statistics first (partition ``stream``, then
the min/max of ``seq`` and ``ts`` that every add action carries), and lets parquet's row-group
statistics do the rest, so the cost of a read follows what it asks for, not the table's size. A
commit file covers a contiguous sequence range and a sealed file a whole block, so the files of a
stream never overlap in sequences: that is what lets a search stop at the first file that answers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from storage_delta.commit.store import StoreRoot, catch_up, open_existing
from storage_delta.format import schema as sch
from storage_delta.format.integrity import (
    FETCH_AHEAD,
    DamagedFile,
    RowBounds,
    fetched_ahead,
    parse_verified,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DataFile:
    """One live parquet file of a stream, with the statistics its add action carries."""

    stream: str
    path: str
    min_seq: int
    max_seq: int
    min_ts: int
    max_ts: int
    #: Whether the file may hold a header block (its statistics count fewer nulls than rows).
    has_headers: bool = True


@dataclass(frozen=True, slots=True)
class FileDamage:
    """A live data file that failed its checks: what it held (from its add action) and why."""

    file: DataFile
    reason: str


class MessageReader:
    """Reads the ``messages`` table; every method blocks and belongs on a worker thread, and one
    reader serves all of the gateway's worker threads at once."""

    def __init__(self, root: StoreRoot) -> None:
        self.root = root
        self._dt: DeltaTable | None = None
        self._fs, base = root.files()
        self._base = f"{base}/{sch.MESSAGES}"
        self._files: dict[str, list[DataFile]] = {}
        self._files_version = -1
        #: The gateway's worker threads share the reader: a listing is taken and cached as its
        #: version under this lock, or one thread could keep a listing it took before another
        #: caught the handle up, as the newer version's (its newest files' messages read as gone).
        self._listing = threading.Lock()
        #: Damaged files found by a read or :meth:`verify` (path -> what and why); never read again.
        self.damaged: dict[str, FileDamage] = {}
        self._verified: set[str] = set()

    # ---- table state ----------------------------------------------------------------------------

    def _table(self, at_least: int | None) -> DeltaTable | None:
        if self._dt is None:
            self._dt = open_existing(self.root, sch.MESSAGES)
        elif at_least is None or self._dt.version() < at_least:
            catch_up(self._dt)
        return self._dt

    def version(self) -> int:
        """The table's newest version, the handle brought forward to it (-1: no table yet): a
        takeover's reads then ask for no newer listing than this (``at_least``)."""
        with self._listing:
            dt = self._table(None)
            return -1 if dt is None else dt.version()

    def stream_files(self, stream: str, at_least: int | None = None) -> list[DataFile]:
        """The stream's live files in sequence order (cached per table version), as of the newest
        version or, given ``at_least``, of any version from that on: a takeover's reads of the
        streams it claimed need the files their fences found and nothing newer (no one else
        writes those streams now), where a newer listing is, on an object store, a listing of
        the log and a read of every entry another gateway committed since, per stream read."""
        with self._listing:
            dt = self._table(at_least)
            if dt is None:
                return []
            if dt.version() != self._files_version:
                self._files = _files_by_stream(dt)
                self._files_version = dt.version()
                self._verified &= {f.path for files in self._files.values() for f in files}
            return self._files.get(stream, [])

    def _read(self, files: list[DataFile], columns: list[str], bounds: RowBounds | None) -> pa.Table:
        """The files' rows, each file checked first (its CRC-32, its pages, its footer): a damaged
        file is left out, logged and remembered (:attr:`damaged`), never served."""
        tables = list(self._verified_tables(files, columns, bounds))
        if not tables:
            return sch.MESSAGE_FILE_SCHEMA.empty_table().select(columns)
        return pa.concat_tables(tables)

    def _verified_tables(
        self, files: list[DataFile], columns: list[str], bounds: RowBounds | None = None
    ) -> Iterator[pa.Table]:
        wanted = {f"{self._base}/{f.path}": f for f in files if f.path not in self.damaged}
        for full, buf in fetched_ahead(self._fs, list(wanted), self._ahead()):
            f = wanted[full]
            try:
                if isinstance(buf, DamagedFile):
                    raise buf
                table = parse_verified(buf, full, columns, sch.MESSAGE_FILE_SCHEMA, bounds)
            except DamagedFile as exc:
                self._found_damage(f, exc.reason)
                continue
            self._verified.add(f.path)
            yield table

    def _ahead(self) -> int:
        """Files fetched side by side: several on an object store, one at a time locally."""
        return FETCH_AHEAD if self.root.local_path() is None else 1

    def _found_damage(self, f: DataFile, reason: str) -> None:
        self.damaged[f.path] = FileDamage(f, reason)
        log.error(
            "damaged data file %s/%s (stream %s, sequences %d-%d), not served: %s",
            sch.MESSAGES,
            f.path,
            f.stream,
            f.min_seq,
            f.max_seq,
            reason,
        )

    def verify(self, stream: str, at_least: int | None = None) -> list[FileDamage]:
        """Check every live file of ``stream`` not checked yet (its CRC-32 only: the pages are
        checked when a read decodes them); returns the stream's damaged files. Recovery calls it for
        the files below an index snapshot, which it does not read (``at_least``: as
        :meth:`stream_files`)."""
        wanted = {
            f"{self._base}/{f.path}": f
            for f in self.stream_files(stream, at_least)
            if f.path not in self._verified and f.path not in self.damaged
        }
        # fetched side by side on an object store: a takeover checks every file of each stream
        # it takes, and one after another that was a round trip or two per file of the move (#19)
        for full, buf in fetched_ahead(self._fs, list(wanted), self._ahead()):
            f = wanted[full]
            if isinstance(buf, DamagedFile):
                self._found_damage(f, buf.reason)
                continue
            self._verified.add(f.path)
        return self.damage(stream)

    def damage(self, stream: str | None = None) -> list[FileDamage]:
        """The damaged files found so far that were live at the last read (of ``stream``, or of
        every stream), in sequence order. Reads no table (``/healthz`` asks on the event loop) and
        copies what worker threads may be changing."""
        files = self._files
        wanted = files.get(stream, []) if stream is not None else [f for fs in files.values() for f in fs]
        live = {f.path for f in wanted}
        found = [d for path, d in list(self.damaged.items()) if path in live]
        return sorted(found, key=lambda d: (d.file.stream, d.file.min_seq))

    # ---- reads ----------------------------------------------------------------------------------

    def read_range(self, stream: str, first: int, last: int, block_size: int, min_ts: int = 0) -> pa.Table:
        """Messages with ``first <= seq <= last`` of one stream, ordered by sequence; ``min_ts`` (the
        stream's created time) leaves out rows of an earlier stream of the same name.
        (``block_size`` is kept for callers; the file statistics already bound the blocks.)"""
        del block_size
        files = [
            f
            for f in self.stream_files(stream)
            if f.max_seq >= first and f.min_seq <= last and f.max_ts >= min_ts
        ]
        bounds = RowBounds(first_seq=first, last_seq=last, min_ts=min_ts)
        return self._read(files, sch.MESSAGE_FILE_SCHEMA.names, bounds).sort_by("seq")

    def first_seq_at_time(self, stream: str, ts: int, min_ts: int = 0) -> int | None:
        """The first sequence stored at or after ``ts`` (Unix ns), as ``opt_start_time`` and
        ``MSG.GET start_time`` need; None when every message is older."""
        at = max(ts, min_ts)
        bounds = RowBounds(min_ts=at)
        for f in self.stream_files(stream):
            if f.max_ts < at:
                continue
            seqs = self._read([f], ["seq"], bounds).column("seq")
            if len(seqs):
                return int(pc.min(seqs).as_py())
        return None

    def last_for_subject(self, stream: str, subject: str, min_ts: int = 0) -> pa.Table:
        """The newest message stored on ``subject`` (zero or one row): ``MSG.GET last_by_subj`` and
        a KV get. Files are searched newest first, so a recent key costs one small file."""
        bounds = RowBounds(min_ts=min_ts, subject=subject)
        for f in reversed(self.stream_files(stream)):
            if f.max_ts < min_ts:
                continue  # an earlier stream of the same name
            rows = self._read([f], sch.MESSAGE_FILE_SCHEMA.names, bounds)
            if rows.num_rows:
                return rows.sort_by([("seq", "descending")]).slice(0, 1)
        return sch.MESSAGE_FILE_SCHEMA.empty_table()

    def last_per_subject(self, stream: str, min_ts: int = 0) -> dict[str, int]:
        """Subject → last sequence stored on it, from a scan of only the ``seq`` and ``subject``
        columns (``deliver_policy: last_per_subject``, KV watchers, recovery)."""
        files = [f for f in self.stream_files(stream) if f.max_ts >= min_ts]
        table = self._read(files, ["seq", "subject"], RowBounds(min_ts=min_ts))
        if table.num_rows == 0:
            return {}
        last = table.group_by("subject").aggregate([("seq", "max")])
        return dict(zip(last.column("subject").to_pylist(), last.column("seq_max").to_pylist(), strict=True))

    def stored_index(
        self,
        stream: str,
        min_ts: int = 0,
        headers_since: int | None = None,
        after: int = 0,
        overhead: tuple[int, int] = sch.FILE_RECORD,
        at_least: int | None = None,
    ) -> StoredIndex:
        """The index of the stored messages of a stream above sequence ``after`` stored at or after
        ``min_ts`` (its incarnation), in sequence order, as arrays: what the gateway rebuilds its
        state from without a Python object per message. Sizes come from the binary lengths.

        With ``headers_since``, the header blocks of every message stored since then that has one
        come along (also below ``after``): from the same scan, and from the older files whose
        statistics say they hold a header block at all. ``overhead`` is the stream's storage's
        ``schema.RECORD_OVERHEAD``, which sizes count; ``at_least`` as :meth:`stream_files`."""
        files = [f for f in self.stream_files(stream, at_least) if f.max_ts >= min_ts]
        tail = [f for f in files if f.max_seq > after]
        table, data_len = self._index_rows(tail, min_ts, after)
        headers = []
        if headers_since is not None:
            older = [f for f in files if f.max_seq <= after and f.max_ts >= headers_since and f.has_headers]
            headers.append(self._read(older, ["seq", "ts", "hdrs"], RowBounds(min_ts=headers_since)))
            rows = table.select(["seq", "ts", "hdrs"])
            headers.append(
                rows.filter(pc.and_(pc.is_valid(rows["hdrs"]), pc.greater_equal(rows["ts"], headers_since)))
            )
        return StoredIndex.build(table, data_len, headers, overhead)

    def _index_rows(self, files: list[DataFile], min_ts: int, after: int) -> tuple[pa.Table, list[pa.Array]]:
        """``seq``, ``ts``, ``subject``, ``hdrs`` of the files' rows stored at or after ``min_ts``
        above ``after``, and the lengths of their payloads. Batch by batch, so the payloads (read
        only for their lengths) never all sit in memory; everything else is computed once over the
        whole columns (a batch is a commit file of a few hundred rows: per-batch work would cost
        more than the read)."""
        columns = ["seq", "ts", "subject", "hdrs"]
        if not files:
            return sch.MESSAGE_FILE_SCHEMA.empty_table().select(columns), []
        older = any(f.min_ts < min_ts for f in files)  # rows of an earlier stream of the same name
        straddles = any(f.min_seq <= after for f in files)
        batches, data_len = [], []
        for batch in self._verified_tables(files, [*columns, "data"]):
            if older:
                batch = batch.filter(pc.greater_equal(batch.column("ts"), min_ts))
            if straddles:
                batch = batch.filter(pc.greater(batch.column("seq"), after))
            data_len.extend(pc.binary_length(batch.column("data")).chunks)
            batches.append(batch.select(columns))
        empty = sch.MESSAGE_FILE_SCHEMA.empty_table().select(columns)
        return pa.concat_tables([empty, *batches]), data_len

    def scan_index(self, stream: str, min_ts: int = 0) -> list[tuple[int, int, str, int]]:
        """(seq, ts, subject, stored size) of every stored message of a stream stored at or after
        ``min_ts``, in sequence order, as Python tuples (:meth:`stored_index` is the bulk form)."""
        index = self.stored_index(stream, min_ts)
        names = index.subjects
        return list(
            zip(
                index.seq.tolist(),
                index.ts.tolist(),
                [names[c] for c in index.subject_codes.tolist()],
                index.size.tolist(),
                strict=True,
            )
        )


@dataclass(frozen=True, slots=True)
class StoredIndex:
    """A stream's stored messages as arrays in sequence order: ``seq``, ``ts``, ``size`` (int64)
    and ``subject_codes`` (int64 positions in ``subjects``); ``headers`` holds (seq, ts, header
    block) of the messages with a header block, in sequence order."""

    seq: np.ndarray
    ts: np.ndarray
    size: np.ndarray
    subject_codes: np.ndarray
    subjects: list[str]
    headers: list[tuple[int, int, bytes]]

    @classmethod
    def empty(cls) -> StoredIndex:
        none = np.zeros(0, np.int64)
        return cls(none, none, none, none, [], [])

    @classmethod
    def build(
        cls,
        table: pa.Table,
        data_len: list[pa.Array],
        headers: list[pa.Table],
        overhead: tuple[int, int] = sch.FILE_RECORD,
    ) -> StoredIndex:
        """From the ``seq``, ``ts``, ``subject`` and ``hdrs`` columns and the lengths of the
        payloads; ``headers`` are tables of (``seq``, ``ts``, ``hdrs``) rows with a header block."""
        with_hdrs = pa.concat_tables(headers).sort_by("seq") if headers else None
        header_rows = (
            list(
                zip(
                    with_hdrs.column("seq").to_pylist(),
                    with_hdrs.column("ts").to_pylist(),
                    with_hdrs.column("hdrs").to_pylist(),
                    strict=True,
                )
            )
            if with_hdrs is not None
            else []
        )
        seq = _int64(table.column("seq").chunks)
        if len(seq) == 0:
            return replace(cls.empty(), headers=header_rows)
        encoded = table.column("subject").dictionary_encode()
        codes = _int64([c.indices for c in encoded.chunks])
        names = encoded.chunk(0).dictionary.to_pylist()
        hdrs = table.column("hdrs")
        # A record's stored size as its stream's store counts it (schema.stored_size).
        per_msg, per_hdrs = overhead
        size = per_msg + np.array([len(n) for n in names], np.int64)[codes] + _int64(data_len)
        if hdrs.null_count < len(hdrs):
            size += _int64(pc.fill_null(pc.add(pc.binary_length(hdrs), per_hdrs), 0).chunks)
        ts = _int64(table.column("ts").chunks)
        if len(seq) > 1 and not bool(np.all(seq[1:] > seq[:-1])):
            order = np.argsort(seq, kind="stable")
            seq, ts, size, codes = seq[order], ts[order], size[order], codes[order]
        return cls(seq, ts, size, codes, names, header_rows)

    def after(self, tail: StoredIndex) -> StoredIndex:
        """This index followed by ``tail``, whose sequences are all higher; the headers are
        ``tail``'s (they were read for the whole stream)."""
        offset = len(self.subjects)
        return StoredIndex(
            np.concatenate([self.seq, tail.seq]),
            np.concatenate([self.ts, tail.ts]),
            np.concatenate([self.size, tail.size]),
            np.concatenate([self.subject_codes, tail.subject_codes + offset]),
            self.subjects + tail.subjects,
            tail.headers,
        )


def _int64(chunks: list[pa.Array]) -> np.ndarray:
    if not chunks:
        return np.zeros(0, np.int64)
    column: np.ndarray = pa.chunked_array(chunks).to_numpy()
    return column.astype(np.int64, copy=False)


def _files_by_stream(dt: DeltaTable) -> dict[str, list[DataFile]]:
    adds = pa.table(dt.get_add_actions(flatten=True))
    if adds.num_rows == 0:
        return {}
    cols = {name: adds.column(name).to_pylist() for name in ("path", "partition.stream")}
    stats = {name: _stat(adds, name) for name in ("min.seq", "max.seq", "min.ts", "max.ts")}
    rows, hdr_nulls = (
        adds.column(name).to_pylist() if name in adds.column_names else [None] * adds.num_rows
        for name in ("num_records", "null_count.hdrs")
    )
    out: dict[str, list[DataFile]] = {}
    for i, (path, stream) in enumerate(zip(cols["path"], cols["partition.stream"], strict=True)):
        n, nulls = rows[i], hdr_nulls[i]
        has_headers = n is None or nulls is None or nulls < n
        out.setdefault(stream, []).append(
            DataFile(
                stream,
                path,
                stats["min.seq"][i],
                stats["max.seq"][i],
                stats["min.ts"][i],
                stats["max.ts"][i],
                has_headers,
            )
        )
    for files in out.values():
        files.sort(key=lambda f: f.min_seq)
    return out


def _stat(adds: pa.Table, name: str) -> list[int]:
    """A statistics column; a file without statistics must never be pruned, so a missing value
    becomes the widest bound."""
    wide = -(2**63) if name.startswith("min.") else 2**63 - 1
    if name not in adds.column_names:
        return [wide] * adds.num_rows
    return [wide if v is None else int(v) for v in adds.column(name).to_pylist()]
