"""Per-stream ownership as gateway processes live it (#19, docs/perstream-status.md, step 3).

Every gateway serves the streams it claims (:meth:`Gateway.claim`) and, beside that, stands
by for the store lease (:mod:`gateway.service.ownership`); its holder is the **meta owner**. The
meta owner places the store's streams over the live gateways every tick
(:func:`gateway.service.placement.place`: rendezvous ranking, bounded load, sticky owners, a
stream kept with its local mirror and source origins) and
records the placement beside the member records under its store epoch
(``Lease.record_placement``). Every gateway reads the record every tick (the lease is tick-based
already: beats and announcements), and at once when the meta owner says over the hub that it
recorded one, and follows it: it claims the streams placed on it and hands
over the ones placed on another gateway (``Gateway.release``). A record of an older meta owner
than one already followed is ignored (a paused meta owner that wakes up writes one last record
before it finds the store lost).

Whatever the timing, two gateways never both commit for a stream: a claim fences the stream in
every table, and the previous holder's next commit of it is refused (docs/architecture.md,
protocol item 2). The placement only decides who should serve, and how soon.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from gateway.service.gateway import Gateway
from gateway.service.ownership import TICKS_PER_LEASE, Ownership
from gateway.service.placement import kept, place, place_one
from storage_delta.commit.lease import Placement
from storage_delta.tables.removals import PlacedStream, StreamReplicas

log = logging.getLogger(__name__)

#: Leases a create forwarded to another gateway is waited for before its name counts as placed
#: nowhere again (a create that did not come about: refused there, or that gateway gone). Until
#: then the meta owner does not answer requests naming it: a client sees a time-out at worst, where
#: a "not found" for a stream being created was a wrong answer (bench.several_gateways on S3 got
#: 10059 for a stream just created and published to, 2 runs in 7).
FORWARD_LEASES = 5

Entry = TypeVar("Entry")


@dataclass(frozen=True, slots=True)
class _View:
    """What the meta owner's last placement was computed from, and its answer: the catalog's
    streams, stream → owner, and how many streams each gateway owns."""

    streams: dict[str, PlacedStream]
    owners: dict[str, str]
    load: Counter[str]


class Placing:
    """One gateway process's part in the placement: :meth:`lead` (stand by for the store lease,
    place while holding it) and :meth:`follow` (claim and hand over as placed), both for the life
    of the gateway; their caller cancels them."""

    def __init__(self, ownership: Ownership, gateway: Gateway) -> None:
        assert gateway.claims is not None, "a gateway in per-stream mode"
        self.ownership = ownership
        self.gateway = gateway
        self.tick_s = ownership.lease_s / TICKS_PER_LEASE
        #: Meta owner: the streams being handed over by a live gateway, and since when.
        self._moving: dict[str, tuple[str, float]] = {}
        #: Follower: the streams handed over to this gateway, since when it waits for the release.
        self._awaited: dict[str, float] = {}
        #: Set when a placement was recorded (by this gateway as the meta owner, or by the meta
        #: owner that says so over the hub): the follower reads it at once.
        self._recorded = asyncio.Event()
        #: Meta owner: the placement its last tick found recorded or recorded, which its own
        #: follower takes instead of reading back what this gateway wrote (a JSON parse of every
        #: stream's owner each tick, holding the GIL: 7 ms at 10,000 streams, #23). A record an
        #: older meta owner wrote over it is of an older epoch, which a follower ignores anyway.
        self._own: Placement | None = None
        #: The catalog's streams as placed (read again only where the catalog changed); on an
        #: object store kept warm by the follower's ticks, so a gateway that becomes the meta
        #: owner places at once instead of first replaying the catalog's log and reading its files
        #: (a third of a move's time on S3 when the meta owner was the gateway killed).
        self._catalog = StreamReplicas(gateway.root)
        assert gateway.gathering is not None, "started"
        self._gathering = gateway.gathering
        #: Meta owner: what the last tick placed by, and its answer, for :meth:`place_new`.
        self._view: _View | None = None
        #: Meta owner: until when every gateway heard of counts as live (its first lease), and
        #: the gateways its last tick found gone.
        self._settled = 0.0
        self._gone: frozenset[str] = frozenset()
        #: Meta owner: the streams :meth:`place_new` placed since that tick's catalog (their
        #: creates may not be committed yet) and where, so that creates between two ticks count
        #: each other.
        self._new: dict[str, tuple[tuple[PlacedStream, str], float]] = {}
        gateway.place_new = self.place_new

    def place_new(self, name: str, config: dict[str, Any]) -> str | None:
        """Meta owner: the gateway a stream ``name`` of ``config`` (a create's) is placed on, as
        the next tick would place it (None: this gateway is not the meta owner, or has not placed
        yet). A name a live gateway holds already (held here: a create refused after its claim,
        or a stream deleted here; forwarded there a moment ago) stays with it: another gateway's
        claim would leave it an epoch that a later move back finds held and does not claim
        again. Else the new stream alone is ranked over the gateways' loads
        (:func:`place_one`), unless it joins its origins' group, which a placement of every
        stream decides: that, for every create, grew to 0.4 s a create at 10,000 streams on the
        event loop. Costs nothing that grows with the streams but the group's case."""
        view = self._view
        if view is None or not self.gateway.meta:
            return None
        new = PlacedStream.of(config)
        # the gateways live now: one that joined since the tick gets its share of new streams at
        # once (else they all go to the others, and the next tick hands some over)
        live = self._live(self._gone | self.ownership.departed())
        since_tick = {s: entry for s, (entry, _) in self._new.items() if s != name and s not in view.streams}
        holder = self._holder(name, view)
        if holder is not None and holder in live:
            owner = holder
        elif any(o in view.streams or o in since_tick for o in new.origins):  # joins their group
            streams = {**view.streams, **{s: placed for s, (placed, _) in since_tick.items()}, name: new}
            current = self._current() | view.owners
            placed = _placed(streams, live, current).get(name)
            if placed is None:  # no gateway live
                return None
            owner = placed
        else:
            load = view.load + Counter(where for _, where in since_tick.values())
            total = len(view.streams) + len(since_tick) + 1
            owner = place_one(name, new.num_replicas, live, load, total)
        self._new[name] = ((new, owner), time.monotonic())
        return owner

    def _live(self, gone: frozenset[str]) -> list[str]:
        """The live gateways but those ``gone``: for the meta owner's first lease every gateway
        heard of, then those whose announcements changed within a lease."""
        ownership = self.ownership
        if time.monotonic() < self._settled:
            heard = ownership.heard()
        else:
            gateways = ownership.gateways()
            heard = [gateways.leader, *(name for name, _ in gateways.standbys)]
        return [name for name in heard if name not in gone]

    def _holder(self, name: str, view: _View) -> str | None:
        """The gateway that holds stream ``name`` as far as the meta owner knows: this one when it
        holds its lease, the one its create was forwarded to, or the one the last tick placed it
        on (None: none)."""
        claims = self.gateway.claims
        if claims is not None and claims.held.epoch(name) is not None:
            return self.ownership.name
        forwarded = self.gateway.forwarded.get(name)
        return forwarded[0] if forwarded is not None else view.owners.get(name)

    def _current(self) -> dict[str, str]:
        """The streams held here (created here, not placed yet) and those whose create went to
        another gateway, as their owners."""
        held = self.gateway.claims.held.streams() if self.gateway.claims is not None else ()
        forwarded = {stream: owner for stream, (owner, _) in self.gateway.forwarded.items()}
        return dict.fromkeys(held, self.ownership.name) | forwarded

    async def lead(self) -> None:
        """Stand by until this gateway holds the store lease, then beat it and place every tick
        until it is lost; then stand by again."""
        ownership = self.ownership
        while True:
            await ownership.acquire()
            holding = asyncio.create_task(ownership.hold(), name="owner-lease")
            placing = asyncio.create_task(self._place(), name="placement")
            try:
                await ownership.lost.wait()
            finally:
                for task in (placing, holding):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                self.gateway.meta = False
                self._view, self._new, self._own = None, {}, None
                self.gateway.forwarded = {}

    async def _place(self) -> None:
        """The meta owner's ticks. For its first lease every gateway it has heard of counts as
        live (announcements count as live only once seen to change, and judging by that at once
        would take every other gateway's streams); at any time a gateway whose record names a
        process of this host that is gone is not (``kill -9`` on one machine: its streams move at
        the next tick, not a lease later)."""
        ownership, gateway = self.ownership, self.gateway
        claims = gateway.claims
        assert claims is not None
        self._settled = time.monotonic() + ownership.lease_s
        # what the last placement was computed from, and its answer: a tick whose catalog, live
        # gateways and owners are those of the last one places nothing again (ranking every stream
        # took a quarter of the event loop at 2,000 streams)
        placed_from: tuple[dict[str, PlacedStream], list[str], dict[str, str]] | None = None
        owners: dict[str, str] = {}
        try:  # the others' announcements as they stand, before the first placement
            await ownership.listen()
        except OSError as exc:  # the announcing loop reads them at its next tick
            log.warning("reading the gateways' announcements failed: %s", exc)
        while True:
            try:
                streams, recorded, gone = await asyncio.gather(  # side by side: round trips
                    asyncio.to_thread(self._catalog.read),
                    asyncio.to_thread(ownership.lease.placement),
                    asyncio.to_thread(ownership.lease.gone_members),
                )
                self._gone = gone
                live = self._live(gone | ownership.departed())
                # the streams it created itself count as its own until first placed
                current = self._current() | recorded.owners
                if (streams, live, current) != placed_from:  # else the same answer again
                    placed_from, owners = (dict(streams), live, current), _placed(streams, live, current)
                handovers = self._handovers(current, owners, live)
                placement = Placement(ownership.epoch, owners, handovers)
                if placement != recorded:
                    await asyncio.to_thread(ownership.lease.record_placement, placement)
                    self._recorded.set()  # this gateway follows at once, not at its next tick
                    self._gathering.say_placed()  # and so do the others
                    moved = {s: g for s, g in owners.items() if recorded.owners.get(s) != g}
                    if moved:
                        log.info("placed %s over %d gateways", moved, len(live))
                self._own = placement
                # Only from its first placement on does the meta owner know which names are placed
                # nowhere: before it, a stream the last record left out (created just before the
                # previous meta owner stopped) would get a "not found" from it.
                gateway.placement, gateway.handovers = owners, handovers
                if self._view is None or self._view.owners is not owners:
                    self._view = _View(streams, owners, Counter(owners.values()))
                # in the catalog now, or a create that did not come about (refused, never sent on)
                since = time.monotonic() - ownership.lease_s
                self._new = _unsettled(self._new, streams, since)
                # a forwarded create waits on another gateway's claim and catalog commit (on S3
                # under load about a second, and a lease was 1 s): until it is placed, or it
                # surely did not come about, the name is not this gateway's to call "not found"
                forwarded_since = time.monotonic() - FORWARD_LEASES * ownership.lease_s
                gateway.forwarded = _unsettled(gateway.forwarded, owners, forwarded_since)
                gateway.meta = True
            except Exception:  # the store out of reach, a damaged catalog: the next tick again
                log.exception("placing the streams failed")
            await ownership.tick()  # or less: a gateway that left the hub is placed around now

    def _handovers(self, current: dict[str, str], owners: dict[str, str], live: list[str]) -> dict[str, str]:
        """The streams moving from a live gateway (stream → that gateway), kept for a lease after
        the move was placed (by then the next owner has claimed, the release or not) while that
        gateway stays live: one that dies before it released (killed, or gone from the hub) will
        never release, and its next owner, which waits for the release, would wait out the lease
        after the kill; the next owner's fence, not the release, keeps the stream right."""
        now = time.monotonic()
        for stream, owner in owners.items():
            was = current.get(stream)
            if was is not None and was != owner and was in live:
                self._moving[stream] = (was, now)
        self._moving = {
            s: (was, at)
            for s, (was, at) in self._moving.items()
            if now - at < self.ownership.lease_s and s in owners and was in live
        }
        return {stream: was for stream, (was, _) in self._moving.items()}

    async def follow(self) -> None:
        """Every tick: the newest placement's streams of this gateway claimed, those placed on
        another gateway handed over, one after another. Beside it, on an object store, the
        tables' writers and readers and the catalog are brought forward once a lease
        (:meth:`_keep_warm`)."""
        stop_hearing = self._gathering.placed.connect(self._recorded.set)
        try:
            async with asyncio.TaskGroup() as warming:
                warming.create_task(self._keep_warm(), name="tables-kept-warm")
                await self._following()
        finally:
            stop_hearing()

    async def _following(self) -> None:
        newest = 0
        while True:
            try:
                mine = self._own if self.gateway.meta else None
                if mine is not None:  # placed here: not read back
                    placement = mine
                else:
                    placement = await asyncio.to_thread(self.ownership.lease.placement)
                if placement.epoch >= newest:
                    newest = placement.epoch
                    await self._follow(placement)
                    self.gateway.followed = placement.epoch
            except Exception:  # a claim fenced by a newer one, the store out of reach: next tick
                log.exception("following the placement failed")
            # a tick, or less when a placement has just been recorded (here, or said over the hub)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._recorded.wait(), self.tick_s)
            self._recorded.clear()

    async def _keep_warm(self) -> None:
        """On an object store, once a lease: the tables' writers and readers brought forward
        (:meth:`Gateway.follow_tables`) and, on a standby, what the catalog gained read (the meta
        owner reads it on its own ticks). Its own task, so that a placement recorded while these
        reads are under way is followed at once, not after them (0.5 s of a move on S3). Not every
        tick: each round lists the logs of the tables read (the writers read their new entries
        themselves), which at a tick of 0.2 s was about 30 requests a second to the store, most
        of what a moto server on this machine answered under ingest besides the commits, and a
        standby's commits then pass at most a lease of entries at a takeover."""
        gateway = self.gateway
        if gateway.root.local_path() is not None:
            return
        while True:
            try:
                await gateway.follow_tables()
                if not gateway.meta:
                    await asyncio.to_thread(self._catalog.read)
            except Exception:  # the store out of reach: the next tick again
                log.exception("bringing the tables forward failed")
            await asyncio.sleep(self.ownership.lease_s)

    async def _follow(self, placement: Placement) -> None:
        gateway, name = self.gateway, self.ownership.name
        claims = gateway.claims
        assert claims is not None
        if not gateway.meta:  # the meta owner's own are newer than any record it may read back
            gateway.placement, gateway.handovers = placement.owners, placement.handovers
        # one pass over the placement, then set operations: per stream a sort, a dict look-up and a
        # method call each tick were most of a follow's time (5% of the event loop at 2,000
        # streams, #23), and a lone gateway holds every stream
        placed_here: list[str] = []
        elsewhere: list[str] = []
        for stream, owner in placement.owners.items():
            (placed_here if owner == name else elsewhere).append(stream)
        await gateway.drop_passed(placed_here)
        ready = [
            stream
            for stream in sorted(set(placed_here).difference(claims.held.streams()))
            if claims.held.epoch(stream) is None and await self._released(stream, placement)
        ]
        if ready:  # all in one claim: one fence commit per table, one read of each
            taken = await gateway.claim(ready)
            for stream in ready:
                if stream not in taken:
                    log.info("stream %s was claimed or fenced by another gateway first", stream)
        for stream in sorted(claims.held.streams().intersection(elsewhere)):
            await gateway.release(stream)

    async def _released(self, stream: str, placement: Placement) -> bool:
        """Whether to claim ``stream`` now: at once when it is not handed over by a live gateway
        (a takeover: its gateway is gone), else once that gateway released it, or a lease after
        this gateway first saw it placed here (a gateway that cannot finish its handover is fenced
        instead; the fence, not this wait, keeps the stream right)."""
        if stream not in placement.handovers:
            self._awaited.pop(stream, None)
            return True
        lease = self.ownership.lease
        since = self._awaited.setdefault(stream, time.monotonic())
        current = await asyncio.to_thread(lease.stream_current, stream)
        if time.monotonic() - since >= self.ownership.lease_s or await asyncio.to_thread(
            lease.stream_released, stream, current
        ):
            del self._awaited[stream]
            return True
        return False


def _placed(
    streams: Mapping[str, PlacedStream], live: list[str], current: Mapping[str, str]
) -> dict[str, str]:
    """:func:`place` over the catalog's view of the streams, or its answer found without ranking
    them when the current owners are it (:func:`kept`)."""
    origins = {name: s.origins for name, s in streams.items() if s.origins}
    as_held = kept(streams, live, current, origins)
    if as_held is not None:
        return as_held
    return place({name: s.num_replicas for name, s in streams.items()}, live, current, origins)


def _unsettled(
    entries: dict[str, tuple[Entry, float]], settled: Collection[str], since: float
) -> dict[str, tuple[Entry, float]]:
    """``entries`` (stream → what, since when) without the streams ``settled`` (in the catalog,
    or placed) and those older than ``since`` (a create that did not come about)."""
    return {s: (e, at) for s, (e, at) in entries.items() if s not in settled and at > since}
