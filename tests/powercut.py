"""A FUSE file system for power-cut tests: it keeps every write that was not synced in memory, and a
power cut leaves on disk only what was.

Run it as its own process (``python -m tests.powercut LOWER MOUNT``, :class:`PowerCutFs`). Every
operation works on an in-memory tree of inodes, as a page cache and a dirty directory cache would:

* a file's bytes become durable when the file is ``fsync``ed (``fsync``/``fdatasync`` of any
  descriptor of it); until then a power cut keeps its last synced bytes (none for a new file);
* a directory's entries (names created, linked, renamed in or out, unlinked) become durable when the
  directory is ``fsync``ed; until then a power cut keeps its last synced entries. An entry that is
  durable while its file's bytes are not leaves an empty or old file, as on ext4 or XFS.

``SIGTERM`` is the power cut: the mount ends (the process using it is expected to be dead, as after
a ``kill -9``) and the durable image, and nothing else, is written into ``LOWER`` (empty before), on
which the test then restarts what it runs. ``sync(2)`` does not reach a FUSE file system, so here
only ``fsync`` makes anything durable.

Why in-memory with an image written at the cut rather than a passthrough that writes through: the
image is exactly "what was synced" by construction, and a test's store is a few megabytes.
"""

from __future__ import annotations

import errno
import itertools
import os
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mfusepy

from tests.harness import ROOT, spawn


@dataclass
class Node:
    """An inode: a directory (``entries``) or a regular file (``data``), each with its durable copy."""

    ino: int
    mode: int
    data: bytearray = field(default_factory=bytearray)
    synced_data: bytes = b""
    entries: dict[str, Node] = field(default_factory=dict)
    synced_entries: dict[str, Node] = field(default_factory=dict)
    nlink: int = 1
    mtime_ns: int = field(default_factory=time.time_ns)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


class PowerCutFs(mfusepy.Operations):  # type: ignore[misc]
    """The operations a Delta writer, pyarrow and DuckDB use; single-threaded (``nothreads``)."""

    use_ns = True

    def __init__(self) -> None:
        self._inos = itertools.count(1)
        self.root = Node(next(self._inos), stat.S_IFDIR | 0o755, nlink=2)
        self.open_files: dict[int, Node] = {}

    # ---- the tree ----------------------------------------------------------------------------

    def _node(self, path: str) -> Node:
        node = self.root
        for name in filter(None, path.split("/")):
            if not node.is_dir or name not in node.entries:
                raise mfusepy.FuseOSError(errno.ENOENT)
            node = node.entries[name]
        return node

    def _parent(self, path: str) -> tuple[Node, str]:
        head, name = os.path.split(path.rstrip("/"))
        parent = self._node(head)
        if not parent.is_dir:
            raise mfusepy.FuseOSError(errno.ENOTDIR)
        return parent, name

    def _new(self, path: str, mode: int) -> Node:
        parent, name = self._parent(path)
        if name in parent.entries:
            raise mfusepy.FuseOSError(errno.EEXIST)
        node = Node(next(self._inos), mode, nlink=2 if stat.S_ISDIR(mode) else 1)
        parent.entries[name] = node
        parent.mtime_ns = time.time_ns()
        return node

    # ---- metadata ----------------------------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        node = self.open_files[fh] if fh else self._node(path)
        size = len(node.data) if not node.is_dir else 4096
        return {
            "st_mode": node.mode,
            "st_nlink": node.nlink,
            "st_size": size,
            "st_blocks": (size + 511) // 512,
            "st_uid": os.getuid(),
            "st_gid": os.getgid(),
            "st_atime": node.mtime_ns,
            "st_mtime": node.mtime_ns,
            "st_ctime": node.mtime_ns,
        }

    def statfs(self, path: str) -> dict[str, int]:
        return {
            "f_bsize": 4096,
            "f_frsize": 4096,
            "f_blocks": 1 << 20,
            "f_bfree": 1 << 19,
            "f_bavail": 1 << 19,
        }

    def chmod(self, path: str, mode: int) -> int:
        node = self._node(path)
        node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self._node(path).mtime_ns = times[1] if times else time.time_ns()
        return 0

    # ---- directories -------------------------------------------------------------------------

    def mkdir(self, path: str, mode: int) -> int:
        self._new(path, stat.S_IFDIR | stat.S_IMODE(mode))
        return 0

    def rmdir(self, path: str) -> int:
        parent, name = self._parent(path)
        node = self._node(path)
        if node.entries:
            raise mfusepy.FuseOSError(errno.ENOTEMPTY)
        del parent.entries[name]
        return 0

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *self._node(path).entries]

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        node = self._node(path)
        node.synced_entries = dict(node.entries)
        return 0

    # ---- names -------------------------------------------------------------------------------

    def unlink(self, path: str) -> int:
        parent, name = self._parent(path)
        node = self._node(path)
        node.nlink -= 1
        del parent.entries[name]
        return 0

    def link(self, target: str, source: str) -> int:
        node = self._node(source)
        parent, name = self._parent(target)
        if name in parent.entries:
            raise mfusepy.FuseOSError(errno.EEXIST)
        parent.entries[name] = node
        node.nlink += 1
        return 0

    def rename(self, old: str, new: str) -> int:
        old_parent, old_name = self._parent(old)
        node = self._node(old)
        new_parent, new_name = self._parent(new)
        replaced = new_parent.entries.get(new_name)
        if replaced is not None and replaced.is_dir and replaced.entries:
            raise mfusepy.FuseOSError(errno.ENOTEMPTY)
        del old_parent.entries[old_name]
        new_parent.entries[new_name] = node
        return 0

    # ---- files -------------------------------------------------------------------------------

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        node = self._new(path, stat.S_IFREG | stat.S_IMODE(mode))
        self.open_files[node.ino] = node
        return node.ino

    def open(self, path: str, flags: int) -> int:
        node = self._node(path)
        if flags & os.O_TRUNC:
            node.data.clear()
        self.open_files[node.ino] = node
        return node.ino

    def release(self, path: str, fh: int) -> int:
        return 0  # an inode stays reachable through its descriptor number until the cut

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return bytes(self.open_files[fh].data[offset : offset + size])

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        node = self.open_files[fh]
        if offset > len(node.data):
            node.data.extend(bytes(offset - len(node.data)))
        node.data[offset : offset + len(data)] = data
        node.mtime_ns = time.time_ns()
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        node = self.open_files[fh] if fh else self._node(path)
        del node.data[length:]
        node.data.extend(bytes(length - len(node.data)))
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        node = self.open_files[fh]
        node.synced_data = bytes(node.data)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0


def write_image(node: Node, path: str) -> None:
    """The durable state under ``node`` into the directory ``path``: what a power cut leaves."""
    for name, child in node.synced_entries.items():
        target = os.path.join(path, name)
        if child.is_dir:
            os.mkdir(target)
            write_image(child, target)
        else:
            with open(target, "wb") as fh:
                fh.write(child.synced_data)


def main(lower: str, mount: str) -> None:
    """Serve ``mount`` until SIGTERM (libfuse's handler ends the loop and unmounts), then write the
    durable image into ``lower``."""
    fs = PowerCutFs()
    try:
        mfusepy.FUSE(fs, mount, foreground=True, nothreads=True)
    except RuntimeError as exc:  # libfuse 3 reports a loop ended by a signal as an error (8)
        print(f"fuse loop ended: {exc}", flush=True)
    write_image(fs.root, lower)
    print("power cut: durable image written", flush=True)


class PowerCutMount:
    """The file system as a test uses it: ``start`` mounts it at ``mount`` (its own process),
    ``cut`` is the power cut (afterwards ``lower`` holds what was synced), ``close`` makes sure
    nothing stays mounted, also after a failed test."""

    def __init__(self, lower: Path, mount: Path, log: Path) -> None:
        self.lower, self.mount, self.log = lower, mount, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.lower.mkdir(parents=True)
        self.mount.mkdir(parents=True)
        self.proc = spawn(
            [sys.executable, "-m", "tests.powercut", str(self.lower), str(self.mount)], self.log, cwd=ROOT
        )
        deadline = time.monotonic() + 15
        while not os.path.ismount(self.mount):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the power-cut file system did not mount; see {self.log}")
            time.sleep(0.05)

    def cut(self) -> None:
        """Power off: every write not synced is gone. Whatever used the mount must be dead."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        text = self.log.read_text(errors="replace")
        assert "durable image written" in text, text

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if os.path.ismount(self.mount):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mount)], check=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
