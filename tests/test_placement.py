"""The meta owner's placement of streams over live gateways (gateway/service/placement.py, #19):
balanced, sticky, within each stream's replica set, and the same wherever it is computed."""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from gateway.service.placement import groups, kept, place, place_one, rank
from storage_delta.commit.checkpoint import checkpoint_table, trim_log
from storage_delta.commit.deltalog import commit_path
from storage_delta.commit.store import StoreRoot, write_data_file
from storage_delta.format import schema as sch
from storage_delta.maintenance.files import removes_of, swap_actions
from storage_delta.tables.catalog import CatalogChange, CatalogTable
from storage_delta.tables.removals import PlacedStream, StreamReplicas
from tests.harness import moto_s3, s3_options
from tests.test_stream_fence import fenced

GATEWAYS = ["g1", "g2", "g3"]
Owners = dict[str, str] | None


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
    # an owner outside a stream's replica set (a scale-down, a gateway that joined and ranks
    # first) keeps it while under its share, as a cluster keeps a stream's leader; a new one goes
    # to its replica set
    stream = "S0"
    outsider = rank(stream, GATEWAYS)[2]
    assert place({stream: 2}, GATEWAYS, {stream: outsider})[stream] == outsider
    assert place({stream: 2}, GATEWAYS, {})[stream] == rank(stream, GATEWAYS)[0]


def test_nothing_is_placed_without_a_live_gateway() -> None:
    assert place(streams(3), [], {"S0": "g1"}) == {}


def test_a_stream_and_its_local_origins_are_placed_as_one_group() -> None:
    # M mirrors O, A sources O and P, X sources M: all one group; Q stands alone
    origins = {"M": ["O"], "A": ["O", "P"], "X": ["M"], "Q": []}
    replicas = {s: 2 for s in ("A", "M", "O", "P", "Q", "X")}
    assert groups(replicas, origins) == [["A", "M", "O", "P", "X"], ["Q"]]
    # an origin that does not exist (yet) joins nothing
    assert groups({"M": 1, "N": 1}, {"M": ["gone"], "N": []}) == [["M"], ["N"]]
    for gateways in (GATEWAYS[:2], GATEWAYS):
        owners = place(replicas, gateways, {}, origins)
        assert len({owners[s] for s in ("A", "M", "O", "P", "X")}) == 1, owners
        # ranked by its first name over the replica set of its largest num_replicas
        assert owners["A"] in rank("A", gateways)[:2]
        # the group counts all its members: the lone stream goes elsewhere
        assert owners["Q"] != owners["A"]
    # the largest num_replicas of the group decides its replica set
    wide = place({"A": 1, "O": 3}, GATEWAYS, {}, {"A": ["O"]})
    assert wide["A"] == wide["O"] == rank("A", GATEWAYS)[0]
    narrow = {"A": 1, "O": 1}
    outsider = rank("A", GATEWAYS)[2]
    kept = place(narrow, GATEWAYS, {"A": outsider, "O": outsider}, {"A": ["O"]})
    assert kept == dict.fromkeys(narrow, outsider)


def test_a_new_sourcing_stream_joins_its_origins_owner_and_the_group_stays() -> None:
    # O on g1 and P on g2 (each alone, R 2), then A sourcing both is created on g2 (the meta owner)
    gateways = ["g1", "g2"]
    before = {"O": "g1", "P": "g2"}
    replicas = {"A": 2, "O": 2, "P": 2}
    after = place(replicas, gateways, {**before, "A": "g2"}, {"A": ["O", "P"]})
    # the owner of most of the group's members keeps it: one stream moves, by one handover
    assert after == dict.fromkeys(replicas, "g2")
    assert place(replicas, gateways, after, {"A": ["O", "P"]}) == after
    # its owner dies: the whole group goes to the survivor
    assert place(replicas, ["g1"], after, {"A": ["O", "P"]}) == dict.fromkeys(replicas, "g1")
    # a group of one stream each is the plain placement
    assert place(streams(12, 3), GATEWAYS, {}, {}) == place(streams(12, 3), GATEWAYS, {})


def test_the_catalog_view_names_only_local_origins() -> None:
    """What the meta owner reads of each stream's config (``StreamReplicas``)."""
    assert PlacedStream.of({"num_replicas": 0, "mirror": {"name": "O"}}) == PlacedStream(1, ("O",))
    sources = [{"name": "P"}, {"name": "O"}, {"name": "R", "external": {"api": "$JS.hub.API"}}]
    assert PlacedStream.of({"num_replicas": 3, "sources": sources}) == PlacedStream(3, ("O", "P"))
    assert PlacedStream.of({"num_replicas": 2, "mirror": None, "sources": None}) == PlacedStream(2, ())


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_s3() as endpoint:
        yield endpoint


@pytest.mark.parametrize("store", ["local", "s3"])
def test_the_catalog_view_follows_creates_updates_and_deletes_commit_by_commit(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``StreamReplicas`` reads only the files added since its last read and parses only the
    streams whose newest row they change (#23), following the log's entries on either kind of
    root: what it answers is, after every commit, what a fresh reader of the whole catalog
    answers, and an answer it gave stays as it was."""
    if store == "local":
        root = StoreRoot(str(tmp_path))
    else:
        root = StoreRoot(f"s3://lake/{tmp_path.name}", s3_options(request.getfixturevalue("s3_endpoint")))
    catalog, view = CatalogTable(root), StreamReplicas(root)

    def body(replicas: int, mirror: str | None = None) -> dict[str, object]:
        config: dict[str, object] = {"num_replicas": replicas}
        if mirror is not None:
            config["mirror"] = {"name": mirror}
        return {"config": config, "created": 1}

    steps: list[list[CatalogChange]] = [
        [CatalogChange("stream", f"S{i}", f"S{i}", body(1)) for i in range(5)],
        [CatalogChange("stream", "S1", "S1", body(3))],  # an update
        [CatalogChange("consumer", "S2", "C", {"config": {}})],  # not a stream's row
        [CatalogChange("stream", "S3", "S3", None), CatalogChange("stream", "M", "M", body(2, "S0"))],
        [CatalogChange("stream", "S3", "S3", body(1))],  # made again
        [CatalogChange("stream", "S4", "S4", None)],
    ]
    expected: list[dict[str, PlacedStream]] = [
        {f"S{i}": PlacedStream(1, ()) for i in range(5)},
        {**{f"S{i}": PlacedStream(1, ()) for i in range(5)}, "S1": PlacedStream(3, ())},
    ]
    expected.append(expected[-1])
    expected.append({**{s: p for s, p in expected[-1].items() if s != "S3"}, "M": PlacedStream(2, ("S0",))})
    expected.append({**expected[-1], "S3": PlacedStream(1, ())})
    expected.append({s: p for s, p in expected[-1].items() if s != "S4"})
    answers = []
    for version, (changes, want) in enumerate(zip(steps, expected, strict=True), start=1):
        catalog.commit(changes, version)
        got = view.read()
        answers.append(got)
        assert got == want, version
        assert StreamReplicas(root).read() == want, version  # a reader of the whole catalog
        assert view.read() is got  # no commit since: the same answer, nothing read
    assert answers == expected  # the answers given were left as they were
    assert pa.table(catalog.dt.get_add_actions(flatten=True)).num_rows == len(steps)  # a file each
    # a new owner's fence of S0: a catalog commit without files, which changes no stream
    fenced(CatalogTable, root, {"S0": 1})
    assert view.read() == expected[-1]


def test_the_catalog_view_reads_the_snapshot_when_files_went_or_the_log_was_trimmed(tmp_path: Path) -> None:
    """Following the log's entries (a local store, #23) stops where they cannot tell the view:
    a commit that removes files (a fold of the catalog's rows into one file) and entries trimmed
    below a checkpoint past what the view last read (the root's retention 0, as the trim's
    here: only entries older than it may go, so a view that looked for the next entry less than
    a retention ago does not look for a trim). Either way the view is a fresh reader's."""
    root = StoreRoot(str(tmp_path), log_retention_s=0.0)
    catalog, view = CatalogTable(root), StreamReplicas(root)
    for version in range(1, 4):
        catalog.commit([CatalogChange("stream", f"S{version}", f"S{version}", {"config": {}})], version)
    assert set(view.read()) == {"S1", "S2", "S3"}
    # all files folded into one, and S2 ended in the same swap: the rows that went are not read
    files = pa.table(catalog.dt.get_add_actions(flatten=True))
    rows = CatalogTable(root).dt.to_pyarrow_table()
    kept = rows.filter(pa.compute.not_equal(rows["stream"], "S2"))
    add = write_data_file(root, sch.CATALOG, {}, kept)
    assert swap_actions(root, sch.CATALOG, sch.CATALOG_SCHEMA, [], removes_of(files), [add])
    assert set(view.read()) == {"S1", "S3"} == set(StreamReplicas(root).read())
    # the log trimmed to a checkpoint past the view's version, the entry of S4 below it
    writer = CatalogTable(root)
    for version in range(4, 8):
        writer.commit([CatalogChange("stream", f"S{version}", f"S{version}", {"config": {}})], version)
        if version >= 6:  # a trim keeps the entries from the newest but one checkpoint
            checkpoint_table(root, writer.dt, sch.CATALOG)
    trim_log(os.path.join(str(tmp_path), sch.CATALOG), 0)  # the checkpoints' own trims may have done it
    assert not os.path.exists(commit_path(os.path.join(str(tmp_path), sch.CATALOG, "_delta_log"), 4))
    live = {"S1", "S3", "S4", "S5", "S6", "S7"}
    assert set(view.read()) == live == set(StreamReplicas(root).read())


def test_a_new_stream_placed_alone_stays_where_the_next_placement_finds_it() -> None:
    """``place_one`` (a create's: one ranking, not a placement of every stream) puts the new stream
    on one of its first R gateways, on one with room when one has, and the next placement of every
    stream (the meta owner's next tick, the new one's owner as current) keeps it there: a create
    forwarded to that gateway is not moved a tick later. Over many random stores."""
    rng = random.Random(7)
    for _ in range(300):
        gateways = [f"g{i}" for i in range(rng.randint(1, 5))]
        replicas = {f"s{i}": rng.randint(1, len(gateways)) for i in range(rng.randint(0, 40))}
        current = place(replicas, gateways, {})
        name, r = f"new{rng.randint(0, 99)}", rng.randint(1, len(gateways))
        load = Counter(current.values())
        alone = place_one(name, r, gateways, load, len(replicas) + 1)
        ranked = rank(name, gateways)[:r]
        assert alone in ranked
        share = -(-(len(replicas) + 1) // len(gateways))
        if any(load[g] + 1 <= share for g in ranked):
            assert load[alone] + 1 <= share
            after = place({**replicas, name: r}, gateways, {**current, name: alone})
            assert after[name] == alone, (replicas, name, r)


def test_the_current_owners_kept_without_ranking_are_the_full_placement() -> None:
    """``kept`` (the meta owner's tick without ranking every stream) answers exactly what ``place``
    does whenever it answers, over random stores: creates placed one at a time as a create is,
    deletes, origins joining streams, gateways joining and leaving, owners moved by hand past
    their limit or away from their group. And it answers every tick after creates without a
    membership change where each stream may go to any gateway and none has local origins (a lone
    gateway's case always), else the meta owner would rank every stream again each tick."""

    def checked(live: list[str], current: dict[str, str], origins: dict[str, list[str]]) -> Owners:
        answer = kept(replicas, live, current, origins)
        if answer is not None:
            assert answer == place(replicas, live, current, origins), (replicas, live, current, origins)
        return answer

    rng = random.Random(23)
    for _ in range(2000):
        gateways = [f"g{i}" for i in range(rng.randint(1, 5))]
        anywhere = rng.random() < 0.5  # every stream's replica set is every gateway, no origins
        replicas = {
            f"s{i}": len(gateways) if anywhere else rng.randint(1, len(gateways))
            for i in range(rng.randint(0, 40))
        }
        names = sorted(replicas)
        origins: dict[str, list[str]] = {}
        for name in [] if anywhere else names:
            if rng.random() < 0.15:
                origins[name] = rng.sample(names, min(len(names), rng.randint(0, 2)))
        current = place(replicas, gateways, {}, origins)
        for _ in range(rng.randint(0, 8)):  # creates, as the meta owner places each between ticks
            name = f"n{rng.randint(0, 999)}"
            r = len(gateways) if anywhere else rng.randint(1, len(gateways))
            total = len(replicas) + (name not in replicas)
            current[name] = place_one(name, r, gateways, Counter(current.values()), total)
            replicas[name] = r
        steady = checked(gateways, dict(current), origins)
        assert steady is not None or not anywhere, (replicas, gateways, current)
        for name in rng.sample(sorted(replicas), min(len(replicas), rng.randint(0, 3))):  # deletes
            del replicas[name]  # (a limit lowered may move a stream: then ``place`` decides)
        checked(gateways, dict(current), origins)
        live = list(gateways)
        change = rng.random()
        if change < 0.2:  # a gateway joins
            live.append("g9")
        elif change < 0.4 and len(live) > 1:  # one leaves
            live.remove(rng.choice(live))
        elif change < 0.6 and current:  # an owner moved by hand: past its limit, out of its group
            current[rng.choice(sorted(current))] = rng.choice(live)
        elif change < 0.7 and len(replicas) > 1:  # a new source joins two streams
            a, b = rng.sample(sorted(replicas), 2)
            origins = {**origins, a: [b]}
        checked(live, current, origins)
