"""``num_replicas`` and the stream info's ``cluster`` (issue #19). jetlake's "cluster" is the
gateways on one store: a stream of R > 1 is placed when R gateways are live (the owner and R - 1
standbys), as a clustered JetStream places R peers. The config answers are compared with a real
clustered JetStream of as many servers as jetlake has gateways (two nodes joined by routes); the
``cluster`` contents are checked against the gateways' own names."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from gateway.runtime.embedded import nats_server_binary
from gateway.service.ownership import Ownership
from storage_delta.commit.lease import LocalLease
from tests.harness import Jetlake, Peer, free_port, spawn, stop, wait_log, wait_port

# ---- the announcements, on their own -------------------------------------------------------------


def test_gateways_announce_themselves_beside_the_lease(tmp_path: Path) -> None:
    a, b = LocalLease(str(tmp_path)), LocalLease(str(tmp_path))
    a.announce("a")
    b.announce("b")
    seen = a.members()
    assert sorted(seen) == ["a", "b"]
    assert a.members() == seen  # no announcement since: the same tags
    b.announce("b")
    again = a.members()
    assert (again["a"], again["b"] != seen["b"]) == (seen["a"], True)
    assert a.gone_members() == frozenset()  # both processes (this one) live
    b.withdraw("b")
    b.withdraw("b")  # gone already: nothing to do
    assert list(a.members()) == ["a"]
    # a power cut kept a record's name but not its bytes: not a member (a meta owner's first
    # lease would place streams on it) until its gateway writes it again
    (tmp_path / "_jetlake_owner" / "member-torn").write_bytes(b"")
    assert list(a.members()) == ["a"]
    b.announce("torn")
    assert sorted(a.members()) == ["a", "torn"]


async def test_the_owner_counts_a_gateway_live_while_its_announcement_changes(tmp_path: Path) -> None:
    """First seen, a gateway is not yet live (a record left by a gateway killed before this owner
    started must not count); each change makes it live for a lease; silence ends that."""
    owner = Ownership(LocalLease(str(tmp_path)), lease_s=0.2, prefix="owner")
    other = LocalLease(str(tmp_path))
    other.announce("standby")
    await owner.listen()
    assert owner.gateways().standbys == ()
    other.announce("standby")
    await owner.listen()
    ((name, active),) = owner.gateways().standbys
    assert name == "standby"
    assert 0 <= active < 200_000_000
    assert owner.gateways().leader == owner.name == f"owner-{socket.gethostname()}-{os.getpid()}"
    await asyncio.sleep(0.25)
    await owner.listen()
    assert owner.gateways().standbys == ()  # silent for a lease
    assert owner.gateways().cluster("jetlake", 3).replicas == ()


# ---- against a clustered JetStream ---------------------------------------------------------------


class JetStreamCluster:
    """``nodes`` nats-servers with JetStream, joined by routes: the oracle for clustered answers."""

    def __init__(self, workdir: Path, nodes: int) -> None:
        self.workdir = workdir
        self.ports = [(free_port(), free_port()) for _ in range(nodes)]  # client, route
        self.procs: list[Any] = []

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.ports[0][0]}"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        routes = ", ".join(f"nats-route://127.0.0.1:{r}" for _, r in self.ports)
        for node, (client, route) in enumerate(self.ports):
            conf = self.workdir / f"node{node}.conf"
            conf.write_text(
                f"server_name: node{node}\nlisten: 127.0.0.1:{client}\n"
                f'jetstream {{ store_dir: "{self.workdir / f"js{node}"}" }}\n'
                f"cluster {{ name: oracle, listen: 127.0.0.1:{route}, routes: [{routes}] }}\n"
            )
            self.procs.append(
                spawn([nats_server_binary(), "-c", str(conf)], self.workdir / f"node{node}.log")
            )
        for proc, (client, _) in zip(self.procs, self.ports, strict=True):
            wait_port(client, proc)

    def stop(self) -> None:
        for proc in self.procs:
            stop(proc)


async def request(nc: Client, subject: str, body: Any) -> dict[str, Any]:
    """Asked again after a time-out (at most twice): a stream in the middle of a move is answered
    by no gateway, and its client asks again, as through a JetStream leader change. Every request
    here is a create, an update or an info, which asked twice give the first answer again."""
    data = json.dumps(body).encode() if body is not None else b""
    for attempt in range(3):
        try:
            msg = await nc.request(f"$JS.API.{subject}", data, timeout=5)
            break
        except NatsTimeout:
            if attempt == 2:
                raise
    answer: dict[str, Any] = json.loads(msg.data)
    return answer


async def until_ok(nc: Client, subject: str, body: Any, wait_s: float = 20.0) -> dict[str, Any]:
    """Ask until the answer is not an error: a cluster electing its meta leader, or an owner that
    has not yet heard a standby announce itself twice."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            answer = await request(nc, subject, body)
        except (NatsTimeout, NoRespondersError):  # no meta leader yet, or no owner serving
            answer = {"error": "timeout"}
        if "error" not in answer or time.monotonic() > deadline:
            return answer
        await asyncio.sleep(0.2)


def outcome(answer: dict[str, Any]) -> Any:
    """What must agree: the error, or the replicas the stream (or consumer) got, and how many
    replicas its cluster lists besides the leader."""
    if "error" in answer:
        return answer["error"]
    cluster = answer.get("cluster") or {}
    return (answer["config"].get("num_replicas"), len(cluster.get("replicas") or []))


@contextmanager
def two_gateways(tmp_path: Path) -> Iterator[tuple[Jetlake, Peer]]:
    gw = Jetlake(tmp_path / "jetlake")
    gw.start()
    peer = Peer(gw, "gateway2")
    try:
        wait_log(peer.log, "standing by: epoch 1 holds the store")
        yield gw, peer
    finally:
        peer.stop()
        gw.stop()


@asynccontextmanager
async def connected(url: str) -> AsyncIterator[Client]:
    nc = await nats.connect(url)
    try:
        yield nc
    finally:
        await nc.close()


CREATES = [0, 1, 2, 3, 5, 6, -1]
UPDATES = [2, 3, 6, 0, -1]
CONSUMERS = [0, 2, 3, -1]


async def _answers(url: str) -> list[Any]:
    """The same requests, in order: creates of each R, updates of an R1 stream, consumers of an R2
    stream and of an R1 stream."""
    out: list[Any] = []
    async with connected(url) as nc:
        probe = await until_ok(
            nc, "STREAM.CREATE.PROBE", {"name": "PROBE", "subjects": ["probe"], "num_replicas": 2}
        )
        assert "error" not in probe, probe
        for r in CREATES:
            name = f"C{r + 1}"
            out.append(
                outcome(
                    await request(
                        nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [name], "num_replicas": r}
                    )
                )
            )
        await request(nc, "STREAM.CREATE.U", {"name": "U", "subjects": ["u"]})
        for r in UPDATES:
            info = await request(nc, "STREAM.INFO.U", None)
            assert "config" in info, (info, out)
            config = info["config"]
            out.append(outcome(await request(nc, "STREAM.UPDATE.U", {**config, "num_replicas": r})))
        for stream in ("C3", "C2"):  # R2, R1
            for r in CONSUMERS:
                durable = f"D{r + 1}"
                config = {"durable_name": durable, "ack_policy": "explicit", "num_replicas": r}
                body = {"stream_name": stream, "config": config}
                answer = await request(nc, f"CONSUMER.CREATE.{stream}.{durable}", body)
                out.append(answer.get("error") or answer["config"].get("num_replicas"))
    return out


@pytest.mark.slow
def test_replica_answers_match_a_clustered_jetstream_of_as_many_servers(tmp_path: Path) -> None:
    """Two gateways against two clustered servers: R0 to R2 are placed (R2 lists one replica),
    R3 to R5 get 400/10005 (no suitable peers), R6 500/10052, a negative R 10133; a scale-up
    beyond the live gateways 10005; a consumer's R above its stream's 10126."""
    oracle = JetStreamCluster(tmp_path / "oracle", 2)
    oracle.start()
    try:
        expected = asyncio.run(_answers(oracle.url))
    finally:
        oracle.stop()
    with two_gateways(tmp_path) as (gw, _):
        got = asyncio.run(_answers(gw.url))
    assert got == expected
    assert expected[:3] == [(1, 0), (1, 0), (2, 1)]  # the cases are the ones meant
    assert [e["err_code"] for e in expected[3:7]] == [10005, 10005, 10052, 10133]


@pytest.mark.slow
def test_the_cluster_view_names_the_streams_gateway_and_the_live_other(tmp_path: Path) -> None:
    """leader: the gateway the stream is placed on; replicas: the other live gateway (R 2); once a
    gateway is killed, the list empties within a lease (its streams move to the survivor) and an
    R2 create finds no suitable peers; a new gateway that takes over after the last one is killed
    leads."""
    with two_gateways(tmp_path) as (gw, peer):
        assert gw.gateway is not None
        host = socket.gethostname()
        names = (f"jetlake-{host}-{gw.gateway.pid}", f"jetlake-{host}-{peer.proc.pid}")
        asyncio.run(_cluster_view(gw, peer, names))


async def info_of(nc: Client, stream: str) -> dict[str, Any]:
    """A stream's info, asked again while it moves (no gateway answers it meanwhile)."""
    answer = await until_ok(nc, f"STREAM.INFO.{stream}", None)
    assert "error" not in answer, answer
    return answer


async def _cluster_view(gw: Jetlake, peer: Peer, names: tuple[str, str]) -> None:
    """``names``: the first gateway's (the meta owner's), then ``peer``'s."""
    async with connected(gw.url) as nc:
        r2 = await until_ok(nc, "STREAM.CREATE.R2", {"name": "R2", "subjects": ["r2"], "num_replicas": 2})
        assert r2["cluster"]["name"] == "jetlake"
        leader = r2["cluster"]["leader"]
        assert leader in names
        ((replica,),) = [r2["cluster"]["replicas"]]
        assert replica["name"] == next(n for n in names if n != leader)
        assert replica["current"] is True
        assert 0 <= replica["active"] < 1_000_000_000
        r1 = await request(nc, "STREAM.CREATE.R1", {"name": "R1", "subjects": ["r1"]})
        assert r1["cluster"]["name"] == "jetlake"
        assert r1["cluster"]["leader"] in names
        assert "replicas" not in r1["cluster"]
        listed = await request(nc, "STREAM.LIST", {})
        leaders = {s["config"]["name"]: s["cluster"]["leader"] for s in listed["streams"]}
        assert leaders == {"R1": r1["cluster"]["leader"], "R2": leader}
        stop(peer.proc, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while (await info_of(nc, "R2"))["cluster"].get("replicas"):
            assert time.monotonic() < deadline, "a killed gateway still listed"
            await asyncio.sleep(0.1)
        assert (await info_of(nc, "R2"))["cluster"]["leader"] == names[0]  # the survivor
        refused = await request(
            nc, "STREAM.CREATE.R2B", {"name": "R2B", "subjects": ["r2b"], "num_replicas": 2}
        )
        assert refused["error"]["err_code"] == 10005
        # a new gateway, then the last one killed: the new one serves R2 and leads
        second = Peer(gw, "gateway3")
        try:
            wait_log(second.log, "standing by")
            gw.kill_gateway()
            info = await until_ok(nc, "STREAM.INFO.R2", None)
            assert info["cluster"]["leader"] == f"jetlake-{socket.gethostname()}-{second.proc.pid}"
            assert "replicas" not in info["cluster"]  # no other gateway any more
        finally:
            second.stop()


@pytest.mark.slow
def test_creates_refused_after_their_claim_then_made_are_served_after_a_kill(tmp_path: Path) -> None:
    """Creates of R2 refused by a lone gateway (10005, after its claim), asked again once a second
    gateway is live, then that gateway killed at once (before the meta owner records where the
    streams went): every stream is served by the survivor, its info and a publish answered. A
    create refused after its claim left the first gateway holding the stream's epoch; asked again,
    the create went to the other gateway, which claimed above it, and when the stream came back
    the first found it held, did not claim it and answered "not found" (#19)."""
    gw = Jetlake(tmp_path / "jetlake")
    gw.start()
    try:
        assert gw.gateway is not None
        asyncio.run(_refused_then_made(gw, f"jetlake-{socket.gethostname()}-{gw.gateway.pid}"))
    finally:
        gw.stop()


async def _refused_then_made(gw: Jetlake, survivor: str) -> None:
    names = [f"N{i}" for i in range(6)]

    def config(name: str) -> dict[str, Any]:
        return {"name": name, "subjects": [name.lower()], "num_replicas": 2}

    async with connected(gw.url) as nc:
        for name in names:
            refused = await request(nc, f"STREAM.CREATE.{name}", config(name))
            assert refused["error"]["err_code"] == 10005, refused
        peer = Peer(gw, "gateway2")
        try:
            await asyncio.to_thread(wait_log, peer.log, "standing by")
            made = [await until_ok(nc, f"STREAM.CREATE.{names[0]}", config(names[0]))]
            # the meta owner's placement has both gateways (then the creates are spread over them)
            await asyncio.to_thread(wait_log, gw.workdir / "gateway.log", "over 2 gateways")
            made += [await request(nc, f"STREAM.CREATE.{name}", config(name)) for name in names[1:]]
            stop(peer.proc, signal.SIGKILL)
        finally:
            peer.stop()
        assert [answer.get("error") for answer in made] == [None] * len(names)
        js = nc.jetstream()
        for name in names:
            assert (await info_of(nc, name))["cluster"]["leader"] == survivor
            for _ in range(4):  # a stream in the middle of its move is answered by no gateway
                try:
                    ack = await js.publish(name.lower(), b"1", timeout=2, headers={"Nats-Msg-Id": name})
                    break
                except NatsTimeout:
                    continue
            else:
                ack = await js.publish(name.lower(), b"1", timeout=2, headers={"Nats-Msg-Id": name})
            assert (ack.stream, ack.seq) == (name, 1)
