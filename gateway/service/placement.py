"""Which gateway owns which stream: the meta owner's placement (per-stream ownership, #19;
docs/perstream-status.md). Pure: the same streams, live gateways and current owners give the same
answer on any gateway, so a placement can be recomputed and checked anywhere.

The rules:

* **rendezvous ranking**: each stream ranks the live gateways by a hash of (stream, gateway);
  its first ``num_replicas`` are the gateways it may be served from (its replica set; the
  ``cluster`` view's leader and replicas). A gateway that joins or leaves changes only the ranks
  that involve it, so few streams move;
* **bounded load**: no gateway is given a stream past its share, ``ceil(streams / gateways)``,
  while a gateway of the stream's replica set has room, and none keeps more than its limit
  (below). Plain rendezvous hashing leaves the load to
  chance: two streams over two gateways land on one gateway half the time, which would make a
  second gateway add no throughput exactly where the issue measures it;
* **stickiness with slack**: a stream stays with its current owner while that owner is live and
  within its limit (:func:`kept_limit`: an eighth over the even part and one stream more), since
  every move is a handover (a pause of the stream's service), even when the owner is no longer of
  its replica set (a scale-down, a gateway that joined and ranks first): a clustered JetStream
  keeps a stream's leader through both, and through streams created and deleted beside it. The
  share alone moved streams whenever it changed (a create, a delete, streams of R 1 added beside
  streams of R > 1). While a live gateway owns nothing (it joined, or came back after a restart)
  the limit is the share, so that it gets its part at once. A stream over its owner's limit moves
  to the gateway of its replica set with the most room within the share, or stays where none has
  room (the move would only put another gateway over). Only then are the streams left over (new,
  or of a gateway gone) placed, in name order;
* **a stream stays with its local origins**: streams joined by mirror and source relations in the
  same store (:func:`groups`) are placed as one unit, so a mirror or a source and its origin always
  have one owner and the owner's copying follows the origin in its own registry
  (``gateway.adapters.sourcing``), with the copy's position committed with the copies. The group
  is ranked by its first name, its replica set is that of its largest ``num_replicas``, it
  counts its members in the load, and it stays with the current owner of most of its members.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Collection, Mapping


def rank(stream: str, gateways: Collection[str]) -> list[str]:
    """``gateways`` in ``stream``'s order of preference (highest rendezvous score first)."""

    def score(gateway: str) -> tuple[bytes, str]:
        digest = hashlib.blake2b(f"{stream}\0{gateway}".encode(), digest_size=8).digest()
        return digest, gateway

    return sorted(gateways, key=score, reverse=True)


def groups(streams: Collection[str], origins: Mapping[str, Collection[str]]) -> list[list[str]]:
    """``streams`` joined by their local mirror and source relations (stream → the names of its
    origins in the same store, without an ``external`` API prefix): each group sorted, the groups
    in the order of their first (smallest) name. An origin that is not among ``streams`` (not
    created yet, deleted) joins nothing."""
    parent = {s: s for s in streams}

    def root(s: str) -> str:
        while parent[s] != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s

    for stream in sorted(parent):
        for origin in origins.get(stream, ()):
            if origin in parent:
                a, b = sorted((root(stream), root(origin)))
                parent[b] = a
    joined: dict[str, list[str]] = {}
    for stream in sorted(parent):
        joined.setdefault(root(stream), []).append(stream)
    return [joined[key] for key in sorted(joined)]


def place(
    replicas: Mapping[str, int],
    live: Collection[str],
    current: Mapping[str, str],
    origins: Mapping[str, Collection[str]] | None = None,
) -> dict[str, str]:
    """Stream → owning gateway for the streams of ``replicas`` (stream → ``num_replicas``) over
    the ``live`` gateways, keeping the ``current`` owners where the rules allow (module
    docstring). ``origins`` (stream → its local origins' names) joins streams into groups placed
    as one unit (:func:`groups`). Empty when no gateway is live."""
    gateways = sorted(set(live))
    if not gateways:
        return {}
    share = -(-len(replicas) // len(gateways))
    busy = {owner for s in replicas if (owner := current.get(s)) is not None}.intersection(gateways)
    limit = kept_limit(len(replicas), len(gateways), idle=len(busy) < len(gateways))
    load: Counter[str] = Counter()
    units = groups(replicas, origins or {})
    # a group is ranked by its first name, over the replica set of its largest num_replicas
    candidates = {unit[0]: rank(unit[0], gateways)[: max(1, *(replicas[s] for s in unit))] for unit in units}
    owners: dict[str, str] = {}
    # the units over their owner's limit: first name → that owner
    over: dict[str, str] = {}

    def settle(unit: list[str], owner: str) -> None:
        owners.update(dict.fromkeys(unit, owner))
        load[owner] += len(unit)

    for unit in units:
        # the current owner of most of its members (ties: the group's rank order) if it may stay
        held = Counter(owner for s in unit if (owner := current.get(s)) in gateways)
        order = rank(unit[0], gateways)
        keep = sorted(held, key=lambda g: (-held[g], order.index(g)))
        owner = next((g for g in keep if _has_room(load, g, limit, len(unit))), None)
        if owner is not None:
            settle(unit, owner)
        elif keep:
            over[unit[0]] = keep[0]
    for unit in units:
        if unit[0] in owners:
            continue
        ranked, size = candidates[unit[0]], len(unit)
        if unit[0] in over:  # to the one of its replica set with the most room, or nowhere
            roomy = [g for g in ranked if _has_room(load, g, share, size)]
            settle(unit, min(roomy, key=lambda g: load[g]) if roomy else over[unit[0]])
        else:
            settle(unit, _roomiest(ranked, load, share, size))
    return owners


def kept_limit(streams: int, gateways: int, *, idle: bool) -> int:
    """How many streams a live gateway keeps of those it owns, of ``streams`` over ``gateways``
    (``idle``: one of them owns none). With an idle gateway the share, ``ceil(streams /
    gateways)``: a gateway that joined or came back gets its part at once. Else an eighth over
    the even part and one stream more (the slack): one create or delete changes a gateway's load
    by one and this limit by at most one, so it moves no stream while the loads keep within the
    slack, and one a gateway at most then, where the share alone moved streams at each change of
    it. The eighth lets the slack grow with the streams (a move per so many creates or deletes,
    not per one), at a cost of an eighth of a gateway's throughput at most."""
    if idle:
        return -(-streams // gateways)
    return -(-9 * streams // (8 * gateways)) + 1


def kept(
    streams: Collection[str],
    live: Collection[str],
    current: Mapping[str, str],
    origins: Mapping[str, Collection[str]] | None = None,
) -> dict[str, str] | None:
    """:func:`place`'s answer for ``streams`` (whatever their ``num_replicas``) when it is the
    ``current`` owners themselves, found without ranking a stream (None: :func:`place` must
    decide). It is when every stream's current owner is live, each stream has the owner of each
    of its local origins (so every group has one owner), and no gateway owns more than its limit
    (:func:`kept_limit`, with the same idle gateways, since every owner is live): then
    :func:`place`'s first pass keeps every unit with its owner (that gateway's load before the
    unit, plus the unit, is at most what it owns in all, within the limit) and its second has
    nothing left to place. With one gateway that is every tick's case; with more, every tick's
    while streams are only created (each where :func:`place_one` put it, within its share when
    its replica set has room) and updated, and no gateway joins or leaves. A dict look-up a
    stream, where a placement ranks each stream's gateways by hashes: 0.3 s on the event loop at
    10,000 streams, each tick the catalog changed (#23)."""
    gateways = set(live)
    if not gateways:
        return None
    owners: dict[str, str] = {}
    for stream in streams:
        owner = current.get(stream)
        if owner is None or owner not in gateways:
            return None
        owners[stream] = owner
    for stream, joined in (origins or {}).items():
        if stream in owners and any(o in owners and owners[o] != owners[stream] for o in joined):
            return None
    loads = Counter(owners.values())
    limit = kept_limit(len(owners), len(gateways), idle=len(loads) < len(gateways))
    if any(load > limit for load in loads.values()):
        return None
    return owners


def place_one(
    stream: str, num_replicas: int, live: Collection[str], load: Mapping[str, int], total: int
) -> str:
    """Where :func:`place` puts a new ``stream`` that joins no group, given the ``load`` of each
    live gateway (how many of the other streams it owns) and the ``total`` of streams with this
    one: a create's, at the cost of one ranking instead of a placement of every stream (which
    grew to 0.4 s a create at 10,000 streams)."""
    gateways = sorted(set(live))
    share = -(-total // len(gateways))
    return _roomiest(rank(stream, gateways)[: max(1, num_replicas)], load, share, 1)


def _roomiest(ranked: list[str], load: Mapping[str, int], share: int, size: int) -> str:
    """The first of a unit's replica set (``ranked``) with room for its ``size`` streams; when
    all are full, the least loaded of them."""
    fitting = (g for g in ranked if _has_room(load, g, share, size))
    return next(fitting, min(ranked, key=lambda g: load.get(g, 0)))


def _has_room(load: Mapping[str, int], gateway: str, share: int, size: int) -> bool:
    """Room for ``size`` streams within the share, or none yet (a group larger than a share)."""
    held = load.get(gateway, 0)
    return held == 0 or held + size <= share
