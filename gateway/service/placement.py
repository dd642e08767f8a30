"""Which gateway owns which stream: the meta owner's placement (per-stream ownership, #19;
docs/perstream-status.md). Pure: the same streams, live gateways and current owners give the same
answer on any gateway, so a placement can be recomputed and checked anywhere.

The rules:

* **rendezvous ranking**: each stream ranks the live gateways by a hash of (stream, gateway);
  its first ``num_replicas`` are the gateways it may be served from (its replica set; the
  ``cluster`` view's leader and replicas). A gateway that joins or leaves changes only the ranks
  that involve it, so few streams move;
* **bounded load**: no gateway gets more than its share, ``ceil(streams / gateways)``, while a
  gateway of the stream's replica set has room. Plain rendezvous hashing leaves the load to
  chance: two streams over two gateways land on one gateway half the time, which would make a
  second gateway add no throughput exactly where the issue measures it;
* **stickiness**: a stream stays with its current owner while that owner is live, in the
  stream's replica set and under its share, since every move is a handover (a pause of the
  stream's service). Only then are the streams left over placed, in name order.
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


def place(replicas: Mapping[str, int], live: Collection[str], current: Mapping[str, str]) -> dict[str, str]:
    """Stream → owning gateway for the streams of ``replicas`` (stream → ``num_replicas``) over
    the ``live`` gateways, keeping the ``current`` owners where the rules allow (module
    docstring). Empty when no gateway is live."""
    gateways = sorted(set(live))
    if not gateways:
        return {}
    share = -(-len(replicas) // len(gateways))
    load: Counter[str] = Counter()
    candidates = {s: rank(s, gateways)[: max(1, r)] for s, r in replicas.items()}
    owners: dict[str, str] = {}
    for stream in sorted(replicas):
        owner = current.get(stream)
        if owner in candidates[stream] and load[owner] < share:
            owners[stream] = owner
            load[owner] += 1
    for stream in sorted(set(replicas) - set(owners)):
        ranked = candidates[stream]
        # the first of its replica set with room; when all are full, the least loaded of them
        owner = next((g for g in ranked if load[g] < share), min(ranked, key=lambda g: load[g]))
        owners[stream] = owner
        load[owner] += 1
    return owners
