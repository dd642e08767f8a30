"""Stable storage on a local store root: ``fsync`` of what a commit wrote, and ``sync_interval``.

Why: a PubAck, an ack reply or an API answer promises that what it confirms survives a power cut,
not just a ``kill -9`` ("acknowledged means on stable storage", docs/storage.md). A written file
sits in the page cache until the kernel writes it back; a new directory entry (a created file, a
rename, a link) is durable only once its directory is synced. So with ``sync_interval`` ``always``
(the default) every new data file is synced, then the directories that got a new entry (the
partition directory, and the parents of directories the write created), before the commit's log
entry is published; the log entry itself is synced before it is linked into ``_delta_log`` and the
log directory after (``deltalog.LocalLogAppender``). The data goes first so that a surviving log
entry never names a file that did not survive.

With a duration (JetStream's relaxation: ``2m``) commits do not sync; :func:`flush_every` syncs the
file system every interval, so a power cut loses at most about that much. On an object store a
completed PUT is the durable point and nothing here applies.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterable
from concurrent.futures import Executor

ALWAYS = "always"

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def sync_interval_seconds(text: str) -> float | None:
    """``None`` for ``always``, else the seconds of a Go duration (``2m``, ``30s``, ``1h30m``,
    ``500ms``), as nats-server reads its ``sync_interval``. Raises ValueError for anything else,
    a zero or negative duration included (JetStream's ``always`` is the word for "every time")."""
    word = text.strip()
    if word.lower() == ALWAYS:
        return None
    pos, total = 0, 0.0
    while pos < len(word):
        match = _PART.match(word, pos)
        if match is None:
            raise ValueError(f"{text!r} is neither 'always' nor a duration such as '2m' or '30s'")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if total <= 0:
        raise ValueError(f"{text!r}: a sync interval must be longer than zero (or 'always')")
    return total


def fsync_path(path: str) -> None:
    """Sync one file's data and metadata, or one directory's entries."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: str) -> list[str]:
    """``os.makedirs(path, exist_ok=True)``, returning the directories that got a new entry (the
    parent of each directory it created), which must be synced for the creation to last."""
    missing: list[str] = []
    head = path
    while not os.path.isdir(head):
        missing.append(head)
        head = os.path.dirname(head)
    os.makedirs(path, exist_ok=True)
    return [os.path.dirname(d) for d in missing]


def sync_new_file(path: str, new_entries: Iterable[str] = ()) -> None:
    """Make a just-written file durable: its data, its directory's entry for it and the
    directories ``new_entries`` (from :func:`make_dirs`) that gained the directories above it."""
    fsync_path(path)
    for folder in dict.fromkeys([os.path.dirname(path), *new_entries]):
        fsync_path(folder)


def sync_tree(path: str) -> None:
    """Sync every file and directory under ``path`` and ``path``'s own entry in its parent: for a
    table delta-rs just created (it does not sync its first log entry)."""
    for folder, _, files in os.walk(path):
        for name in files:
            fsync_path(os.path.join(folder, name))
        fsync_path(folder)
    fsync_path(os.path.dirname(path))


def sync_checkpoint(log_dir: str) -> None:
    """Sync the checkpoint ``_last_checkpoint`` names, then ``_last_checkpoint`` itself and the log
    directory: delta-rs syncs neither, and a commit's sync of the log directory would otherwise make
    their names durable while their bytes are not (a power cut then leaves an empty checkpoint that
    every reader trusts)."""
    last = os.path.join(log_dir, "_last_checkpoint")
    with open(last, "rb") as fh:
        version = int(json.load(fh)["version"])
    checkpoint = os.path.join(log_dir, f"{version:020d}.checkpoint.parquet")
    if os.path.exists(checkpoint):
        fsync_path(checkpoint)
    fsync_path(last)
    fsync_path(log_dir)


async def flush_every(interval: float, executor: Executor) -> None:
    """``sync_interval`` as a duration: sync the file system every ``interval`` seconds, on a worker
    thread (``sync(2)`` blocks until the writes are out). Runs until cancelled; its owner cancels it
    on shutdown and syncs once more after the last commit."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval)
        await loop.run_in_executor(executor, os.sync)
