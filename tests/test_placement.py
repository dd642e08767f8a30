"""The meta owner's placement of streams over live gateways (gateway/service/placement.py, #19):
balanced, sticky, within each stream's replica set, and the same wherever it is computed."""

from __future__ import annotations

import random
from collections import Counter

from gateway.service.placement import place, rank

GATEWAYS = ["g1", "g2", "g3"]


def streams(n: int, replicas: int = 1) -> dict[str, int]:
    return {f"S{i}": replicas for i in range(n)}


def test_streams_are_spread_evenly_over_the_live_gateways() -> None:
    for n in (1, 2, 3, 7, 100):
        for gateways in (GATEWAYS[:1], GATEWAYS[:2], GATEWAYS):
            owners = place(streams(n, len(gateways)), gateways, {})
            assert set(owners) == set(streams(n))
            load = Counter(owners.values())
            assert max(load.values()) <= -(-n // len(gateways)), (n, gateways, load)
    # two streams over two gateways: one each (plain rendezvous hashing leaves that to chance)
    assert sorted(place({"A": 2, "B": 2}, ["g1", "g2"], {}).values()) == ["g1", "g2"]


def test_an_owner_is_one_of_the_streams_first_num_replicas_gateways() -> None:
    owners = place(streams(30, 2), GATEWAYS, {})
    for stream, owner in owners.items():
        assert owner in rank(stream, GATEWAYS)[:2]
    # R = 1: the stream's own first choice, whatever the load
    for stream, owner in place(streams(30, 1), GATEWAYS, {}).items():
        assert owner == rank(stream, GATEWAYS)[0]


def test_the_answer_does_not_depend_on_the_order_it_was_given_in() -> None:
    names = list(streams(20, 3))
    random.Random(7).shuffle(names)
    shuffled = {s: 3 for s in names}
    assert place(shuffled, list(reversed(GATEWAYS)), {}) == place(streams(20, 3), GATEWAYS, {})


def test_current_owners_keep_their_streams_while_they_may() -> None:
    before = place(streams(12, 3), GATEWAYS, {})
    assert place(streams(12, 3), GATEWAYS, before) == before
    # g3 dies: only its streams move, and the survivors stay balanced
    after = place(streams(12, 3), ["g1", "g2"], before)
    moved = {s for s in before if after[s] != before[s]}
    assert moved == {s for s, g in before.items() if g == "g3"}
    assert Counter(after.values()) == Counter({"g1": 6, "g2": 6})
    # g3 comes back: it gets its share, taken from the others, and no more streams move than that
    again = place(streams(12, 3), GATEWAYS, after)
    assert Counter(again.values()) == Counter({"g1": 4, "g2": 4, "g3": 4})
    assert sum(again[s] != after[s] for s in after) == 4
    # any balanced placement within the replica sets stands as it is, however it came about
    settled = {f"S{i}": "g1" if i < 6 else "g2" for i in range(12)}
    assert place(streams(12, 3), ["g1", "g2"], settled) == settled
    # an owner outside a stream's replica set gives it up
    stream = "S0"
    outsider = rank(stream, GATEWAYS)[2]
    assert place({stream: 2}, GATEWAYS, {stream: outsider})[stream] != outsider


def test_nothing_is_placed_without_a_live_gateway() -> None:
    assert place(streams(3), [], {"S0": "g1"}) == {}
