"""Who may write a store: an owner lease with an epoch, and the fence every commit checks.

Several gateways may share one store root; one owns it at a time (docs/architecture.md, "Several
gateways on one store"). Two parts, with different jobs:

* **the lease** (:class:`StoreLease`, files under ``<root>/_jetlake_owner``) decides who should
  own: epoch ``n`` is claimed by creating ``epoch-<n>`` only if it does not exist (``O_EXCL``), so
  each epoch has one claimant; the owner rewrites ``beat-<n>`` every fraction of the lease; a
  standby that sees the beat unchanged for a whole lease (by its own clock), or names a process of
  its own host that is gone, claims ``n + 1``. Timing only decides *when* to take over;
* **the fence** makes a late writer harmless whatever the timing: a new owner first commits an
  app transaction ``(jetlake-owner, n)`` to every table it writes, before it reads any of them to
  recover; every commit of an owner carries its epoch the same way. A commit claims its log
  version by put-if-absent, and a writer that finds versions taken reads them before it tries the
  next: an epoch above its own there means it was fenced (:class:`Fenced`), and it stops without
  committing or answering. Versions are contiguous, so a stale writer cannot reach a free version
  without passing the fence, and what the new owner recovered is everything the old one committed.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from dataclasses import dataclass

from storage_delta.commit.durable import fsync_path

#: The app id of the owner epoch in every table's Delta log.
OWNER_APP = "jetlake-owner"
LEASE_DIR = "_jetlake_owner"
#: Beat content of an owner that stopped cleanly: a standby need not wait out the lease.
RELEASED = "released"
#: Claims and beats of epochs this far below the current one are removed by the owner.
KEEP_EPOCHS = 8


class Fenced(Exception):
    """A newer owner epoch is in the table: this writer lost the store and must not commit."""


def check_epoch(found: int, mine: int | None) -> None:
    """Raise :class:`Fenced` when a table's owner epoch ``found`` is past the writer's ``mine``."""
    if mine is not None and found > mine:
        raise Fenced(f"owner epoch {found} took over from epoch {mine}")


@dataclass(frozen=True, slots=True)
class Beat:
    """What an owner's heartbeat says: who it is and how often it has beaten."""

    host: str
    pid: int
    count: int
    released: bool = False


class StoreLease:
    """The lease files of a local store root. Blocking (small file operations): call on a thread."""

    def __init__(self, root_path: str) -> None:
        self.dir = os.path.join(root_path, LEASE_DIR)
        os.makedirs(self.dir, exist_ok=True)
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self._count = 0

    def current(self) -> int:
        """The highest epoch claimed so far (0: none)."""
        epochs = [int(n[6:]) for n in os.listdir(self.dir) if n.startswith("epoch-") and n[6:].isdigit()]
        return max(epochs, default=0)

    def claim(self, epoch: int) -> bool:
        """Create ``epoch-<epoch>`` if no one has; True when this call did (then beat at once)."""
        path = os.path.join(self.dir, f"epoch-{epoch:020d}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, json.dumps({"host": self.host, "pid": self.pid, "at": time.time()}).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_path(self.dir)
        self.beat(epoch)
        self._prune(epoch)
        return True

    def beat(self, epoch: int, released: bool = False) -> None:
        """Renew the lease of ``epoch`` (replace its beat file; not synced: a beat lost to a power
        cut only makes a standby wait a lease longer)."""
        self._count += 1
        body = {"host": self.host, "pid": self.pid, "count": self._count, RELEASED: released}
        tmp = os.path.join(self.dir, f".beat-{self.pid}.tmp")
        with open(tmp, "w") as fh:
            json.dump(body, fh)
        os.replace(tmp, os.path.join(self.dir, f"beat-{epoch:020d}"))

    def _prune(self, epoch: int) -> None:
        """Remove the claims and beats of epochs long superseded (never the highest claim)."""
        for name in os.listdir(self.dir):
            number = name.split("-", 1)[-1]
            if (
                name.startswith(("epoch-", "beat-"))
                and number.isdigit()
                and int(number) < epoch - KEEP_EPOCHS
            ):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.dir, name))

    def read_beat(self, epoch: int) -> Beat | None:
        """The beat of ``epoch`` (None: none yet, or caught mid-replace)."""
        try:
            with open(os.path.join(self.dir, f"beat-{epoch:020d}")) as fh:
                body = json.load(fh)
            return Beat(str(body["host"]), int(body["pid"]), int(body["count"]), bool(body.get(RELEASED)))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def holder_gone(self, beat: Beat | None) -> bool:
        """The beat says the owner released the lease, or names a process of this host that is gone:
        no need to wait the lease out (a restart after ``kill -9`` of the only gateway)."""
        if beat is None:
            return False
        if beat.released:
            return True
        if beat.host != self.host or beat.pid == self.pid:
            return False
        try:
            os.kill(beat.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
