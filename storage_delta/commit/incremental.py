"""The next checkpoint of a local table from the previous one and the log entries since (#23).

delta-rs makes a checkpoint by loading the table at its version, which replays every entry since
the previous checkpoint through its log reader at about 0.2 ms an entry here, plus the checkpoint's
own encoding: a table written one message per commit paid 60 to 100 ms of CPU for each checkpoint of
100 entries, about a millisecond per publish, more than the commit itself. The state a checkpoint
holds is simple to carry forward for the entries jetlake's own writers make (``add``, ``remove``,
``txn``, ``commitInfo``): the previous checkpoint's rows less the files removed since, less the app
transactions superseded since, less the tombstones expired, plus the new ``add``, ``remove`` and
``txn`` actions. That is what this module computes, in the previous checkpoint's own schema (delta-rs
wrote it), so every reader (delta-rs, DuckDB, Spark) reads it as one of delta-rs's.

Anything else in the entries (a ``protocol`` or ``metaData`` change, ``domainMetadata``, ``cdc``, an
action this module does not know), a checkpoint of several parts or none, or an entry that cannot be
read: the caller falls back to delta-rs's checkpoint (:func:`carried_checkpoint` returns None). The
rules it applies are delta-rs's and the protocol's ("Action Reconciliation"): the newest action on a
path wins; a ``txn`` keeps the newest version per app id; a ``remove`` is a tombstone until
``delta.deletedFileRetentionDuration`` after its ``deletionTimestamp``; and jetlake's own rule that a
checkpoint carries no tombstone of a merge (``dataChange`` false, :mod:`storage_delta.commit.checkpoint`).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from storage_delta.commit.deltalog import commit_path
from storage_delta.format.integrity import check_log_entry, checkpoint_digest_path, crc_hex

#: Delta's default ``delta.deletedFileRetentionDuration`` (one week), for a table that sets none.
DEFAULT_TOMBSTONE_RETENTION_MS = 7 * 24 * 3600 * 1000

_INTERVAL = re.compile(r"^\s*interval\s+(\d+)\s+(second|minute|hour|day|week)s?\s*$", re.IGNORECASE)
_UNIT_MS = {"second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000, "week": 604_800_000}


class Unsupported(Exception):
    """Something the carried checkpoint does not handle: delta-rs makes this one."""


def tombstone_retention_ms(configuration: dict[str, str] | None) -> int:
    """The table's ``delta.deletedFileRetentionDuration`` in ms (:class:`Unsupported` for a form
    other than ``interval <n> <unit>``)."""
    value = (configuration or {}).get("delta.deletedFileRetentionDuration")
    if value is None:
        return DEFAULT_TOMBSTONE_RETENTION_MS
    found = _INTERVAL.match(value)
    if found is None:
        raise Unsupported(f"deletedFileRetentionDuration {value!r}")
    return int(found.group(1)) * _UNIT_MS[found.group(2).lower()]


def _since(log_dir: str, base: int, version: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The ``add`` and data-changing ``remove`` actions by path (the newest on each path only) and
    the ``txn`` actions by app id, of the entries ``base + 1`` to ``version``."""
    adds: dict[str, Any] = {}
    removes: dict[str, Any] = {}
    txns: dict[str, Any] = {}
    for v in range(base + 1, version + 1):
        try:
            with open(commit_path(log_dir, v), "rb") as fh:
                body = fh.read()
        except OSError as exc:  # trimmed by another writer's checkpoint meanwhile: delta-rs judges
            raise Unsupported(f"entry {v}: {exc}") from exc
        if check_log_entry(body, creation=v == 0):
            raise Unsupported(f"entry {v} is damaged")
        try:
            for raw in body.splitlines():
                if raw.strip():
                    _take(json.loads(raw), adds, removes, txns)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:  # not an action as Delta's
            raise Unsupported(f"entry {v}: {exc!r}") from exc
    return adds, removes, txns


def _take(
    action: dict[str, Any], adds: dict[str, Any], removes: dict[str, Any], txns: dict[str, Any]
) -> None:
    """One line of an entry into the actions since (the newest on each path, each app id)."""
    if len(action) != 1:
        raise Unsupported(f"a line of {len(action)} actions")
    ((kind, body),) = action.items()
    if kind == "commitInfo":
        return
    if kind == "txn":
        txns[str(body["appId"])] = body
    elif kind == "add":
        removes.pop(body["path"], None)
        adds[str(body["path"])] = body
    elif kind == "remove":
        adds.pop(body["path"], None)
        removes[str(body["path"])] = body
    else:
        raise Unsupported(f"a {kind} action")


def _row(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint row of one action (maps as key-value pairs, as pyarrow builds them)."""
    fixed = dict(body)
    for key in ("partitionValues", "tags"):
        if isinstance(fixed.get(key), dict):
            fixed[key] = list(fixed[key].items())
    return {kind: fixed}


def _field(table: pa.Table, column: str, field: str) -> pa.ChunkedArray:
    return pc.struct_field(table.column(column), field)


def _outside(values: pa.ChunkedArray, value_set: pa.Array) -> pa.ChunkedArray:
    """True where a value is not in ``value_set`` (and for a null: the row holds another action,
    which the caller's validity mask rules out)."""
    return pc.invert(pc.is_in(values, value_set=value_set))


def _all(*masks: pa.ChunkedArray) -> pa.ChunkedArray:
    """Elementwise and of boolean masks, a null counting as false."""
    out = pc.fill_null(masks[0], False)
    for mask in masks[1:]:
        out = pc.and_(out, pc.fill_null(mask, False))
    return out


def carried_checkpoint(table_path: str, base: int, version: int, now_ms: int) -> pa.Table:
    """The checkpoint at ``version`` from the single-file checkpoint at ``base`` and the entries
    since; :class:`Unsupported` where delta-rs must make it instead. Both are checked against the
    digests recorded when they were written (a flipped bit carried forward would stay in every
    later checkpoint)."""
    log_dir = os.path.join(table_path, "_delta_log")
    try:
        with open(os.path.join(log_dir, f"{base:020d}.checkpoint.parquet"), "rb") as fh:
            raw = fh.read()
        with open(checkpoint_digest_path(table_path, base)) as fh:
            want = fh.read().strip()
    except OSError as exc:  # no digest: a checkpoint of Spark's, or one a crash caught before it
        raise Unsupported(f"checkpoint {base}: {exc}") from exc
    if crc_hex(raw) != want:
        raise Unsupported(f"checkpoint {base} does not match its digest")
    with pq.ParquetFile(pa.BufferReader(raw)) as parquet:  # not read_table: pyarrow.dataset imports pandas
        prev = parquet.read()
    known = {"add", "remove", "txn", "metaData", "protocol"}
    for name in prev.column_names:
        if name not in known and prev.column(name).null_count != prev.num_rows:
            raise Unsupported(f"the checkpoint holds {name} actions")
    meta = [m for m in prev.column("metaData").to_pylist() if m is not None]
    if len(meta) != 1:
        raise Unsupported(f"the checkpoint holds {len(meta)} metaData actions")
    configuration = meta[0].get("configuration")
    cutoff = now_ms - tombstone_retention_ms(dict(configuration) if configuration is not None else None)
    adds, removes, txns = _since(log_dir, base, version)
    touched = pa.array(list(adds) + list(removes), pa.string())
    # the previous rows that stay: every row that is none of add/remove/txn (protocol, metaData),
    # an add or a data-changing tombstone on a path untouched since (the tombstone not expired),
    # and a txn of an app id that committed none since
    add_kept = _all(pc.is_valid(prev.column("add")), _outside(_field(prev, "add", "path"), touched))
    remove_kept = _all(
        pc.is_valid(prev.column("remove")),
        _outside(_field(prev, "remove", "path"), touched),
        pc.fill_null(_field(prev, "remove", "dataChange"), True),
        pc.greater(pc.fill_null(_field(prev, "remove", "deletionTimestamp"), 0), cutoff),
    )
    txn_kept = _all(
        pc.is_valid(prev.column("txn")),
        _outside(_field(prev, "txn", "appId"), pa.array(list(txns), pa.string())),
    )
    other = _all(*(pc.is_null(prev.column(kind)) for kind in ("add", "remove", "txn")))
    keep = pc.or_(pc.or_(other, add_kept), pc.or_(remove_kept, txn_kept))
    fresh = [
        *(_row("add", a) for a in adds.values()),
        *(
            _row("remove", r)
            for r in removes.values()
            if r.get("dataChange", True) and (r.get("deletionTimestamp") or 0) > cutoff
        ),
        *(_row("txn", t) for t in txns.values()),
    ]
    try:
        added = pa.Table.from_pylist(fresh, schema=prev.schema)
    except (pa.ArrowException, TypeError, ValueError) as exc:  # a field of another type than Delta's
        raise Unsupported(f"entries {base + 1}..{version}: {exc}") from exc
    return pa.concat_tables([prev.filter(keep), added])


def write_carried(table: pa.Table, stage_log: str, version: int) -> dict[str, int]:
    """Write ``table`` as the checkpoint at ``version`` in ``stage_log`` and its
    ``_last_checkpoint`` (what delta-rs writes there: version, actions, bytes, live files);
    returns that pointer."""
    path = os.path.join(stage_log, f"{version:020d}.checkpoint.parquet")
    pq.write_table(table, path, compression="snappy")
    pointer = {
        "version": version,
        "size": table.num_rows,
        "sizeInBytes": os.path.getsize(path),
        "numOfAddFiles": table.num_rows - table.column("add").null_count,
    }
    with open(os.path.join(stage_log, "_last_checkpoint"), "w") as fh:
        json.dump(pointer, fh, separators=(",", ":"))
    return pointer
