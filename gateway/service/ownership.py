"""The leases as a gateway lives them: the store lease (whose holder is the meta owner, the placer:
:mod:`gateway.service.placing`) and the streams' leases (:class:`StreamClaims`).

The protocol is :mod:`storage_delta.commit.lease` and :mod:`storage_delta.commit.owner`
(docs/architecture.md, "Several gateways on one store"). Here: a gateway standing by watches the
holder's beat and claims the next epoch once the beat has not changed for a whole lease (or names
a process of this host that is gone); the holder beats every fifth of the lease and steps down
when it finds a newer epoch claimed. None of this is what keeps a stale owner of a stream from
writing it; the fence per stream in every commit is.

Every tick each gateway, owner or standby, also announces itself (``Lease.announce``); the owner
reads the announcements and judges a gateway live when its count changed within a lease by its
own clock (:meth:`Ownership.gateways`, the streams' ``cluster`` view and replica placement).

Waiting out a lease is how a gateway learns that another one on another machine is gone, and on
an object store a lease shorter than a few seconds makes the gateways judge each other gone by
their slow round trips. The hub knows sooner: a gateway's subscriptions are withdrawn within
milliseconds of its connection closing (:class:`gateway.service.gathering.Gathering`'s presence).
A gateway whose presence the hub withdrew (:meth:`Ownership.on_hub`) counts as gone at once: its
streams are placed elsewhere and, if it held the store lease, a standby claims the next epoch
without waiting. That is safe whatever the cause, as every commit is fenced per stream; a gateway
that is alive but cut off from the hub cannot serve its clients anyway, and finds its streams taken
at its next commit of them or its next look at their leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Collection, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial

from gateway.api.responses import Gateways
from gateway.runtime.signals import Signal
from storage_delta.commit.append import WriterTable
from storage_delta.commit.lease import Beat, Lease
from storage_delta.commit.owner import StreamEpochs
from storage_delta.commit.store import StoreRoot
from storage_delta.tables.acklog import AckLog, AckLogTable
from storage_delta.tables.scope import KeptRows, Quarantine, Scope, StoreState, load_store_state

log = logging.getLogger(__name__)

#: Lease checks and beats per lease.
TICKS_PER_LEASE = 5
#: A gateway silent this many leases is taken for gone and its announcement removed.
FORGET_LEASES = 10


class Ownership:
    """One gateway process's part in the lease of a local store root."""

    def __init__(self, lease: Lease, lease_s: float, prefix: str = "jetlake") -> None:
        self.lease = lease
        self.lease_s = lease_s
        #: This gateway's name among the store's gateways (the ``leader`` of the streams it owns).
        self.name = f"{prefix}-{lease.host}-{lease.pid}"
        #: Other gateways' announcements as last seen (``Lease.members``: a tag that changes with
        #: each), and when (monotonic) each was seen to change.
        self._heard: dict[str, tuple[str, float]] = {}
        #: The epoch held (0: none yet).
        self.epoch = 0
        #: Set when the store lease was lost (a newer epoch found by :meth:`hold`): its holder is no
        #: longer the meta owner.
        self.lost = asyncio.Event()
        #: time.monotonic() of this gateway's last announcement that was written: while less than
        #: a lease old, no meta owner can have judged it gone (per-stream ownership).
        self.announced_at = 0.0
        #: Per-stream ownership: every gateway reads the announcements (it answers its streams'
        #: ``cluster`` view and replica checks), not only the store's owner.
        self.listening = False
        #: The gateways the hub withdrew (their connection closed), until they come back.
        self._left: set[str] = set()
        #: The ticks under way (:meth:`tick`), woken when a gateway leaves the hub.
        self._ticking: set[asyncio.Event] = set()

    def on_hub(self, name: str, present: bool) -> None:
        """The hub has gateway ``name``'s presence again (``present``) or withdrew it: withdrawn,
        it is not live from now on (its streams move, its store lease is free), and the ticks
        under way end at once."""
        if present:
            self._left.discard(name)
            return
        if name == self.name or name in self._left:
            return
        self._left.add(name)
        log.info("gateway %s left the hub", name)
        for waker in self._ticking:
            waker.set()

    def departed(self) -> frozenset[str]:
        """The gateways the hub withdrew."""
        return frozenset(self._left)

    async def tick(self) -> None:
        """Wait a tick (a fifth of the lease), or less: until a gateway leaves the hub."""
        waker = asyncio.Event()
        self._ticking.add(waker)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waker.wait(), self.lease_s / TICKS_PER_LEASE)
        finally:
            self._ticking.discard(waker)

    def _held_by_departed(self, beat: Beat | None) -> bool:
        """``beat`` is of a gateway the hub withdrew (its name ends with its host and pid)."""
        return beat is not None and any(n.endswith(f"-{beat.host}-{beat.pid}") for n in self._left)

    async def acquire(self) -> int:
        """Stand by until this process claims an epoch; returns it."""
        seen: tuple[int, Beat | None] | None = None
        since = time.monotonic()
        while True:
            current = await asyncio.to_thread(self.lease.current)
            beat = await asyncio.to_thread(self.lease.read_beat, current) if current else None
            if (current, beat) != seen:
                if seen is None and current and not self.lease.holder_gone(beat):
                    log.info("standing by: epoch %d holds the store", current)
                seen, since = (current, beat), time.monotonic()
            free = (
                not current
                or self.lease.holder_gone(beat)
                or self._held_by_departed(beat)
                or time.monotonic() - since >= self.lease_s
            )
            if free and await asyncio.to_thread(self.lease.claim, current + 1):
                self.epoch = current + 1
                self.lost.clear()
                log.info(
                    "owner of the store as epoch %d (%.2f s after the last change of its beat seen)",
                    self.epoch,
                    time.monotonic() - since,
                )
                return self.epoch
            await self.tick()

    async def hold(self) -> None:
        """Beat while no newer epoch is claimed; then set :attr:`lost` and return."""
        while True:
            await asyncio.sleep(self.lease_s / TICKS_PER_LEASE)
            try:
                current = await asyncio.to_thread(self.lease.current)
                if current != self.epoch:
                    log.warning(
                        "epoch %d took the store over from epoch %d; stepping down", current, self.epoch
                    )
                    self.lost.set()
                    return
                await asyncio.to_thread(self.lease.beat, self.epoch)
            except OSError as exc:
                # A full or read-only store, an object store out of reach: the commits fail and say
                # so (503/10077) until it comes back; the beat tries again next tick. Should it stay
                # away for a lease a standby may take over, and the fence in every commit decides.
                log.warning("renewing the store lease failed: %s", exc)

    async def announce(self) -> None:
        """For the life of the process, every tick: say this gateway is alive and, while it owns
        the store, note which others are. Its own loop, so that the beats keep their pace
        whatever the announcements cost (an object store's round trips)."""
        while True:
            try:
                await asyncio.to_thread(self.lease.announce, self.name)
                self.announced_at = time.monotonic()
                if self.listening or (self.epoch and not self.lost.is_set()):
                    await self.listen()
            except OSError as exc:  # the store is out of reach for now: the next tick tries again
                log.warning("announcing this gateway failed: %s", exc)
            await asyncio.sleep(self.lease_s / TICKS_PER_LEASE)

    async def listen(self) -> None:
        """Note which gateways' announcements changed; remove those silent for long. Every tick
        (:meth:`announce`), and at once when a per-stream gateway takes the store (placement)."""
        tags = await asyncio.to_thread(self.lease.members)
        now = time.monotonic()
        for name, tag in tags.items():
            if name == self.name:
                continue
            heard = self._heard.get(name)
            if heard is None:  # first seen: live only once it is seen to change
                self._heard[name] = (tag, now - self.lease_s)
            elif heard[0] != tag:
                self._heard[name] = (tag, now)
            elif now - heard[1] > FORGET_LEASES * self.lease_s:
                del self._heard[name]
                await asyncio.to_thread(self.lease.withdraw, name)
        for name in self._heard.keys() - tags.keys():
            del self._heard[name]
        self._left &= tags.keys()

    def gateways(self) -> Gateways:
        """This gateway and the live standbys, by name."""
        now = time.monotonic()
        live = sorted(
            (name, now - at)
            for name, (_, at) in self._heard.items()
            if now - at < self.lease_s and name not in self._left
        )
        return Gateways(self.name, tuple((name, int(quiet * 1e9)) for name, quiet in live))

    def heard(self) -> list[str]:
        """This gateway and every other whose announcement it has read, live or not yet judged
        (a meta owner's first lease, per-stream placement)."""
        return [self.name, *sorted(self._heard)]

    async def release(self) -> None:
        """A clean stop: a standby may take over at once."""
        if self.epoch and not self.lost.is_set():
            await asyncio.to_thread(self.lease.beat, self.epoch, True)

    async def leave(self) -> None:
        """A clean exit: this gateway no longer counts among the live ones."""
        await asyncio.to_thread(self.lease.withdraw, self.name)


@dataclass(frozen=True, slots=True)
class ClaimedStreams:
    """What a gateway reads back of the streams it just claimed and fenced."""

    #: The streams now held, with their epochs (those lost to another claimant, or fenced by a
    #: newer epoch meanwhile, are not held and not here).
    epochs: dict[str, int]
    state: StoreState
    acks: AckLog


class StreamClaims:
    """The stream leases one gateway holds (per-stream ownership, docs/perstream-status.md): the
    way into a stream is :meth:`claim` (the next epoch of its lease, held, then fenced in every
    table the gateway writes, and only then the stream read back), the way out :meth:`drop`, which
    the commit loops call when a commit found a stream fenced (``on_stream_fenced``). Which streams
    to claim is placement's call (:mod:`gateway.service.placement`), not this class's: it claims
    whatever it is asked to, one epoch above the lease's newest, so a paused holder is fenced.

    :attr:`held` is shared with the tables' appenders, built with ``streams=claims.held``."""

    def __init__(self, lease: Lease, name: str, root: StoreRoot, executor: Executor) -> None:
        self.lease = lease
        self.name = name
        self.root = root
        self.executor = executor
        self.held = StreamEpochs()
        #: Told of the streams this gateway no longer owns (a newer owner fenced them), after they
        #: left :attr:`held`: whoever serves them stops (registry, leaf subscriptions).
        self.dropped: Signal[[frozenset[str]]] = Signal()
        #: What this gateway's start read of the catalog (set by the start; the streams of a
        #: store written before per-stream ownership have no lease). None: not read, so every
        #: claim fences and reads back.
        self.at_start: StoreState | None = None
        #: What the start's check set aside (damaged ``messages`` log entries), with the names it
        #: may concern: a stream claimed later and named by it comes back offline, as at a start.
        self.offline: Collection[tuple[Scope, str]] = ()
        #: On an object store, what a claim reads back, kept read and warm (the gateway's ticks);
        #: None on a local root, where a fresh read is cheap and the rows are not held for the
        #: gateway's life (the catalog's grow with every change of every stream).
        self.kept = KeptRows.of(root) if root.local_path() is None else None

    async def claim(
        self, streams: Collection[str], tables: Sequence[WriterTable], acks: AckLogTable
    ) -> ClaimedStreams:
        """Claim ``streams``: for each the next epoch of its lease (not held when another gateway
        claimed that epoch first), held, fenced in each of ``tables`` (every table this gateway
        writes the streams' rows to, ``acks`` among them; one commit per table for all of them)
        before anything of them is read, then their definitions, logical state and consumers' ack
        history read back (the messages' index is the caller's, as at a start). A stream fenced by
        a newer epoch meanwhile is not held.

        A stream claimed as its lease's first epoch whose name the catalog did not hold at this
        gateway's start has never been written: no per-stream writer writes a stream without a
        claim, and the store's single owner (before per-stream ownership) writes none without a
        catalog entry; a deleted stream's lease stays (a name made again claims above it). Such a
        stream (a create's) is neither fenced nor read back: no previous owner, nothing to read."""
        loop = asyncio.get_running_loop()
        # each table's version before the claims: no epoch of a stream first claimed now is in it
        before = await loop.run_in_executor(self.executor, lambda: [t.version_now() for t in tables])
        won = await loop.run_in_executor(self.executor, self._claim_leases, sorted(set(streams)))
        for stream, epoch in won.items():
            self.held.hold(stream, epoch)
        start = self.at_start
        unwritten = [s for s, e in won.items() if e == 1 and start is not None and not start.may_hold(s)]
        fence = [s for s in won if s not in unwritten]
        try:
            # side by side (each a commit, a few round trips on an object store), all awaited
            fences = [
                loop.run_in_executor(self.executor, t.fence_streams, fence, v)
                for t, v in zip(tables, before, strict=True)
                if fence
            ]
            takes = [
                loop.run_in_executor(self.executor, t.take_unwritten, unwritten, v)
                for t, v in zip(tables, before, strict=True)
                if unwritten
            ]
            results = await asyncio.gather(*fences, *takes, return_exceptions=True)
        except BaseException:
            self._let_go(won)
            raise
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            self._let_go(won)
            raise failed[0]
        lost = frozenset().union(*(r for r in results if isinstance(r, frozenset)))
        self._let_go(lost)
        epochs = {s: e for s, e in won.items() if s not in lost}
        for stream, epoch in epochs.items():
            log.info("owner of stream %s as its epoch %d", stream, epoch)
        read = {s for s in fence if s not in lost}
        if not read:
            return ClaimedStreams(epochs, StoreState([], {}, Quarantine(), []), AckLog({}, 0, 0))
        kept = self.kept
        state, history = await asyncio.gather(
            loop.run_in_executor(
                self.executor, partial(load_store_state, self.root, self.offline, read, kept)
            ),
            loop.run_in_executor(self.executor, acks.load, read, kept.acks if kept is not None else None),
        )
        return ClaimedStreams(epochs, state, history)

    def _claim_leases(self, streams: Sequence[str]) -> dict[str, int]:
        """Blocking: the next epoch of each stream's lease claimed; those this gateway got."""
        epochs = {stream: epoch + 1 for stream, epoch in self.lease.streams_current(streams).items()}
        return {s: epochs[s] for s in sorted(self.lease.claim_streams(epochs, self.name))}

    def _let_go(self, streams: Collection[str]) -> None:
        """Claimed but not fenced (a newer epoch was there, or the fence failed): not held."""
        for stream in streams:
            self.held.drop(stream)

    def drop(self, streams: frozenset[str]) -> None:
        """A commit found ``streams`` fenced: this gateway writes them no more, and says so."""
        mine = frozenset(s for s in streams if self.held.epoch(s) is not None)
        for stream in mine:
            self.held.drop(stream)
            log.warning("stream %s was taken over by a newer owner; no longer serving it", stream)
        if mine:
            self.dropped.emit(mine)
