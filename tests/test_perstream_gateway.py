"""A `Gateway` in per-stream mode (#19, docs/perstream-status.md, step 2): two gateways of one
process, each with its own stream claims and tables, both leaves of one nats-server, on one store
root. A creates S and T (a create claims the stream before its catalog commit) and serves them;
B claims S (its next epoch, every table fenced, S recovered as at a start: messages, removals,
its consumer's acks). The next publish to S reaches both (A is still subscribed): B stores and
answers it, A's commit finds S fenced, A forgets S silently and unsubscribes its subjects, and
T goes on at A without a gap. Nothing acknowledged is lost or stored twice, and every table's log
shows each stream's epochs never going down."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig, PubAck
from nats.js.client import JetStreamContext

from gateway.runtime.embedded import EmbeddedServer
from gateway.runtime.settings import Settings
from gateway.service.gateway import Gateway
from gateway.service.ownership import Ownership
from gateway.service.placing import Placing
from storage_delta.commit.lease import Placement, open_lease
from storage_delta.commit.owner import stream_owner_app
from storage_delta.commit.store import StoreRoot
from storage_delta.format import schema as sch
from storage_delta.read.reader import MessageReader
from tests.harness import free_port
from tests.test_stream_fence import check_epochs_in_log


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[EmbeddedServer]:
    server = EmbeddedServer(str(tmp_path / "nats"), "127.0.0.1", free_port(), free_port(), "jetlake")
    await server.start()
    yield server
    await server.stop()


async def per_stream(root: str, hub: EmbeddedServer, name: str) -> Gateway:
    settings = Settings(data_root=root, nats_url=hub.leaf_url, leaf_name=name)
    gateway = Gateway(settings, Ownership(open_lease(StoreRoot(root)), 1.0, name))
    await gateway.start()
    return gateway


async def publish_retrying(js: JetStreamContext, subject: str, data: bytes) -> PubAck:
    """A publish with a msg id, asked again after a time-out until answered (at most 5 times)."""
    for _ in range(4):
        try:
            return await js.publish(subject, data, timeout=2, headers={"Nats-Msg-Id": data.decode()})
        except NatsTimeout:
            continue
    return await js.publish(subject, data, timeout=2, headers={"Nats-Msg-Id": data.decode()})


def seqs(root: str, stream: str) -> list[int]:
    """Every stored sequence of ``stream``, duplicates included."""
    return sorted(seq for seq, *_ in MessageReader(StoreRoot(root)).scan_index(stream))


async def test_a_stream_taken_over_leaves_its_old_gateway_and_the_other_stream_stays(
    tmp_path: Path, hub: EmbeddedServer
) -> None:
    root = str(tmp_path / "data")
    a = await per_stream(root, hub, "a")
    a.meta = True  # what placing does for the store lease's holder: it answers creates
    b: Gateway | None = None
    nc = await nats.connect(hub.client_url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="S", subjects=["s.>"])
        await js.add_stream(name="T", subjects=["t.>"])
        assert a.claims is not None
        assert a.claims.held.epoch("S") == 1
        assert a.claims.held.epoch("T") == 1
        for i in range(1, 6):
            assert (await js.publish("s.x", b"%d" % i)).seq == i
            assert (await js.publish("t.x", b"%d" % i)).seq == i
        await js.add_consumer("S", ConsumerConfig(durable_name="C", ack_policy=AckPolicy.EXPLICIT))
        sub = await js.pull_subscribe_bind("C", "S")
        for msg in await sub.fetch(3, timeout=5):
            await msg.ack_sync()

        dropped = asyncio.Event()
        a.claims.dropped.connect(lambda names: dropped.set() if "S" in names else None)
        b = await per_stream(root, hub, "b")
        assert await b.claim(["S"]) == {"S"}
        assert b.claims is not None
        assert b.claims.held.epoch("S") == 2
        assert b.core is not None
        assert a.core is not None
        # S recovered at B as a start would: its messages, its consumer's acks
        recovered = b.core.registry.streams["S"]
        assert recovered.state.last_seq == 5
        assert b.core.registry.consumers["S"]["C"].ack_floor_sseq == 3
        assert "T" not in b.core.registry.streams

        # A still listens to s.>: the publish reaches both; only B stores and answers it. B's
        # interest in s.> may reach the hub after the publish (the claim subscribes it just now):
        # then only A hears it, is fenced and stays silent, and the client asks again, as a
        # JetStream client does through a leader change (its msg id keeps it stored once)
        assert (await publish_retrying(js, "s.x", b"6")).seq == 6
        await asyncio.wait_for(dropped.wait(), 10)
        assert "S" not in a.core.registry.streams
        assert "S" not in a.core.registry.consumers
        assert a.claims.held.epoch("S") is None
        # T at A, without a gap
        assert (await js.publish("t.x", b"6")).seq == 6
        assert (await js.publish("s.x", b"7")).seq == 7
        assert "T" in a.core.registry.streams
        # placed: A now answers nothing of S (the meta owner is silent on a placed stream), B all
        assert a.ownership is not None
        assert b.ownership is not None
        a.placement = {"S": b.ownership.name, "T": a.ownership.name}
        msgs = await sub.fetch(2, timeout=5)
        assert [m.metadata.sequence.stream for m in msgs] == [4, 5]  # 1-3 were acked at A
        for msg in msgs:
            await msg.ack_sync()
        info = await js.consumer_info("S", "C")
        assert (info.ack_floor.stream_seq, info.num_pending) == (5, 2)
        assert (await js.stream_info("T")).state.last_seq == 6
    finally:
        await nc.close()
        await a.close()
        if b is not None:
            await b.close()
    assert seqs(root, "S") == [1, 2, 3, 4, 5, 6, 7]
    assert seqs(root, "T") == [1, 2, 3, 4, 5, 6]
    store = StoreRoot(root)
    for table in (sch.MESSAGES, sch.CATALOG, sch.REMOVALS, sch.ACKS):
        check_epochs_in_log(store, table, partitioned=table == sch.MESSAGES)


def fence_commits(root: str, table: str, stream: str) -> list[int]:
    """The epochs of ``stream`` committed alone (a fence: its owner txn and no rows) to ``table``."""
    fenced = []
    log_dir = Path(root) / table / "_delta_log"
    for entry in sorted(log_dir.glob("*.json")):
        actions = [json.loads(line) for line in entry.read_text().splitlines() if line]
        app = stream_owner_app(stream)
        epochs = [int(a["txn"]["version"]) for a in actions if a.get("txn", {}).get("appId") == app]
        if epochs and not any("add" in a for a in actions):
            fenced += epochs
    return fenced


async def test_a_fresh_create_is_not_fenced_and_a_name_made_again_is(
    tmp_path: Path, hub: EmbeddedServer
) -> None:
    """A stream whose lease had no claim and whose name the catalog did not hold at the start has
    never been written: its create commits no fence and reads nothing back (#19, the cost of
    per-stream mode). The same name deleted and made again by another gateway (its lease stays)
    claims its lease's next epoch and is fenced in every table, as any stream with an owner before."""
    root = str(tmp_path / "data")
    a = await per_stream(root, hub, "a")
    a.meta = True
    b: Gateway | None = None
    nc = await nats.connect(hub.client_url)
    tables = (sch.MESSAGES, sch.CATALOG, sch.REMOVALS, sch.ACKS)
    try:
        js = nc.jetstream()
        await js.add_stream(name="S", subjects=["s.>"])
        assert a.claims is not None
        assert a.claims.held.epoch("S") == 1
        assert (await js.publish("s.x", b"1")).seq == 1
        assert {t: fence_commits(root, t, "S") for t in tables} == {t: [] for t in tables}
        await js.delete_stream("S")
        await a.close()
        b = await per_stream(root, hub, "b")
        b.meta = True
        await js.add_stream(name="S", subjects=["s.>"])
        assert b.claims is not None
        assert b.claims.held.epoch("S") == 2
        assert {t: fence_commits(root, t, "S") for t in tables} == {t: [2] for t in tables}
        assert (await js.publish("s.x", b"2")).seq == 1
        assert (await js.stream_info("S")).state.messages == 1
    finally:
        await nc.close()
        await (a if b is None else b).close()
    store = StoreRoot(root)
    for table in tables:
        check_epochs_in_log(store, table, partitioned=table == sch.MESSAGES)


async def test_a_stream_of_a_store_from_before_per_stream_mode_is_read_back_at_its_create(
    tmp_path: Path, hub: EmbeddedServer
) -> None:
    """A store written by a single owner holds streams without a lease: the catalog read at the
    per-stream gateway's start names them, so a create of one is fenced and reads it back (and
    is answered as the existing stream, its message kept), not taken for a never-written name."""
    root = str(tmp_path / "data")
    single = Gateway(Settings(data_root=root, nats_url=hub.leaf_url, leaf_name="single"))
    await single.start()
    nc = await nats.connect(hub.client_url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="S", subjects=["s.>"])
        assert (await js.publish("s.x", b"1")).seq == 1
        await single.close()
        a = await per_stream(root, hub, "a")
        a.meta = True
        try:
            await js.add_stream(name="S", subjects=["s.>"])
            assert a.claims is not None
            assert a.claims.held.epoch("S") == 1
            assert fence_commits(root, sch.MESSAGES, "S") == [1]
            assert (await js.stream_info("S")).state.messages == 1
            assert (await js.publish("s.x", b"2")).seq == 2
        finally:
            await a.close()
    finally:
        await nc.close()


async def test_a_request_for_a_stream_placed_here_waits_for_its_claim(
    tmp_path: Path, hub: EmbeddedServer
) -> None:
    """A restarted gateway (or a takeover) has its streams placed on it before it has claimed
    and recovered them: a request for one waits in its lane for the claim and is answered from
    the recovered stream, where it got no answer (a single request after a restart timed out)."""
    root = str(tmp_path / "data")
    a = await per_stream(root, hub, "a")
    a.meta = True
    b: Gateway | None = None
    nc = await nats.connect(hub.client_url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="S", subjects=["s.>"])
        assert (await js.publish("s.x", b"1")).seq == 1
        await a.close()
        b = await per_stream(root, hub, "b")
        assert b.ownership is not None
        b.placement, b.meta = {"S": b.ownership.name}, True  # placed here, not claimed yet
        asked = asyncio.create_task(nc.request("$JS.API.STREAM.INFO.S", b"", timeout=5))
        await asyncio.sleep(0.3)
        assert not asked.done()
        assert await b.claim(["S"]) == {"S"}
        info = json.loads((await asked).data)
        assert info["state"]["messages"] == 1
    finally:
        await nc.close()
        await (a if b is None else b).close()


async def test_a_create_refused_after_its_claim_lets_the_claim_go(
    tmp_path: Path, hub: EmbeddedServer
) -> None:
    """A create claims its stream before the checks that need the stream's owner (the overlap with
    the other gateways' streams, the replicas' placement): refused by one of them, it lets the
    claim go (the held epoch dropped, the lease released), so no gateway keeps an epoch of a
    stream it does not serve, which another gateway's claim would pass and a move back would
    find held and not claim again (#19). The same name made next claims its lease's next epoch;
    a create refused for a stream that exists here keeps it held."""
    root = str(tmp_path / "data")
    a = await per_stream(root, hub, "a")
    a.meta = True
    nc = await nats.connect(hub.client_url)
    try:
        assert a.claims is not None
        assert a.ownership is not None
        lease = a.ownership.lease

        async def create(name: str, config: dict[str, object]) -> dict[str, object]:
            msg = await nc.request(
                f"$JS.API.STREAM.CREATE.{name}", json.dumps({"name": name, **config}).encode()
            )
            answer: dict[str, object] = json.loads(msg.data)
            return answer

        assert "error" not in await create("O", {"subjects": ["ov.>"]})
        refused = [
            await create("N", {"subjects": ["ov.a"]}),  # overlaps O
            await create("N", {"subjects": ["n"], "num_replicas": 2}),  # one gateway live
        ]
        assert [r["error"]["err_code"] for r in refused] == [10065, 10005]  # type: ignore[index]
        assert a.claims.held.epoch("N") is None
        assert lease.stream_current("N") == 2
        assert lease.stream_released("N", 1)
        assert lease.stream_released("N", 2)
        made = await create("N", {"subjects": ["n"]})
        assert "error" not in made, made
        assert a.claims.held.epoch("N") == 3
        assert (await nc.jetstream().publish("n", b"1")).seq == 1
        other = await create("O", {"subjects": ["other"]})  # exists here with other subjects
        assert other["error"]["err_code"] == 10058  # type: ignore[index]
        assert a.claims.held.epoch("O") == 1
        assert not lease.stream_released("O", 1)
    finally:
        await nc.close()
        await a.close()


async def test_a_stream_deleted_here_made_again_elsewhere_and_placed_back_is_claimed_again(
    tmp_path: Path, hub: EmbeddedServer
) -> None:
    """A gateway keeps the epoch of a stream it deleted (it answers the stream's "not found" while
    the placement still puts it here). Made again by another gateway (which claims the next
    epoch) and placed back here before any placement named that one (it was killed first), the
    stream is claimed again and served, not found held and answered "not found" (#19)."""
    root = str(tmp_path / "data")
    a = await per_stream(root, hub, "a")
    a.meta = True
    b: Gateway | None = None
    nc = await nats.connect(hub.client_url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="S", subjects=["s.>"])
        await js.delete_stream("S")
        assert a.claims is not None
        assert a.claims.held.epoch("S") == 1
        a.meta = False
        b = await per_stream(root, hub, "b")
        b.meta = True
        await js.add_stream(name="S", subjects=["s.>"])
        assert b.claims is not None
        assert b.claims.held.epoch("S") == 2
        assert (await js.publish("s.x", b"1")).seq == 1
        await b.close()
        b = None
        assert a.ownership is not None
        await Placing(a.ownership, a)._follow(Placement(1, {"S": a.ownership.name}, {}))
        assert a.claims.held.epoch("S") == 3
        assert (await js.stream_info("S")).state.messages == 1
        assert (await js.publish("s.x", b"2")).seq == 2
    finally:
        await nc.close()
        await a.close()
        if b is not None:
            await b.close()


async def test_a_handover_from_a_gateway_that_died_is_no_handover(
    tmp_path: Path, hub: EmbeddedServer
) -> None:
    """S placed away from a live gateway is a handover: its next owner waits for the release (or
    a lease). Once that gateway is no longer live (killed, gone from the hub) it will never
    release, so S is a handover no more and its next owner claims at once, fencing it; kept for
    the lease, the move waited out the lease after the kill."""
    a = await per_stream(str(tmp_path / "data"), hub, "a")
    try:
        assert a.ownership is not None
        placing = Placing(a.ownership, a)
        assert placing._handovers({"S": "g1"}, {"S": "g2"}, ["g1", "g2"]) == {"S": "g1"}
        assert placing._handovers({"S": "g1"}, {"S": "g2"}, ["g1", "g2"]) == {"S": "g1"}
        assert placing._handovers({"S": "g1"}, {"S": "g2"}, ["g2"]) == {}
    finally:
        await a.close()
