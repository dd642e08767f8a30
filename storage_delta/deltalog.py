"""A blind-append commit path for Delta tables on a local filesystem: one JSON file per version,
published with put-if-absent, no table state loaded.

Why not ``DeltaTable.create_write_transaction`` on the hot path: a delta-rs handle does not advance
past its own commit, so the next commit through it conflicts with the previous one (both carry a
``txn`` for the same app id) and must reload and retry; reload and commit each cost ~10 ms on this
kind of machine and grow with the table's state. And delta-rs never marks an append as blind, so an
append conflicts with any ``remove`` a retention or sealing job committed meanwhile, even in another
partition (delta-rs #3890). An append of new files that reads nothing cannot conflict with a
removal of other files; this path knows that, and needs no state beyond the next version number.

The protocol facts relied on (Delta protocol, "Delta Log Entries"): version ``n`` is the file
``_delta_log/<n:020>.json``, one action per line; a writer claims a version by creating that file
only if it does not exist (local filesystems: ``link(2)``, which fails on an existing name, the
mechanism delta-rs uses too); a table with ``minWriterVersion`` 2 and no writer features needs
nothing beyond ``add``/``txn``/``commitInfo`` from an appender. Object stores keep delta-rs's commit
(their put-if-absent is delta-rs's business), see :mod:`storage_delta.tables`.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable
from typing import Any

from deltalake.transaction import AddAction

#: Writer protocol this appender understands; a table that asks for more is left to delta-rs.
SUPPORTED_WRITER_VERSION = 2


class UnsupportedTable(Exception):
    """A concurrent commit changed the table's protocol or metadata: blind appends are not safe."""


def commit_path(log_dir: str, version: int) -> str:
    return os.path.join(log_dir, f"{version:020d}.json")


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


class LocalLogAppender:
    """Claims the next version of a local Delta table's log for a commit of ``add`` actions.

    Not thread-safe: one appender per table per process, used from one thread at a time.
    """

    def __init__(self, table_path: str, next_version: int) -> None:
        self.log_dir = os.path.join(table_path, "_delta_log")
        # Commits are staged beside the log, not in it: every create and unlink in ``_delta_log``
        # is a chance for a concurrent listing to miss an entry (see ``tables.retry_listing``).
        self.staging_dir = os.path.join(table_path, "_jetlake_staging")
        os.makedirs(self.staging_dir, exist_ok=True)
        self.next_version = next_version

    def append(self, adds: Iterable[AddAction], txn: tuple[str, int]) -> int:
        """Commit ``adds`` with the app transaction ``txn`` as one version; returns that version.

        Versions other writers claimed meanwhile are skipped after a look at their actions: a
        ``txn`` of ours at or past ``txn`` means this very commit landed before (a retry after an
        error, delta-rs #2509), so nothing is written twice; a protocol or metadata change stops
        the blind append (:class:`UnsupportedTable`).
        """
        now = int(time.time() * 1000)
        lines = [
            {
                "commitInfo": {
                    "timestamp": now,
                    "operation": "WRITE",
                    "operationParameters": {"mode": "Append"},
                    "clientVersion": "jetlake",
                    "isBlindAppend": True,
                }
            },
            {"txn": {"appId": txn[0], "version": txn[1], "lastUpdated": now}},
            *(add_line(a) for a in adds),
        ]
        body = "\n".join(json.dumps(line, separators=(",", ":")) for line in lines).encode() + b"\n"
        tmp = os.path.join(self.staging_dir, f"{uuid.uuid4().hex}.json")
        with open(tmp, "wb") as fh:
            fh.write(body)
        try:
            while True:
                version = self.next_version
                try:
                    os.link(tmp, commit_path(self.log_dir, version))
                except FileExistsError:
                    self.next_version += 1
                    if self._landed_or_check(version, txn):
                        return version
                    continue
                self.next_version = version + 1
                return version
        finally:
            os.unlink(tmp)

    def _landed_or_check(self, version: int, txn: tuple[str, int]) -> bool:
        """Read another writer's commit: True when it holds our ``txn`` (already committed)."""
        with open(commit_path(self.log_dir, version), "rb") as fh:
            for raw in fh:
                action = json.loads(raw)
                if "txn" in action:
                    t = action["txn"]
                    if t.get("appId") == txn[0] and int(t.get("version", -1)) >= txn[1]:
                        return True
                elif "protocol" in action or "metaData" in action:
                    raise UnsupportedTable(f"version {version} changed the table's protocol or schema")
        return False
