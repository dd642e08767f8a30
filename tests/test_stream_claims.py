"""A gateway's way into and out of a stream under per-stream ownership (#19,
docs/perstream-status.md): :class:`gateway.service.ownership.StreamClaims` claims the next epoch of
a stream's lease, holds it, fences the stream in every table it writes, and only then reads that
stream (and no other) back; a commit that finds the stream fenced later drops it and says so. Two
gateways on one store root, each with its own tables, as two processes would have."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.service.ownership import StreamClaims
from storage_delta.commit.append import WriterTable
from storage_delta.commit.lease import open_lease
from storage_delta.commit.owner import StreamFenced
from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import GroupCommitWriter, MessageTable
from storage_delta.tables.acklog import AckLogTable, AckLogWriter, AckRecord
from storage_delta.tables.catalog import CatalogChange, CatalogTable
from storage_delta.tables.removals import Removal, RemovalLog
from tests.harness import s3_options
from tests.stream_writer_proc import message
from tests.test_stream_fence import (
    check_epochs_in_log,
    paused_while,
    rows,
    s3_endpoint,  # noqa: F401  (module fixture: a moto server)
)


@dataclass
class Node:
    """One gateway's claims and the tables it writes, all built on its claims' holder."""

    claims: StreamClaims
    messages: MessageTable
    catalog: CatalogTable
    removals: RemovalLog
    acks: AckLogTable

    @property
    def tables(self) -> list[WriterTable]:
        return [self.messages, self.catalog, self.removals, self.acks]


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as pool:
        yield pool


def node(root: StoreRoot, name: str, executor: ThreadPoolExecutor) -> Node:
    claims = StreamClaims(open_lease(root), name, root, executor)
    held = claims.held
    return Node(
        claims,
        MessageTable(root, streams=held),
        CatalogTable(root, streams=held),
        RemovalLog(root, held),
        AckLogTable(root, streams=held),
    )


def create(n: Node, stream: str, version: int) -> None:
    body = {"created": 1000 + version, "config": {"name": stream}}
    assert n.catalog.commit([CatalogChange("stream", stream, stream, body)], version) == frozenset()


@pytest.mark.parametrize("store", ["local", "s3"])
async def test_a_claim_fences_every_table_then_reads_back_that_stream_alone(
    store: str, tmp_path: Path, executor: ThreadPoolExecutor, request: pytest.FixtureRequest
) -> None:
    """On a local root (the log appender's put-if-absent) and on S3 through moto (delta-rs's
    commits, the claims table's app transactions)."""
    if store == "s3":
        root = StoreRoot("s3://lake/claims", s3_options(request.getfixturevalue("s3_endpoint")))
    else:
        root = StoreRoot(str(tmp_path))
    a = node(root, "a", executor)
    for v, stream in enumerate(("S", "T"), 1):
        got = await a.claims.claim([stream], a.tables, a.acks)
        assert got.epochs == {stream: 1}
        assert got.state.entries == []
        create(a, stream, v)
    assert a.removals.append([Removal("S", 1001, 1, 2), Removal("T", 1002, 1, 1)]) == frozenset()
    assert a.messages.commit([message("S", 3, "a"), message("T", 2, "a")], 1) == frozenset()
    assert (
        a.acks.append([AckRecord(s, "C", "ack", 1, lsn=n) for n, s in enumerate("ST", 7)], 1) == frozenset()
    )

    b = node(root, "b", executor)
    claimed = await b.claims.claim(["S"], b.tables, b.acks)
    assert claimed.epochs == {"S": 2}
    state = claimed.state
    assert [(e.kind, e.stream) for e in state.entries] == [("stream", "S")]
    assert list(state.streams) == ["S"]
    assert state.streams["S"].removed == [(1, 2)]  # a's removal, made before the fence, read back
    assert list(claimed.acks.consumers) == [("S", "C")]
    assert claimed.acks.max_lsn == 8  # the whole table's: b's lsns go on above every row
    assert b.claims.held.epoch("S") == 2
    assert [open_lease(root).stream_holder("S", e) for e in (1, 2)] == ["a", "b"]
    # every table a writes now refuses a's rows of S, and only those
    assert a.messages.commit([message("S", 4, "a"), message("T", 3, "a")], 2) == {"S"}
    assert a.removals.append([Removal("S", 1001, 3, 3)]) == {"S"}
    assert a.catalog.commit([CatalogChange("consumer", "S", "C", {"n": 1})], 3) == {"S"}
    assert a.catalog.commit([CatalogChange("consumer", "T", "C", {"n": 1})], 4) == frozenset()


async def test_a_stream_found_fenced_by_a_commit_is_dropped_and_told(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    """The commit loop's ``on_stream_fenced`` is :meth:`StreamClaims.drop`: the stream leaves the
    held set (so no table of this gateway writes it again) and the listeners hear which."""
    root = StoreRoot(str(tmp_path))
    a = node(root, "a", executor)
    for stream in ("S", "T"):
        await a.claims.claim([stream], a.tables, a.acks)
    told: list[frozenset[str]] = []
    a.claims.dropped.connect(told.append)
    front = GroupCommitWriter(a.messages, executor, 1 << 20, lambda _rows: None)
    front.loop.on_stream_fenced = a.claims.drop
    await front.start()
    await front.submit([message("S", 1, "a"), message("T", 1, "a")])
    b = node(root, "b", executor)
    assert (await b.claims.claim(["S"], b.tables, b.acks)).epochs == {"S": 2}
    with pytest.raises(StreamFenced):
        await front.submit([message("S", 2, "a")])
    await front.submit([message("T", 2, "a")])
    await front.close()
    assert told == [frozenset({"S"})]
    assert a.claims.held.streams() == {"T"}


async def test_a_claim_lost_to_another_claimant_or_fenced_meanwhile_holds_nothing(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    root = StoreRoot(str(tmp_path))
    a, b = node(root, "a", executor), node(root, "b", executor)
    # b claims epoch 1 between a's look at the lease and a's claim: a's claim of epoch 1 fails
    lease = a.claims.lease
    current = lease.stream_current
    lease.stream_current = lambda stream: 0  # type: ignore[method-assign]
    assert (await b.claims.claim(["S"], b.tables, b.acks)).epochs == {"S": 1}
    assert (await a.claims.claim(["S"], a.tables, a.acks)).epochs == {}
    assert a.claims.held.streams() == frozenset()
    lease.stream_current = current  # type: ignore[method-assign]
    # c claims epoch 3 and fences before a claims epoch 2: a's fences fail, a holds nothing
    c = node(root, "c", executor)
    assert c.claims.lease.claim_stream("S", 3, "c")
    c.claims.held.hold("S", 3)
    for t in c.tables:
        t.fence_stream("S")
    lease.stream_current = lambda stream: 1  # type: ignore[method-assign]
    assert (await a.claims.claim(["S"], a.tables, a.acks)).epochs == {}
    assert a.claims.held.streams() == frozenset()


@pytest.mark.parametrize("store", ["local", "s3"])
def test_a_paused_owner_steps_down_from_the_stream_taken_over_and_keeps_the_other(
    store: str, tmp_path: Path, executor: ThreadPoolExecutor, request: pytest.FixtureRequest
) -> None:
    """The issue's paused owner, per stream: a process owning S and T through its claims and its
    group-commit writer is SIGSTOPped; b claims S (which fences it), reads it back and writes it;
    SIGCONT: a's next publish of S is refused, a drops S (steps down from it) and keeps
    publishing T, every round of which lands. Nothing a acknowledged of S is lost, no sequence of
    S is stored twice."""
    if store == "s3":
        root = StoreRoot("s3://lake/paused-owner", s3_options(request.getfixturevalue("s3_endpoint")))
    else:
        root = StoreRoot(str(tmp_path))
    rounds = 200 if store == "local" else 60
    recovered: list[bytes] = []

    def take_s_over() -> None:
        b = node(root, "b", executor)
        assert asyncio.run(b.claims.claim(["S"], b.tables, b.acks)).epochs == {"S": 2}
        recovered.extend(rows(root, "S"))  # read after the fence: everything a committed before it
        for i, seq in enumerate(range(len(recovered) + 1, len(recovered) + 6), start=1):
            assert b.messages.commit([message("S", seq, "b")], i) == frozenset()

    lines = paused_while(
        ["tests.stream_owner_proc", root.uri, str(rounds)],
        {"JETLAKE_TEST_STORAGE_OPTIONS": json.dumps(root.storage_options)},
        take_s_over,
    )
    first = len(recovered) + 1
    assert lines[-2:] == ["held T", "done"]
    assert lines.count("dropped S") == 1
    seqs = {
        (s, word): [int(x.split()[2]) for x in lines if x.startswith(f"{word} {s} ")]
        for s in "ST"
        for word in ("acked", "refused")
    }
    assert seqs["T", "acked"] == list(range(1, rounds + 1))
    assert seqs["T", "refused"] == []
    assert rows(root, "T") == [b"a%d" % i for i in range(1, rounds + 1)]
    acked_s = seqs["S", "acked"]
    assert acked_s == list(range(1, len(acked_s) + 1))
    assert seqs["S", "refused"]  # the publish that found the fence
    assert min(seqs["S", "refused"]) > max(acked_s)  # nothing of S acknowledged after it
    assert len(recovered) == len(acked_s) >= 20
    assert rows(root, "S") == [b"a%d" % i for i in acked_s] + [b"b%d" % i for i in range(first, first + 5)]
    check_epochs_in_log(root, "messages")


async def test_the_new_owners_ack_rows_follow_the_previous_owners(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    """A gateway's ack log writer counts lsns from the table's highest at its start; a stream it
    claims later may hold rows of the previous owner above that count. Continued above the
    highest the claim read (``ClaimedStreams.acks.max_lsn``), its rows of the stream's consumers
    fold after the previous owner's: the consumer's newest ack is the new owner's."""
    root = StoreRoot(str(tmp_path))
    a = node(root, "a", executor)
    assert (await a.claims.claim(["S"], a.tables, a.acks)).epochs == {"S": 1}
    previous = [AckRecord("S", "C", "ack", seq, lsn=seq) for seq in range(1, 51)]
    assert a.acks.append(previous, 1) == frozenset()
    b = node(root, "b", executor)
    writer = AckLogWriter(b.acks, executor, 0, flush_interval_s=5.0, max_pending=100, compact_every=0)
    await writer.start()
    claimed = await b.claims.claim(["S"], b.tables, b.acks)
    assert claimed.epochs == {"S": 2}
    writer.continue_above(claimed.acks.max_lsn)
    done = writer.submit(AckRecord("S", "C", "ack", 60), sync=True)
    assert done is not None
    await done
    await writer.close()
    log = b.acks.load()
    assert [(r.seq, r.lsn) for r in log.consumers["S", "C"]][-1] == (60, 51)
