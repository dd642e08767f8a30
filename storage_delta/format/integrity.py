"""Damage detection: a flipped bit or a cut tail in a data file, a Delta log entry or a checkpoint is
found before anything of it is served as data.

Why digests of our own: parquet's page checksums cover the pages only (not the footer, whose
statistics and offsets a reader trusts), a JSON log entry whose flipped bit still parses (a digit of
a statistic, of a size) is taken at its word by every Delta reader, and a cut exactly at a line's end
leaves valid JSON. So every commit records a digest where the protocol lets a writer put one and every
Delta reader ignores it:

* a data file's CRC-32 is part of its name (``part-<uuid>-c<crc>.parquet``): it travels with the path
  through every log entry, checkpoint and swap, whichever writer made the commit. The file is also
  written with parquet page checksums, which every read verifies;
* a log entry this writer makes starts with a ``commitInfo`` holding the CRC-32 of each following line
  (``jetlakeLines``), so a damaged line is known by its position (what repair keeps and drops);
* a checkpoint (delta-rs writes it) is decoded in full: parquet's footer and page structure are the
  check, with page checksums where delta-rs wrote them.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

#: Name of a data file with its CRC-32 in it (``uuid`` is 32 hex digits, the CRC 8).
_DIGEST_NAME = re.compile(r"-c([0-9a-f]{8})\.parquet$")

#: The ``commitInfo`` key holding the CRC-32 of every following line of a log entry, in order.
LINES_KEY = "jetlakeLines"


class DamagedFile(Exception):
    """A data file whose bytes are not what its commit wrote (its CRC-32, or parquet's own checks)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def crc_hex(data: bytes | memoryview | pa.Buffer) -> str:
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def digest_of(path: str) -> str | None:
    """The CRC-32 a data file's name records, None for a file written before names carried one."""
    match = _DIGEST_NAME.search(path)
    return match.group(1) if match else None


class ReadFiles(Protocol):
    """Where whole files are read from: a pyarrow filesystem, or on S3 one GET a file
    (``storage_delta.commit.store.ObjectFiles``)."""

    def open_input_file(self, path: str) -> Any: ...


def verified_bytes(fs: ReadFiles, full: str) -> pa.Buffer:
    """A data file's bytes, checked against the CRC-32 in its name; raises :class:`DamagedFile`."""
    try:
        with fs.open_input_file(full) as fh:
            buf: pa.Buffer = fh.read_buffer()
    except OSError as exc:
        raise DamagedFile(full, f"unreadable: {exc}") from exc
    want = digest_of(full)
    if want is not None and crc_hex(buf) != want:
        raise DamagedFile(full, f"CRC-32 {crc_hex(buf)} but its commit recorded {want}")
    return buf


@dataclass(frozen=True, slots=True)
class RowBounds:
    """The rows of a message file a read keeps: sequences from ``first_seq`` to ``last_seq``, stored
    at or after ``min_ts``, on ``subject`` (each None for no bound).

    Not a pyarrow expression: filtering by one (``pq.read_table(filters=...)``, ``Table.filter``)
    goes through ``pyarrow.dataset``, whose import pulls in pandas, half a second to a second of
    every gateway start on this kind of machine, for bounds this simple."""

    first_seq: int | None = None
    last_seq: int | None = None
    min_ts: int | None = None
    subject: str | None = None

    def columns(self) -> list[str]:
        """The columns the bounds look at."""
        named = [
            ("seq", self.first_seq, self.last_seq),
            ("ts", self.min_ts, None),
            ("subject", self.subject, None),
        ]
        return [name for name, low, high in named if low is not None or high is not None]

    def may_hold(self, row_group: pq.RowGroupMetaData) -> bool:
        """False when the row group's statistics show it holds no row within the bounds: the pruning
        a filtered ``read_table`` did."""
        for i in range(row_group.num_columns):
            column = row_group.column(i)
            stats = column.statistics
            if stats is None or not stats.has_min_max:
                continue
            if column.path_in_schema == "seq":
                low, high = self.first_seq, self.last_seq
            elif column.path_in_schema == "ts":
                low, high = self.min_ts, None
            else:
                continue
            if (low is not None and stats.max < low) or (high is not None and stats.min > high):
                return False
        return True

    def keep(self, table: pa.Table) -> pa.Table:
        """The rows of ``table`` within the bounds."""
        conditions = []
        if self.first_seq is not None:
            conditions.append(pc.greater_equal(table["seq"], self.first_seq))
        if self.last_seq is not None:
            conditions.append(pc.less_equal(table["seq"], self.last_seq))
        if self.min_ts is not None:
            conditions.append(pc.greater_equal(table["ts"], self.min_ts))
        if self.subject is not None:
            conditions.append(pc.equal(table["subject"], self.subject))
        if not conditions:
            return table
        mask = conditions[0]
        for condition in conditions[1:]:
            mask = pc.and_(mask, condition)
        return table.filter(mask)


#: Files fetched side by side from an object store (each a round trip or two of its own).
FETCH_AHEAD = 8

Item = TypeVar("Item")
Done = TypeVar("Done")


def side_by_side(work: Callable[[Item], Done], items: Sequence[Item]) -> list[Done]:
    """``work`` of every item, in order, up to ``FETCH_AHEAD`` at once: for round trips to an object
    store, which overlap (one after another, each waits out the others' latency)."""
    if len(items) < 2:
        return [work(item) for item in items]
    with ThreadPoolExecutor(min(len(items), FETCH_AHEAD), thread_name_prefix="jetlake-fetch") as pool:
        return list(pool.map(work, items))


def fetched_ahead(
    fs: ReadFiles, paths: list[str], ahead: int
) -> Iterator[tuple[str, pa.Buffer | DamagedFile]]:
    """Each of ``paths`` with its verified bytes (:func:`verified_bytes`), or the
    :class:`DamagedFile` that says why not, in order; up to ``ahead`` fetched side by side, so an
    object store's round trips overlap (no more held at once, so a long list of large files
    never sits in memory whole). ``ahead`` 1: one after another, on the calling thread."""

    def fetch(path: str) -> pa.Buffer | DamagedFile:
        try:
            return verified_bytes(fs, path)
        except DamagedFile as exc:
            return exc

    if ahead <= 1 or len(paths) <= 1:
        for path in paths:
            yield path, fetch(path)
        return
    with ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="jetlake-fetch") as pool:
        pending: deque[tuple[str, Future[pa.Buffer | DamagedFile]]] = deque()
        for path in paths:
            pending.append((path, pool.submit(fetch, path)))
            if len(pending) >= ahead:
                done, future = pending.popleft()
                yield done, future.result()
        while pending:
            done, future = pending.popleft()
            yield done, future.result()


def read_verified(
    fs: pafs.FileSystem,
    full: str,
    columns: list[str] | None,
    schema: pa.Schema,
    bounds: RowBounds | None = None,
) -> pa.Table:
    """The file's rows within ``bounds`` (``columns`` of them, as ``schema`` types them; a column
    the file lacks comes as nulls), after its CRC-32 and every page checksum and the footer were
    checked; raises :class:`DamagedFile`."""
    return parse_verified(verified_bytes(fs, full), full, columns, schema, bounds)


def parse_verified(
    buf: pa.Buffer,
    full: str,
    columns: list[str] | None,
    schema: pa.Schema,
    bounds: RowBounds | None = None,
) -> pa.Table:
    """:func:`read_verified` of the bytes ``buf`` of file ``full`` (its CRC-32 checked already)."""
    wanted = schema.names if columns is None else columns
    looked_at = [c for c in (bounds.columns() if bounds else []) if c not in wanted]
    try:
        with pq.ParquetFile(pa.BufferReader(buf), page_checksum_verification=True) as parquet:
            present = set(parquet.schema_arrow.names)
            meta = parquet.metadata
            groups = [
                g for g in range(meta.num_row_groups) if bounds is None or bounds.may_hold(meta.row_group(g))
            ]
            table = parquet.read_row_groups(groups, columns=[c for c in wanted + looked_at if c in present])
    except (OSError, pa.ArrowException) as exc:
        raise DamagedFile(full, f"parquet: {exc}") from exc
    for name in wanted + looked_at:
        if name not in present:
            field = schema.field(name)
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    if bounds is not None:
        table = bounds.keep(table)
    target = pa.schema([schema.field(name) for name in wanted])
    table = table.select(wanted)
    return table if table.schema.equals(target) else table.cast(target)


def lines_digest(lines: list[bytes]) -> list[str]:
    """The per-line digests a log entry's ``commitInfo`` records."""
    return [crc_hex(line) for line in lines]


def check_log_entry(body: bytes, creation: bool = False) -> list[int]:
    """The positions (0 = the first line) of the damaged lines of a log entry; empty when it is
    whole. A line that is not JSON is damaged; with digests (our commits) a line whose CRC-32
    differs, and a missing line (a cut tail), too: without them (commits delta-rs made) a cut at a
    line's end goes unnoticed, except in a table's ``creation`` (version 0), which must hold a
    ``protocol`` and a ``metaData``: one missing is a missing line (its position past the last).
    A damaged ``commitInfo`` takes the digests with it, so then every line that parses counts as
    whole."""
    raw = body.split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    if not raw:
        return [0]  # no commitInfo at all (cut to nothing): every Delta reader takes it for an empty commit
    parsed = [_json(line) for line in raw]
    bad = [i for i, obj in enumerate(parsed) if obj is None]
    first = parsed[0] if parsed else None
    digests = first.get("commitInfo", {}).get(LINES_KEY) if first is not None else None
    if not isinstance(digests, list):
        if creation and not bad:
            present = {key for obj in parsed if obj is not None for key in obj}
            missing = [kind for kind in ("protocol", "metaData") if kind not in present]
            bad.extend(range(len(raw), len(raw) + len(missing)))
        return bad  # delta-rs's own commits (no digests, no final newline): whether they parse
    for i, want in enumerate(digests, start=1):
        if i >= len(raw) or crc_hex(raw[i]) != want:
            bad.append(i)
    bad.extend(range(len(digests) + 1, len(raw)))  # lines nobody wrote
    return sorted(set(bad))


def _json(line: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


@dataclass(frozen=True, slots=True)
class LogDamage:
    """A damaged file of a table's ``_delta_log``: a JSON entry (``version``, its bad lines) or a
    checkpoint."""

    path: str
    version: int
    kind: str  # "log entry" or "checkpoint"
    reason: str
    bad_lines: tuple[int, ...] = ()


_ENTRY = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(\.\d+\.\d+)?\.parquet$")


def scan_log(table_path: str, newest_only: bool = False) -> Iterator[LogDamage]:
    """Every damaged log entry and checkpoint of a local table; with ``newest_only``, those a load
    of the newest version reads: the checkpoints from the newest down to the first whole one, and
    the entries after it (the gateway's start). Older entries and checkpoints are read by a time
    travel only, and checking them all made a restart cost in proportion to every commit the table
    ever had: after 20,000 one-message commits and their compaction the start's check took 2.4 s,
    0.1 s with this. When ``_last_checkpoint`` names a whole checkpoint the log is not even listed
    (the log keeps ``log_retention_ms`` of entries: hundreds of thousands under a sync publisher):
    see :func:`_scan_from_last_checkpoint`. Blocking: belongs on a worker thread."""
    log_dir = os.path.join(table_path, "_delta_log")
    if newest_only:
        found = _scan_from_last_checkpoint(table_path, log_dir)
        if found is not None:
            yield from found
            return
    yield from _scan_listed(table_path, log_dir, newest_only)


def _scan_listed(table_path: str, log_dir: str, newest_only: bool) -> Iterator[LogDamage]:
    """:func:`scan_log` through a listing of ``_delta_log``."""
    try:
        names = sorted(os.listdir(log_dir))
    except FileNotFoundError:
        return
    if (hint := _stale_hint(log_dir, names)) is not None:
        yield hint
    floor = -1  # the version of the whole checkpoint a load starts from
    if newest_only:
        for name in reversed(names):
            if checkpoint := _CHECKPOINT.match(name):
                damage = _checkpoint_damage(table_path, os.path.join(log_dir, name), int(checkpoint.group(1)))
                if damage is None:
                    floor = int(checkpoint.group(1))
                    break
                yield damage
    for name in names[bisect_right(names, f"{floor:020d}.json") if floor >= 0 else 0 :]:
        path = os.path.join(log_dir, name)
        if entry := _ENTRY.match(name):
            version = int(entry.group(1))
            with open(path, "rb") as fh:
                bad = check_log_entry(fh.read(), creation=version == 0)
            if bad:
                where = ", ".join(str(i + 1) for i in bad)
                yield LogDamage(path, version, "log entry", f"damaged line(s) {where}", tuple(bad))
        elif not newest_only and (checkpoint := _CHECKPOINT.match(name)):
            damage = _checkpoint_damage(table_path, path, int(checkpoint.group(1)))
            if damage is not None:
                yield damage


def _stale_hint(log_dir: str, names: list[str]) -> LogDamage | None:
    """``_last_checkpoint`` naming a checkpoint that is not there: Delta readers (delta-rs, DuckDB)
    then refuse the table (one that does not parse they ignore, but a flipped low bit of a digit is
    still a digit)."""
    path = os.path.join(log_dir, "_last_checkpoint")
    try:
        with open(path, "rb") as fh:
            version = int(json.loads(fh.read())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if any(name.startswith(f"{version:020d}.checkpoint") for name in names):
        return None
    return LogDamage(path, version, "checkpoint hint", f"names checkpoint {version}, which is not there")


def _scan_from_last_checkpoint(table_path: str, log_dir: str) -> list[LogDamage] | None:
    """:func:`scan_log` ``newest_only`` without a listing of ``_delta_log``: from the single-file
    checkpoint ``_last_checkpoint`` names, if whole, the entries after it one by one until the
    first missing version (versions are contiguous), and any checkpoint among them (a newer one
    ``_last_checkpoint`` does not name yet, as a crash between the two renames leaves it): a whole
    one becomes where a load starts, so the damage found below it no longer counts. None when
    there is no such checkpoint to start from: the caller lists the log."""
    try:
        with open(os.path.join(log_dir, "_last_checkpoint"), "rb") as fh:
            last = json.load(fh)
        version = int(last["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if last.get("parts"):
        return None
    path = os.path.join(log_dir, f"{version:020d}.checkpoint.parquet")
    if not os.path.exists(path) or _checkpoint_damage(table_path, path, version) is not None:
        return None
    found: list[LogDamage] = []
    while True:
        version += 1
        path = os.path.join(log_dir, f"{version:020d}.json")
        try:
            with open(path, "rb") as fh:
                bad = check_log_entry(fh.read())
        except FileNotFoundError:
            return found
        if bad:
            where = ", ".join(str(i + 1) for i in bad)
            found.append(LogDamage(path, version, "log entry", f"damaged line(s) {where}", tuple(bad)))
        newer = os.path.join(log_dir, f"{version:020d}.checkpoint.parquet")
        if os.path.exists(newer):
            damage = _checkpoint_damage(table_path, newer, version)
            found = [] if damage is None else [*found, damage]


def _checkpoint_damage(table_path: str, path: str, version: int) -> LogDamage | None:
    reason = _checkpoint_problem(path, checkpoint_digest_path(table_path, version))
    return None if reason is None else LogDamage(path, version, "checkpoint", reason)


def _checkpoint_problem(path: str, digest_path: str) -> str | None:
    """Why a checkpoint cannot be trusted (its recorded CRC-32, else a full decode), None if it can.
    A matching CRC-32 is enough: the bytes are those written. The decode, for a checkpoint without
    one (a Spark job's, or one a crash caught before its digest), costs seconds at start for the
    checkpoint of a stream written one message per commit (an hour of the compaction's tombstones,
    8.7 MB after 100,000 commits), and the first one imports pandas through ``pyarrow.dataset``:
    hence ``ParquetFile``."""
    try:
        with open(digest_path) as fh:
            want = fh.read().strip()
    except FileNotFoundError:
        want = None
    if want is not None:
        with open(path, "rb") as fh:
            got = crc_hex(fh.read())
        return None if got == want else f"CRC-32 {got} but {want} was recorded when it was written"
    try:
        with pq.ParquetFile(path, page_checksum_verification=True) as checkpoint:
            checkpoint.read(use_threads=False)
    except (OSError, pa.ArrowException) as exc:
        return f"parquet: {exc}"
    return None


def checkpoint_digest_path(table_path: str, version: int) -> str:
    """Where the CRC-32 of a table's checkpoint at ``version`` is kept: outside ``_delta_log`` (no
    Delta reader looks there) and beside the table's other jetlake-only folders."""
    return os.path.join(table_path, "_jetlake_checkpoints", f"{version:020d}.crc32")


def record_checkpoint_digest(table_path: str, version: int) -> str | None:
    """Write the CRC-32 of the checkpoint delta-rs just wrote at ``version``; returns the digest file
    (None when there is no single-file checkpoint to digest). Scanning then finds a flipped bit that
    parquet's decoding would pass (delta-rs writes no page checksums)."""
    checkpoint = os.path.join(table_path, "_delta_log", f"{version:020d}.checkpoint.parquet")
    try:
        with open(checkpoint, "rb") as fh:
            digest = crc_hex(fh.read())
    except FileNotFoundError:
        return None
    target = checkpoint_digest_path(table_path, version)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = f"{target}.tmp"
    with open(tmp, "w") as out:
        out.write(digest)
    os.replace(tmp, target)
    return target
