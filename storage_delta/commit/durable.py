"""Stable storage on a local store root: ``fsync`` of what a commit wrote, and ``sync_interval``.

Why: a PubAck, an ack reply or an API answer promises that what it confirms survives a power cut,
not just a ``kill -9`` ("acknowledged means on stable storage", docs/storage.md). A written file
sits in the page cache until the kernel writes it back; a new directory entry (a created file, a
rename, a link) is durable only once its directory is synced. So with ``sync_interval`` ``always``
(the default) every new data file is synced, then the directories that got a new entry (the
partition directory, and the parents of directories the write created), before the commit's log
entry is published; the log entry itself is synced before it is linked into ``_delta_log`` and the
log directory after (``deltalog.LocalLogEntries``). The data goes first so that a surviving log
entry never names a file that did not survive.

With a duration (JetStream's relaxation: ``2m``) commits do not sync; they note what they wrote in
:class:`Unsynced`, and :func:`flush_every` syncs just that every interval, as JetStream syncs the
blocks it wrote, so a power cut loses at most about that much. Not ``sync(2)``: it syncs every file
system of the machine, and a FUSE or network file system may not pass it on at all. On an object
store a completed PUT is the durable point and nothing here applies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor, wait

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


#: Threads that sync the paths of one commit at the same time (:func:`sync_together`). Shared by
#: every table of the process, idle between commits; a commit waits for all of its own syncs.
_SYNCERS = ThreadPoolExecutor(8, thread_name_prefix="jetlake-fsync")


def sync_together(paths: Sequence[str]) -> None:
    """Sync ``paths`` (files and directories) concurrently; returns once every one is on stable
    storage, raising the first error. Why: on ext4 (and file systems with a journal like it) each
    ``fsync`` of a new file or of a directory with a new entry waits for its own journal commit,
    one after another when issued in turn; issued together, they share commits. A commit's data
    files, their directories and its staged log entry need no order among themselves, only to be
    down before the entry is linked (:meth:`~storage_delta.commit.deltalog.LocalLogEntries.staged`):
    a commit that made new partition directories paid six journal commits in turn, now about two.
    The first path is synced on the calling thread, the others meanwhile on the pool: one thread
    woken fewer per commit on the synchronous publish path (#23)."""
    first, *rest = dict.fromkeys(paths)
    with syncing(rest):
        fsync_path(first)


@contextlib.contextmanager
def syncing(paths: Iterable[str]) -> Iterator[None]:
    """Sync ``paths`` on the pool while the body runs (work that does not need them synced yet,
    such as encoding and writing the log entry that will name them); on leaving, every one is on
    stable storage, or the first error is raised. The syncs end before anything is raised, the
    body's errors included: none is left running unawaited."""
    syncs = [_SYNCERS.submit(fsync_path, path) for path in dict.fromkeys(paths)]
    try:
        yield
    finally:
        wait(syncs)
    for sync in syncs:
        sync.result()


def make_dirs(path: str) -> list[str]:
    """``os.makedirs(path, exist_ok=True)``, returning the directories that got a new entry (the
    parent of each directory it created), which must be synced for the creation to last."""
    if os.path.isdir(path):  # (every commit after a partition's first)
        return []
    missing: list[str] = []
    head = path
    while not os.path.isdir(head):
        missing.append(head)
        head = os.path.dirname(head)
    os.makedirs(path, exist_ok=True)
    return [os.path.dirname(d) for d in missing]


def new_file_paths(path: str, new_entries: Iterable[str] = ()) -> list[str]:
    """What makes a just-written file durable: the file, its directory (its entry for it) and the
    directories ``new_entries`` (from :func:`make_dirs`) that gained the directories above it."""
    return [path, os.path.dirname(path), *new_entries]


def sync_new_file(path: str, new_entries: Iterable[str] = ()) -> None:
    """Make a just-written file durable (:func:`new_file_paths`)."""
    sync_together(new_file_paths(path, new_entries))


def sync_log_entries(log_dir: str, first: int, last: int) -> None:
    """Sync the log entries ``first`` to ``last`` of a local table, then its log directory: for the
    commits delta-rs makes (it syncs nothing) on a root that syncs."""
    for version in range(first, last + 1):
        entry = os.path.join(log_dir, f"{version:020d}.json")
        if os.path.exists(entry):
            fsync_path(entry)
    fsync_path(log_dir)


def sync_tree(path: str) -> None:
    """Sync every file and directory under ``path`` and ``path``'s own entry in its parent: for a
    table delta-rs just created (it does not sync its first log entry)."""
    for folder, _, files in os.walk(path):
        for name in files:
            fsync_path(os.path.join(folder, name))
        fsync_path(folder)
    fsync_path(os.path.dirname(path))


class Unsynced:
    """What commits wrote without syncing under a duration ``sync_interval``, until the next flush.

    Three tiers, synced in this order so that a surviving log entry never names a file that did not
    survive: file contents (data files, log entries, checkpoints, snapshots), then the directories
    that got a new data file, then the log directories. A flush holds the lock throughout: a commit
    notes its data file before it links its log entry and notes that entry after, so no entry can
    be linked, and made durable by this flush's sync of its log directory, while its data file is
    outside the flush. Bounded: a commit that finds ``limit`` paths waiting flushes them itself.
    """

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._files: dict[str, None] = {}
        self._data_dirs: dict[str, None] = {}
        self._log_dirs: dict[str, None] = {}

    def data(self, files: Iterable[str], dirs: Iterable[str]) -> None:
        """New data files, and the directories that got their entries (or new subdirectories)."""
        with self._lock:
            self._files.update(dict.fromkeys(files))
            self._data_dirs.update(dict.fromkeys(dirs))
            self._flush_if_full()

    def log(self, files: Iterable[str], log_dir: str) -> None:
        """Files linked into a table's ``_delta_log`` (entries, checkpoints)."""
        with self._lock:
            self._files.update(dict.fromkeys(files))
            self._log_dirs[log_dir] = None
            self._flush_if_full()

    def flush(self) -> None:
        """Sync everything noted so far. Blocking: belongs on a worker thread."""
        with self._lock:
            self._flush()

    def _flush_if_full(self) -> None:
        if len(self._files) + len(self._data_dirs) >= self.limit:
            self._flush()

    def _flush(self) -> None:
        for tier in (self._files, self._data_dirs, self._log_dirs):
            for path in tier:
                # gone since (a compacted file vacuumed): nothing of it is left to keep
                with contextlib.suppress(FileNotFoundError):
                    fsync_path(path)
            tier.clear()


async def flush_every(interval: float, executor: Executor, unsynced: Unsynced) -> None:
    """``sync_interval`` as a duration: sync what was written every ``interval`` seconds, on a
    worker thread. Runs until cancelled; its owner cancels it on shutdown and flushes once more
    after the last commit."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval)
        await loop.run_in_executor(executor, unsynced.flush)
