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

* a local root (:class:`LocalLease`, ``<root>/_jetlake_owner/``): epoch ``n`` is the file
  ``epoch-<n>`` created with ``O_EXCL``; the beat is ``beat-<n>``, replaced by a rename;
* an object store (:class:`ObjectStoreLease`): epoch ``n`` is the app transaction
  ``(jetlake-owner, n)`` committed to the small Delta table ``_jetlake_owner`` (delta-rs's commit
  is the put-if-absent; two claims of one epoch conflict on the app id, and the loser sees the
  epoch taken); the beat is the object ``_jetlake_owner_beats/beat-<n>.json``, one PUT each.

Per-stream ownership adds a lease per stream, claimed the same way and naming the claiming gateway:
locally the file ``streams/<S>/epoch-<n>`` (``O_EXCL``), on an object store the app transaction
``(jetlake-owner/<S>, n)`` in the claims table and the object ``streams/<S>/epoch-<n>.json`` beside
the beats. A stream lease has no beat of its own: it lives while its gateway's member record does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs

from storage_delta.commit.durable import fsync_path, make_dirs, sync_together
from storage_delta.commit.owner import OWNER_APP, stream_owner_app
from storage_delta.commit.store import (
    CommitConflict,
    StoreRoot,
    catch_up,
    commit_adds,
    open_existing,
    open_or_create,
    read_checked,
)
from storage_delta.commit.txns import app_version
from storage_delta.format.integrity import FETCH_AHEAD

log = logging.getLogger(__name__)

LEASE_DIR = "_jetlake_owner"
BEATS_DIR = "_jetlake_owner_beats"
#: Beat content of an owner that stopped cleanly: a standby need not wait out the lease.
RELEASED = "released"
#: The record of the meta owner's placement of streams over gateways (per-stream ownership).
PLACEMENT = "placement"
#: Claims and beats of epochs this far below the current one are removed by the owner.
KEEP_EPOCHS = 8
#: Prefix of the members' records (one per live gateway, owner or standby).
MEMBER = "member-"
#: The claims table holds no rows, only the epochs' app transactions.
CLAIMS_SCHEMA = pa.schema([("epoch", pa.int64())])


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


class Lease(ABC):
    """The claims and beats of one store root, as one gateway process sees them."""

    def __init__(self) -> None:
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self._count = 0
        self._announced = 0

    @abstractmethod
    def current(self) -> int:
        """The highest epoch claimed so far (0: none)."""

    @abstractmethod
    def claim(self, epoch: int) -> bool:
        """Claim ``epoch`` if no one has; True when this call did (and beat at once)."""

    @abstractmethod
    def stream_current(self, stream: str) -> int:
        """The highest epoch of ``stream``'s lease claimed so far (0: none)."""

    def streams_current(self, streams: Collection[str]) -> dict[str, int]:
        """:meth:`stream_current` of each of ``streams``."""
        return {stream: self.stream_current(stream) for stream in streams}

    @abstractmethod
    def claim_stream(self, stream: str, epoch: int, name: str) -> bool:
        """Claim epoch ``epoch`` of ``stream``'s lease for gateway ``name`` if no one has; True
        when this call did. The claimant then holds the epoch (``StreamEpochs.hold``) and fences
        the stream in each table it writes before it reads the stream to recover."""

    def claim_streams(self, epochs: Mapping[str, int], name: str) -> frozenset[str]:
        """:meth:`claim_stream` of each stream of ``epochs`` at its epoch; those this call
        claimed (a gateway's start or takeover claims its streams together)."""
        return frozenset(s for s, epoch in epochs.items() if self.claim_stream(s, epoch, name))

    @abstractmethod
    def stream_holder(self, stream: str, epoch: int) -> str | None:
        """The gateway that claimed ``epoch`` of ``stream`` (None: unclaimed or unreadable)."""

    @abstractmethod
    def _put_record(self, name: str, body: bytes) -> None:
        """Replace the small record ``name`` beside the claims (a beat, the placement)."""

    @abstractmethod
    def _get_record(self, name: str) -> bytes | None:
        """The record ``name`` (None: none yet)."""

    @abstractmethod
    def _put_member(self, name: str, body: bytes) -> None: ...

    @abstractmethod
    def _member_records(self) -> list[bytes]: ...

    @abstractmethod
    def _drop_member(self, name: str) -> None: ...

    def announce(self, name: str) -> None:
        """Say that gateway ``name`` (this process) is alive (not synced, as a beat)."""
        self._announced += 1
        body = {"name": name, "host": self.host, "pid": self.pid, "count": self._announced}
        self._put_member(name, json.dumps(body).encode())

    def members(self) -> dict[str, int]:
        """Every gateway's announced count by name (unreadable records left out)."""
        return {name: count for name, (count, _host, _pid) in self._members().items()}

    def gone_members(self) -> frozenset[str]:
        """The gateways whose record names a process of this host that no longer exists (``kill
        -9`` on one machine): gone now, not a lease of silence from now."""
        return frozenset(n for n, (_c, host, pid) in self._members().items() if self._process_gone(host, pid))

    def _members(self) -> dict[str, tuple[int, str, int]]:
        found: dict[str, tuple[int, str, int]] = {}
        for raw in self._member_records():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                body = json.loads(raw)
                found[str(body["name"])] = (int(body["count"]), str(body["host"]), int(body["pid"]))
        return found

    def withdraw(self, name: str) -> None:
        """Remove the record of gateway ``name``: it stopped, or has been silent for long."""
        with contextlib.suppress(FileNotFoundError):
            self._drop_member(name)

    def beat(self, epoch: int, released: bool = False) -> None:
        """Renew the lease of ``epoch`` (not synced: a beat lost to a power cut only makes a
        standby wait a lease longer)."""
        self._count += 1
        body = {"host": self.host, "pid": self.pid, "count": self._count, RELEASED: released}
        self._put_record(f"beat-{epoch:020d}", json.dumps(body).encode())

    def read_beat(self, epoch: int) -> Beat | None:
        """The beat of ``epoch`` (None: none yet, or unreadable)."""
        try:
            raw = self._get_record(f"beat-{epoch:020d}")
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
        self._put_record(PLACEMENT, json.dumps(body).encode())

    def placement(self) -> Placement:
        """The placement last recorded (epoch 0, nothing placed: none, or unreadable)."""
        try:
            raw = self._get_record(PLACEMENT)
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
        self._put_record(f"streams/{stream}/released-{epoch:020d}", b"{}")

    def stream_released(self, stream: str, epoch: int) -> bool:
        """Whether the holder of ``epoch`` of ``stream`` let it go."""
        try:
            return self._get_record(f"streams/{stream}/released-{epoch:020d}") is not None
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
    """Claims are files created with ``O_EXCL`` (synced), beats files replaced by a rename."""

    def __init__(self, root_path: str) -> None:
        super().__init__()
        self.dir = os.path.join(root_path, LEASE_DIR)
        os.makedirs(self.dir, exist_ok=True)

    def current(self) -> int:
        epochs = [int(n[6:]) for n in os.listdir(self.dir) if n.startswith("epoch-") and n[6:].isdigit()]
        return max(epochs, default=0)

    def claim(self, epoch: int) -> bool:
        path = os.path.join(self.dir, f"epoch-{epoch:020d}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, json.dumps({"host": self.host, "pid": self.pid}).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_path(self.dir)
        self.beat(epoch)
        self._prune(epoch)
        return True

    def _stream_dir(self, stream: str) -> str:
        return os.path.join(self.dir, "streams", stream)

    def stream_current(self, stream: str) -> int:
        try:
            names = os.listdir(self._stream_dir(stream))
        except FileNotFoundError:
            return 0
        return max((int(n[6:]) for n in names if n.startswith("epoch-") and n[6:].isdigit()), default=0)

    def claim_stream(self, stream: str, epoch: int, name: str) -> bool:
        return stream in self.claim_streams({stream: epoch}, name)

    def claim_streams(self, epochs: Mapping[str, int], name: str) -> frozenset[str]:
        """All the claim files created first, then synced together (with the folders that got a
        new entry): the journal commits are shared, where one claim after another paid two each
        (a restart claiming a thousand streams spent seconds in them)."""
        body = json.dumps({"name": name, "host": self.host, "pid": self.pid}).encode()
        won: dict[str, int] = {}
        unsynced: list[str] = []
        for stream, epoch in epochs.items():
            folder = self._stream_dir(stream)
            made = make_dirs(folder)
            path = os.path.join(folder, f"epoch-{epoch:020d}")
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            try:
                os.write(fd, body)
            finally:
                os.close(fd)
            won[stream] = epoch
            unsynced += [path, folder, *made]
        if unsynced:
            sync_together(unsynced)
        for stream, epoch in won.items():
            folder = self._stream_dir(stream)
            for old in superseded(os.listdir(folder), epoch):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(folder, old))
        return frozenset(won)

    def stream_holder(self, stream: str, epoch: int) -> str | None:
        try:
            with open(os.path.join(self._stream_dir(stream), f"epoch-{epoch:020d}"), "rb") as fh:
                return str(json.loads(fh.read())["name"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _put_record(self, name: str, body: bytes) -> None:
        # per thread: a clean stop's last beat may overlap the holding loop's
        tmp = os.path.join(self.dir, f".record-{self.pid}-{threading.get_ident()}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(body)
        os.replace(tmp, os.path.join(self.dir, name))

    def _get_record(self, name: str) -> bytes | None:
        try:
            with open(os.path.join(self.dir, name), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    def _put_member(self, name: str, body: bytes) -> None:
        tmp = os.path.join(self.dir, f".member-{self.pid}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(body)
        os.replace(tmp, os.path.join(self.dir, MEMBER + name))

    def _member_records(self) -> list[bytes]:
        records = []
        for entry in os.listdir(self.dir):
            if entry.startswith(MEMBER):
                with contextlib.suppress(FileNotFoundError), open(os.path.join(self.dir, entry), "rb") as fh:
                    records.append(fh.read())
        return records

    def _drop_member(self, name: str) -> None:
        os.unlink(os.path.join(self.dir, MEMBER + name))

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


def superseded(names: list[str], epoch: int) -> list[str]:
    """Of a stream lease's claim (or holder) names, ``epoch-<n>``, and its release marks,
    ``released-<n>``, those more than
    :data:`KEEP_EPOCHS` below ``epoch``, just claimed: they go, so a stream taken over again and
    again keeps a bounded folder. Never the highest claim, and never the folder of a deleted
    stream: its epochs stay in the tables' logs (``jetlake-owner/<S>``), so a stream made again
    under the same name must claim above them, or its first fence would find itself fenced."""
    found = ((name, *name.partition("-")) for name in names)
    return [
        name
        for name, kind, _, number in found
        if kind in ("epoch", "released") and number.isdigit() and int(number) < epoch - KEEP_EPOCHS
    ]


class ObjectStoreLease(Lease):
    """Claims are app transactions of a Delta table (delta-rs's commit is the put-if-absent),
    beats objects replaced by a PUT."""

    def __init__(self, root: StoreRoot) -> None:
        super().__init__()
        self.root = root
        self._claims = open_or_create(root, LEASE_DIR, CLAIMS_SCHEMA, [])
        self._fs, base = root.filesystem()
        self._beats = f"{base}/{BEATS_DIR}"

    def current(self) -> int:
        catch_up(self._claims)
        return app_version(self.root, LEASE_DIR, self._claims, OWNER_APP)

    def claim(self, epoch: int) -> bool:
        """Checked against the handle as the standby's last :meth:`current` left it, not read
        again (as :meth:`claim_streams`): a claim landed since is refused by the commit."""
        if app_version(self.root, LEASE_DIR, self._claims, OWNER_APP) != epoch - 1:
            return False
        try:
            commit_adds(self._claims, [], CLAIMS_SCHEMA, [], (OWNER_APP, epoch))
        except CommitConflict:
            return False  # another claim of this epoch won the version
        self.beat(epoch)
        return True

    def stream_current(self, stream: str) -> int:
        return self.streams_current([stream])[stream]

    def streams_current(self, streams: Collection[str]) -> dict[str, int]:
        """One look at the claims table's log for all of them (a look each was a listing per
        stream of a takeover)."""
        catch_up(self._claims)
        return self._known(streams)

    def _known(self, streams: Collection[str]) -> dict[str, int]:
        """The streams' newest epochs in the handle's snapshot, as last brought forward."""
        return {s: app_version(self.root, LEASE_DIR, self._claims, stream_owner_app(s)) for s in streams}

    def claim_stream(self, stream: str, epoch: int, name: str) -> bool:
        if self.stream_current(stream) != epoch - 1:
            return False
        try:
            commit_adds(self._claims, [], CLAIMS_SCHEMA, [], (stream_owner_app(stream), epoch))
        except CommitConflict:
            return False  # another claim of this epoch won the version
        self._name_holder(stream, epoch, name)
        return True

    def claim_streams(self, epochs: Mapping[str, int], name: str) -> frozenset[str]:
        """The streams whose epoch before the claimed one is the newest, claimed in one commit
        of the claims table (an app transaction each), their holders named side by side: a
        takeover of five streams, one commit and its round trips after another, took a second
        against moto (#19). The epochs are those of the handle as the caller's
        :meth:`streams_current` left it, not read again (a listing of the log, 0.1 to 0.3 s of
        a move against a loaded moto): delta-rs refuses the commit when another claim of any of
        them landed after the handle's version, and then each is claimed alone, as
        :meth:`claim_stream`, which reads afresh. What the handle already holds must be checked
        here: a claim of an epoch in the snapshot meets no conflict."""
        if not epochs:
            return frozenset()
        current = self._known(epochs)
        free = {stream: epoch for stream, epoch in epochs.items() if current[stream] == epoch - 1}
        if not free:
            return frozenset()
        try:
            txns = [(stream_owner_app(stream), epoch) for stream, epoch in sorted(free.items())]
            commit_adds(self._claims, [], CLAIMS_SCHEMA, [], more_txns=txns)
        except CommitConflict:
            return super().claim_streams(free, name)
        with ThreadPoolExecutor(min(len(free), FETCH_AHEAD), thread_name_prefix="jetlake-holders") as pool:
            list(pool.map(lambda item: self._name_holder(item[0], item[1], name), free.items()))
        return frozenset(free)

    def _name_holder(self, stream: str, epoch: int, name: str) -> None:
        """After a claim: the holder's name beside it (a reader may find none for a moment),
        and the stream's claims more than :data:`KEEP_EPOCHS` below it pruned."""
        with self._fs.open_output_stream(self._stream_holder_path(stream, epoch)) as out:
            out.write(json.dumps({"name": name, "host": self.host, "pid": self.pid}).encode())
        if epoch <= KEEP_EPOCHS + 1:
            return  # nothing below it to prune (:func:`superseded`): no listing
        folder = f"{self._beats}/streams/{stream}"
        listing = self._fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
        for old in superseded([i.base_name.removesuffix(".json") for i in listing], epoch):
            with contextlib.suppress(FileNotFoundError):
                self._fs.delete_file(f"{folder}/{old}.json")

    def _stream_holder_path(self, stream: str, epoch: int) -> str:
        return f"{self._beats}/streams/{stream}/epoch-{epoch:020d}.json"

    def stream_holder(self, stream: str, epoch: int) -> str | None:
        try:
            with self._fs.open_input_stream(self._stream_holder_path(stream, epoch)) as fh:
                return str(json.loads(bytes(fh.read()))["name"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _put_record(self, name: str, body: bytes) -> None:
        with self._fs.open_output_stream(f"{self._beats}/{name}.json") as out:
            out.write(body)

    def _get_record(self, name: str) -> bytes | None:
        try:
            with self._fs.open_input_stream(f"{self._beats}/{name}.json") as fh:
                return bytes(fh.read())
        except FileNotFoundError:
            return None

    def _put_member(self, name: str, body: bytes) -> None:
        with self._fs.open_output_stream(f"{self._beats}/{MEMBER}{name}.json") as out:
            out.write(body)

    def _member_records(self) -> list[bytes]:
        """Fetched side by side: a new meta owner reads them all before it places, one round trip
        each (and the records of gateways killed lately are still there)."""
        listing = self._fs.get_file_info(pafs.FileSelector(self._beats, allow_not_found=True))
        paths = [info.path for info in listing if info.base_name.startswith(MEMBER)]
        if not paths:
            return []
        with ThreadPoolExecutor(min(len(paths), FETCH_AHEAD), thread_name_prefix="jetlake-members") as pool:
            return [raw for raw in pool.map(self._member_record, paths) if raw is not None]

    def _member_record(self, path: str) -> bytes | None:
        try:
            with self._fs.open_input_stream(path) as fh:
                return bytes(fh.read())
        except FileNotFoundError:  # withdrawn since the listing
            return None

    def _drop_member(self, name: str) -> None:
        self._fs.delete_file(f"{self._beats}/{MEMBER}{name}.json")


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
    """The lease of ``root``: files on a local root, a Delta table and objects on an object store."""
    local = root.local_path()
    if local is not None:
        return LocalLease(local)
    return ObjectStoreLease(root)
