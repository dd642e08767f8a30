"""The owner lease of a store root: who should own it, and since when no one has heard from them.

Each epoch has exactly one claimant (a put-if-absent); the owner beats, replacing a small beat
record every fraction of the lease; a standby claims the next epoch when the beat has not changed
for a whole lease by its own clock, or at once when the beat says the owner released the store or
names a process of the standby's own host that is gone. The lease only decides *when* to take
over; the fence in every commit (:mod:`storage_delta.commit.owner`) is what makes a late writer
harmless. Blocking (small reads and writes): call it on a worker thread.

Every live gateway, owner or standby, also announces itself beside the claims: a small record
``member-<name>`` with a count it raises every tick. That is how gateways know each other with no
setting (the stream info's ``cluster`` view, and how many gateways could serve a stream of R > 1).
A reader judges a member live when its count changed within a lease by the reader's own clock.

The records live in the folder ``_jetlake_owner`` of the root, laid out alike on a local root
(:class:`LocalLease`: files, a claim created with ``O_EXCL`` and synced, the others replaced by a
rename) and on an object store (:class:`ObjectStoreLease`: objects, a claim a PUT with
``If-None-Match: *``, the others plain PUTs; a completed PUT is durable):

* ``epoch-<n>``: the claim of the store's epoch ``n`` (its claimant's host and pid);
* ``beat-<n>``: the owner of epoch ``n``'s heartbeat;
* ``member-<name>``: a live gateway's announcement; ``placement``: the meta owner's placement;
* ``streams/<S>/epoch-<n>``: per-stream ownership's claim of epoch ``n`` of stream ``S``'s lease,
  naming the claiming gateway; ``streams/<S>/released-<n>``: its holder let it go. A stream lease
  has no beat of its own: it lives while its gateway's member record does.

Every operation is a request or two with no table state to load: a claim is one put-if-absent, the
newest epoch one listing of a folder (on S3, claims through a Delta table cost a commit of
delta-rs's and its listings and reads, in each takeover and in every tick of every gateway).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import obstore
import pyarrow as pa
from obstore.exceptions import AlreadyExistsError

from storage_delta.commit.durable import make_dirs, sync_together
from storage_delta.commit.store import StoreRoot, open_existing, read_checked
from storage_delta.format.integrity import side_by_side

log = logging.getLogger(__name__)

LEASE_DIR = "_jetlake_owner"
#: Beat content of an owner that stopped cleanly: a standby need not wait out the lease.
RELEASED = "released"
#: The record of the meta owner's placement of streams over gateways (per-stream ownership).
PLACEMENT = "placement"
#: Claims and beats of epochs this far below the current one are removed by the owner.
KEEP_EPOCHS = 8
#: Prefix of the members' records (one per live gateway, owner or standby).
MEMBER = "member-"

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Placement:
    """The meta owner's placement under its store epoch: stream → the gateway that should serve
    it, and the streams being handed over by a live gateway (stream → that gateway), whose next
    owner waits for the release (``Lease.stream_released``) rather than fencing queued work."""

    epoch: int
    owners: dict[str, str]
    handovers: dict[str, str]


@dataclass(frozen=True, slots=True)
class Beat:
    """What an owner's heartbeat says: who it is and how often it has beaten."""

    host: str
    pid: int
    count: int
    released: bool = False


def epoch_name(epoch: int, kind: str = "epoch") -> str:
    return f"{kind}-{epoch:020d}"


def newest_epoch(names: Iterable[str]) -> int:
    """The highest ``n`` of the claims ``epoch-<n>`` among ``names`` (0: none)."""
    return max((int(n[6:]) for n in names if n.startswith("epoch-") and n[6:].isdigit()), default=0)


def superseded(names: Iterable[str], epoch: int, kinds: tuple[str, ...] = ("epoch", "released")) -> list[str]:
    """Of the records ``<kind>-<n>`` among ``names``, those more than :data:`KEEP_EPOCHS` below
    ``epoch``, just claimed: they go, so a lease taken over again and again keeps a bounded folder.
    Never the highest claim, and never the folder of a deleted stream: its epochs stay in the
    tables' logs (``jetlake-owner/<S>``), so a stream made again under the same name must claim
    above them, or its first fence would find itself fenced."""
    found = ((name, *name.partition("-")) for name in names)
    return [
        name
        for name, kind, _, number in found
        if kind in kinds and number.isdigit() and int(number) < epoch - KEEP_EPOCHS
    ]


class Lease(ABC):
    """The claims and beats of one store root, as one gateway process sees them: the protocol,
    over six operations on the records of the lease's folder that each kind of root provides."""

    def __init__(self) -> None:
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self._count = 0
        self._announced = 0
        #: The host and pid of each member record read so far, by name (they never change: a
        #: gateway's name ends with its host and pid).
        self._whom: dict[str, tuple[str, int]] = {}

    @abstractmethod
    def _create(self, records: Mapping[str, bytes]) -> frozenset[str]:
        """Create each record that does not exist yet, durably; the names this call created."""

    @abstractmethod
    def _put(self, name: str, body: bytes) -> None:
        """Create or replace the record ``name`` (not synced: beats, announcements, placements)."""

    @abstractmethod
    def _get(self, name: str) -> bytes | None:
        """The record ``name`` (None: there is none)."""

    @abstractmethod
    def _names(self, folder: str) -> list[str]:
        """The names of the records in ``folder`` ("": the lease's own), without the folder."""

    @abstractmethod
    def _delete(self, name: str) -> None:
        """Remove the record ``name`` if it is there."""

    @abstractmethod
    def _tags(self, prefix: str) -> dict[str, str]:
        """The lease's records whose name starts with ``prefix``, each with a tag that changes
        whenever the record is replaced by other content (an object's ETag), from one listing."""

    def _each(self, work: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``work`` of every item, in order (an object store's lease overlaps the round trips)."""
        return [work(item) for item in items]

    def current(self) -> int:
        """The highest epoch claimed so far (0: none)."""
        return newest_epoch(self._names(""))

    def claim(self, epoch: int) -> bool:
        """Claim ``epoch`` if no one has; True when this call did (and beat at once)."""
        if not self._create({epoch_name(epoch): self._claimant()}):
            return False
        self.beat(epoch)
        for old in superseded(self._names(""), epoch, ("epoch", "beat")):
            self._delete(old)
        return True

    def stream_current(self, stream: str) -> int:
        """The highest epoch of ``stream``'s lease claimed so far (0: none)."""
        return newest_epoch(self._names(f"streams/{stream}"))

    def streams_current(self, streams: Collection[str]) -> dict[str, int]:
        """:meth:`stream_current` of each of ``streams``."""
        ordered = list(streams)
        return dict(zip(ordered, self._each(self.stream_current, ordered), strict=True))

    def claim_stream(self, stream: str, epoch: int, name: str) -> bool:
        """Claim epoch ``epoch`` of ``stream``'s lease for gateway ``name`` if no one has; True
        when this call did. The claimant then holds the epoch (``StreamEpochs.hold``) and fences
        the stream in each table it writes before it reads the stream to recover."""
        return stream in self.claim_streams({stream: epoch}, name)

    def claim_streams(self, epochs: Mapping[str, int], name: str) -> frozenset[str]:
        """:meth:`claim_stream` of each stream of ``epochs`` at its epoch, together (a gateway's
        start or takeover claims its streams at once: locally their syncs are shared, on an object
        store their round trips overlap); those this call claimed. Each claimed stream's claims
        far below the new one are pruned (a listing only once there can be such)."""
        body = self._claimant(name)
        won = self._create({f"streams/{s}/{epoch_name(e)}": body for s, e in epochs.items()})
        claimed = {s: e for s, e in epochs.items() if f"streams/{s}/{epoch_name(e)}" in won}
        pruned = [(s, e) for s, e in claimed.items() if e > KEEP_EPOCHS + 1]
        olds = self._each(lambda item: superseded(self._names(f"streams/{item[0]}"), item[1]), pruned)
        for (stream, _), names in zip(pruned, olds, strict=True):
            for record in names:
                self._delete(f"streams/{stream}/{record}")
        return frozenset(claimed)

    def _claimant(self, name: str | None = None) -> bytes:
        """A claim's record: who claims, and a nonce, so that only the very PUT that wrote it, sent
        again, takes it for its own (:class:`ObjectStoreLease`), not a later claim of this process."""
        body = {"host": self.host, "pid": self.pid, "nonce": uuid.uuid4().hex}
        return json.dumps(body if name is None else {"name": name, **body}).encode()

    def stream_holder(self, stream: str, epoch: int) -> str | None:
        """The gateway that claimed ``epoch`` of ``stream`` (None: unclaimed or unreadable)."""
        try:
            raw = self._get(f"streams/{stream}/{epoch_name(epoch)}")
            return None if raw is None else str(json.loads(raw)["name"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def announce(self, name: str) -> None:
        """Say that gateway ``name`` (this process) is alive (not synced, as a beat)."""
        self._announced += 1
        body = {"name": name, "host": self.host, "pid": self.pid, "count": self._announced}
        self._put(MEMBER + name, json.dumps(body).encode())

    def members(self) -> dict[str, str]:
        """Every gateway's record by name, with a tag that changes each time it announces (its
        count grows): whether a gateway is live is judged by the change, from one listing,
        where reading every record was a GET per gateway every tick of every gateway that
        listens (a quarter of an idle pair's requests to an object store). A record is read the
        first time its name is seen, for the host and pid :meth:`gone_members` checks (side by
        side on an object store: a new meta owner meets them all at once, and the records of
        gateways killed lately are still there); one that cannot be read (a power cut kept its
        name but not its bytes) is left out, and read again next time."""
        tags = {name[len(MEMBER) :]: tag for name, tag in self._tags(MEMBER).items()}
        known = {name: whom for name, whom in self._whom.items() if name in tags}
        unread = [name for name in tags if name not in known]
        for name, raw in zip(unread, self._each(lambda n: self._get(MEMBER + n), unread), strict=True):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                if raw is not None:  # None: withdrawn since the listing
                    body = json.loads(raw)
                    known[name] = (str(body["host"]), int(body["pid"]))
        self._whom = known  # one swap: the placing loop and the listening one both call this
        return {name: tag for name, tag in tags.items() if name in known}

    def gone_members(self) -> frozenset[str]:
        """The gateways whose record names a process of this host that no longer exists (``kill
        -9`` on one machine): gone now, not a lease of silence from now."""
        self.members()
        return frozenset(name for name, (host, pid) in self._whom.items() if self._process_gone(host, pid))

    def withdraw(self, name: str) -> None:
        """Remove the record of gateway ``name``: it stopped, or has been silent for long."""
        self._delete(MEMBER + name)

    def beat(self, epoch: int, released: bool = False) -> None:
        """Renew the lease of ``epoch`` (not synced: a beat lost to a power cut only makes a
        standby wait a lease longer)."""
        self._count += 1
        body = {"host": self.host, "pid": self.pid, "count": self._count, RELEASED: released}
        self._put(epoch_name(epoch, "beat"), json.dumps(body).encode())

    def read_beat(self, epoch: int) -> Beat | None:
        """The beat of ``epoch`` (None: none yet, or unreadable)."""
        try:
            raw = self._get(epoch_name(epoch, "beat"))
            if raw is None:
                return None
            body = json.loads(raw)
            return Beat(str(body["host"]), int(body["pid"]), int(body["count"]), bool(body.get(RELEASED)))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def record_placement(self, placement: Placement) -> None:
        """The meta owner's placement (per-stream ownership), which every gateway reads to claim
        its streams (not synced: a lost one is recorded again at the meta owner's next tick)."""
        body = {"epoch": placement.epoch, "owners": placement.owners, "handovers": placement.handovers}
        self._put(PLACEMENT, json.dumps(body).encode())

    def placement(self) -> Placement:
        """The placement last recorded (epoch 0, nothing placed: none, or unreadable)."""
        try:
            raw = self._get(PLACEMENT)
            if raw is not None:
                body = json.loads(raw)
                return Placement(
                    int(body["epoch"]),
                    {str(s): str(g) for s, g in body["owners"].items()},
                    {str(s): str(g) for s, g in body["handovers"].items()},
                )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
        return Placement(0, {}, {})

    def release_stream(self, stream: str, epoch: int) -> None:
        """Say that the holder of ``epoch`` of ``stream``'s lease let it go (a clean handover: what
        it had queued is committed), so the next owner need not wait for it."""
        self._put(f"streams/{stream}/{epoch_name(epoch, 'released')}", b"{}")

    def stream_released(self, stream: str, epoch: int) -> bool:
        """Whether the holder of ``epoch`` of ``stream`` let it go."""
        try:
            return self._get(f"streams/{stream}/{epoch_name(epoch, 'released')}") is not None
        except OSError:
            return False

    def holder_gone(self, beat: Beat | None) -> bool:
        """The beat says the owner released the lease, or names a process of this host that is gone:
        no need to wait the lease out (a restart after ``kill -9`` of the only gateway)."""
        if beat is None:
            return False
        return beat.released or self._process_gone(beat.host, beat.pid)

    def _process_gone(self, host: str, pid: int) -> bool:
        """``pid`` is a process of this host that no longer exists."""
        if host != self.host or pid == self.pid:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


class LocalLease(Lease):
    """Records are files of ``<root>/_jetlake_owner``: a claim created with ``O_EXCL`` and synced
    with its folder, any other record replaced by a rename."""

    def __init__(self, root_path: str) -> None:
        super().__init__()
        self.dir = os.path.join(root_path, LEASE_DIR)
        os.makedirs(self.dir, exist_ok=True)

    def _create(self, records: Mapping[str, bytes]) -> frozenset[str]:
        """All the files created first, then synced together (with the folders that got a new
        entry): the journal commits are shared, where one claim after another paid two each (a
        restart claiming a thousand streams spent seconds in them)."""
        won: list[str] = []
        unsynced: list[str] = []
        for name, body in records.items():
            path = os.path.join(self.dir, name)
            folder = os.path.dirname(path)
            made = make_dirs(folder)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            try:
                os.write(fd, body)
            finally:
                os.close(fd)
            won.append(name)
            unsynced += [path, folder, *made]
        if unsynced:
            sync_together(unsynced)
        return frozenset(won)

    def _put(self, name: str, body: bytes) -> None:
        # per thread: a clean stop's last beat may overlap the holding loop's
        path = os.path.join(self.dir, name)
        tmp = os.path.join(os.path.dirname(path), f".record-{self.pid}-{threading.get_ident()}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(body)
        os.replace(tmp, path)

    def _get(self, name: str) -> bytes | None:
        try:
            with open(os.path.join(self.dir, name), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    def _names(self, folder: str) -> list[str]:
        try:
            return os.listdir(os.path.join(self.dir, folder))
        except FileNotFoundError:
            return []

    def _delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.dir, name))

    def _tags(self, prefix: str) -> dict[str, str]:
        """A file's modification time, inode and size: a replacement is a new file."""
        tags = {}
        for name in self._names(""):
            if name.startswith(prefix):
                with contextlib.suppress(FileNotFoundError):  # withdrawn since the listing
                    st = os.stat(os.path.join(self.dir, name))
                    tags[name] = f"{st.st_mtime_ns}:{st.st_ino}:{st.st_size}"
        return tags


class ObjectStoreLease(Lease):
    """Records are objects under ``<root>/_jetlake_owner/``: a claim a PUT that fails on an
    existing name (S3's ``If-None-Match: *``), any other record a plain PUT. A claim whose answer
    was lost and whose PUT was retried finds its own record there: a record holding exactly the
    bytes it wrote is its own (each claim carries a nonce)."""

    def __init__(self, root: StoreRoot) -> None:
        super().__init__()
        self.store = root.objects(LEASE_DIR)

    def _each(self, work: Callable[[T], R], items: Sequence[T]) -> list[R]:
        return side_by_side(work, items)

    def _create(self, records: Mapping[str, bytes]) -> frozenset[str]:
        def create(item: tuple[str, bytes]) -> bool:
            name, body = item
            try:
                obstore.put(self.store, name, body, mode="create")
            except AlreadyExistsError:
                return self._get(name) == body
            return True

        items = list(records.items())
        return frozenset(name for (name, _), won in zip(items, self._each(create, items), strict=True) if won)

    def _put(self, name: str, body: bytes) -> None:
        obstore.put(self.store, name, body)

    def _get(self, name: str) -> bytes | None:
        try:
            return bytes(obstore.get(self.store, name).bytes())
        except FileNotFoundError:
            return None

    def _names(self, folder: str) -> list[str]:
        prefix = f"{folder}/" if folder else ""
        listing = obstore.list_with_delimiter(self.store, prefix or None)
        return [str(o["path"])[len(prefix) :] for o in listing["objects"]]

    def _tags(self, prefix: str) -> dict[str, str]:
        objects = obstore.list_with_delimiter(self.store, None)["objects"]
        return {str(o["path"]): str(o["e_tag"]) for o in objects if str(o["path"]).startswith(prefix)}

    def _delete(self, name: str) -> None:
        obstore.delete(self.store, name)


def warm_up(root: StoreRoot, table: str, schema: pa.Schema) -> None:
    """Read the unpartitioned ``table`` once, changing nothing: a process's first delta-rs load and
    parquet read cost hundreds of milliseconds of set-up (thread pools, lazy initialisation) that a
    standby pays while it waits rather than during a takeover. Each file is checked before it is
    read (``read_checked``): a damaged one is skipped here and reported by the start's check."""
    try:
        dt = open_existing(root, table)
        if dt is not None:
            read_checked(root, dt, table, schema)
    except Exception:  # a damaged log entry: the start's check reports it, or rewrites it
        log.info("warm-up read of %s failed; the check at start looks at it", table, exc_info=True)


def open_lease(root: StoreRoot) -> Lease:
    """The lease of ``root``: files on a local root, objects on an object store."""
    local = root.local_path()
    if local is not None:
        return LocalLease(local)
    return ObjectStoreLease(root)
