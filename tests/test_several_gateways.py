"""Several ``jetlake serve`` processes on one store root and one hub (issue #19), each stream served by
one of them: ``kill -9`` of a stream's gateway hands it over within 2 s with nothing acknowledged lost
and nothing stored twice, again and again, on one hub node and on a 3-node hub cluster. (A paused
owner, two streams on two gateways: ``tests/test_perstream_serve.py``.) Real processes
throughout; what is checked is what clients see and what the Delta tables hold."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import nats
import pytest
from deltalake import DeltaTable
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, PubAck
from nats.js.errors import APIError, NoStreamResponseError, ServiceUnavailableError

from gateway.runtime.embedded import nats_server_binary, server_config
from storage_delta.commit.store import StoreRoot
from tests.harness import Jetlake, Peer, free_port, spawn, stop, wait_log, wait_port

#: ``alone``: the handover bounds (2 s) are wall-clock bounds.
pytestmark = [pytest.mark.slow, pytest.mark.alone]

#: Each try of a publish waits this long for its PubAck before it is sent again (same Nats-Msg-Id).
TRY_S = 0.25


class Publisher:
    """Publishes with ``Nats-Msg-Id`` and sends again until acknowledged, as a careful client does.
    Counts error answers (there must be none: a client sees time-outs, never a wrong answer)."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self.errors: list[str] = []
        self.acks: dict[str, tuple[PubAck, float]] = {}

    async def publish(self, subject: str, msg_id: str) -> PubAck:
        while True:
            try:
                ack = await self.js.publish(
                    subject, msg_id.encode(), headers={"Nats-Msg-Id": msg_id}, timeout=TRY_S
                )
            except NatsTimeout:
                continue
            except (NoRespondersError, NoStreamResponseError):  # no gateway has interest yet
                await asyncio.sleep(0.02)
                continue
            except APIError as exc:
                self.errors.append(f"{msg_id}: {exc}")
                continue
            self.acks[msg_id] = (ack, time.monotonic())
            return ack


def stored_payloads(root: StoreRoot, stream: str) -> list[str]:
    """What the messages table holds for ``stream``, row by row, in sequence order."""
    opts = dict(root.storage_options) if root.storage_options else None
    table = DeltaTable(root.table_uri("messages"), storage_options=opts).to_pyarrow_table(
        columns=["stream", "seq", "data"]
    )
    columns = table.to_pydict().values()
    rows = sorted((seq, data) for s, seq, data in zip(*columns, strict=True) if s == stream)
    return [data.decode() for _, data in rows]


def owner_epochs(table_path: Path) -> list[int]:
    """The owner epoch of each commit of a table that carries one, in log order."""
    epochs = []
    for entry in sorted((table_path / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            txn = json.loads(line).get("txn")
            if txn is not None and txn["appId"] == "jetlake-owner":
                epochs.append(int(txn["version"]))
    return epochs


def assert_fenced_logs(data_root: Path) -> None:
    """In every table the gateways write, no commit of an epoch lands after a commit of a newer one."""
    tables = [p.parent for p in data_root.glob("*/_delta_log")]
    assert {t.name for t in tables} >= {"messages", "acks", "catalog"}
    for table in tables:
        epochs = owner_epochs(table)
        assert epochs == sorted(epochs), (
            f"{table.name}: an older epoch's commit after a newer one's: {epochs}"
        )


class Acker:
    """A pull consumer that acks each message synchronously; notes what it knew to be acked
    before the first kill, and what was delivered after it."""

    def __init__(
        self,
        js: JetStreamContext,
        sub: JetStreamContext.PullSubscription,
        expected: set[str],
        killed: list[float],
        stream: str = "K",
    ) -> None:
        """``stream``: the stream of the consumer ``C`` that ``sub`` pulls from."""
        self.js, self.sub, self.expected, self.killed = js, sub, expected, killed
        self.stream = stream
        self.acked_before_kill: set[str] = set()
        #: set at the first ack known before a kill: a scenario may wait for it before killing
        self.acked_one = asyncio.Event()
        self.delivered_after_kill: list[str] = []
        self.seen: set[str] = set()

    async def run(self, total: int) -> None:
        while True:
            if self.seen == self.expected and await self._all_acked(total):
                return
            try:
                msgs = await self.sub.fetch(50, timeout=0.5)
            except (TimeoutError, ServiceUnavailableError):  # 503: the hub had no gateway to ask
                continue
            for msg in msgs:
                await self._take(msg)

    async def _all_acked(self, total: int) -> bool:
        """The consumer's own state says every message is acked (False while no gateway answers)."""
        try:
            ci = await self.js.consumer_info(self.stream, "C", timeout=1)
        except (TimeoutError, ServiceUnavailableError, NoRespondersError):
            return False
        return (ci.num_ack_pending, ci.num_pending, ci.ack_floor.stream_seq) == (0, 0, total)

    async def _take(self, msg: Msg) -> None:
        body = msg.data.decode()
        self.seen.add(body)
        if self.killed:
            self.delivered_after_kill.append(body)
        try:
            await msg.ack_sync(timeout=0.5)
        except (TimeoutError, NoRespondersError):
            return  # not known to be acked: it may come again after ack_wait
        if not self.killed:
            self.acked_before_kill.add(body)
            self.acked_one.set()


async def connect(gw: Jetlake) -> tuple[Client, JetStreamContext]:
    nc = await nats.connect(gw.url)
    return nc, nc.jetstream()


def test_kill_9_of_the_owner_hands_over_within_2_s(tmp_path: Path) -> None:
    """Publishers that retry with Nats-Msg-Id until acknowledged and a pull consumer that acks
    (synchronously) run while the owner is killed: the standby serves within 2 s, every
    acknowledged message is stored exactly once, and what the consumer acked before the kill is
    not delivered again."""
    gw = Jetlake(tmp_path)
    gw.start()
    peer = Peer(gw, "gateway2")
    try:
        wait_log(peer.log, "standing by: epoch 1 holds the store")
        gaps = asyncio.run(_kill_under_load(gw.url, StoreRoot(str(gw.data_root)), [gw.kill_gateway]))
    finally:
        peer.stop()
        gw.stop()
    assert "owner of the store as epoch 2" in peer.text()
    print(f"kill -9 to the next PubAck: {gaps[0]:.2f} s")
    assert max(gaps) < 2.0, gaps


class HubCluster:
    """Three nats-server nodes joined by routes, each with a leafnode listener and the domain
    mappings: the hub as a deployment that outgrew one server has it."""

    def __init__(self, workdir: Path, domain: str = "jetlake", nodes: int = 3) -> None:
        self.workdir = workdir
        self.domain = domain
        self.ports = [(free_port(), free_port(), free_port()) for _ in range(nodes)]  # client, leaf, route
        self.procs: list[subprocess.Popen[bytes]] = []

    def url(self, node: int) -> str:
        return f"nats://127.0.0.1:{self.ports[node][0]}"

    def leaf_url(self, node: int) -> str:
        return f"nats-leaf://127.0.0.1:{self.ports[node][1]}"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        routes = ", ".join(f"nats-route://127.0.0.1:{r}" for _, _, r in self.ports)
        for node, (client, leaf, route) in enumerate(self.ports):
            conf = self.workdir / f"node{node}.conf"
            conf.write_text(
                server_config("127.0.0.1", client, "127.0.0.1", leaf, self.domain)
                + f"server_name: node{node}\n"
                + f"cluster {{ name: hub, listen: 127.0.0.1:{route}, routes: [{routes}] }}\n"
            )
            self.procs.append(
                spawn([nats_server_binary(), "-c", str(conf)], self.workdir / f"node{node}.log")
            )
        for proc, (client, leaf, _) in zip(self.procs, self.ports, strict=True):
            wait_port(client, proc)
            wait_port(leaf, proc)

    def stop(self) -> None:
        for proc in self.procs:
            stop(proc)


def test_gateways_on_different_nodes_of_a_hub_cluster_take_turns(tmp_path: Path) -> None:
    """The issue's deployment: a 3-node hub, a gateway as a leaf of node 0 and one of node 1 on one
    store root, clients on node 2; each gateway is killed with kill -9 in turn (the first comes
    back as a standby before the second goes). The API answers from every node, nothing
    acknowledged is lost or stored twice, each handover takes under 2 s."""
    hub = HubCluster(tmp_path / "hub")
    hub.start()
    gw = Jetlake(tmp_path)  # the store root and the gateway command; its own server is not started
    gateways: dict[str, Peer] = {}
    try:
        gateways["a"] = Peer(gw, "gateway-a", leaf_url=hub.leaf_url(0))
        wait_log(gateways["a"].log, "owner of the store as epoch 1")
        gateways["b"] = Peer(gw, "gateway-b", leaf_url=hub.leaf_url(1))
        wait_log(gateways["b"].log, "standing by: epoch 1 holds the store")

        def kill_a() -> None:
            stop(gateways["a"].proc, signal.SIGKILL)

        def restart_a_then_kill_b() -> None:
            gateways["a2"] = Peer(gw, "gateway-a2", leaf_url=hub.leaf_url(0))
            wait_log(gateways["a2"].log, "standing by: epoch 2 holds the store")
            stop(gateways["b"].proc, signal.SIGKILL)

        store = StoreRoot(str(gw.data_root))
        gaps = asyncio.run(_kill_under_load(hub.url(2), store, [kill_a, restart_a_then_kill_b]))
        assert "owner of the store as epoch 3" in gateways["a2"].text()
        infos = [asyncio.run(_stream_state(hub.url(node))) for node in range(3)]
        assert infos == [infos[0]] * 3
    finally:
        for peer in gateways.values():
            peer.stop()
        hub.stop()
    print("kill -9 to the next PubAck: " + ", ".join(f"{g:.2f} s" for g in gaps))
    assert max(gaps) < 2.0, gaps


async def _stream_state(url: str) -> tuple[int, int, int]:
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().stream_info("K")
        return info.state.messages, info.state.first_seq, info.state.last_seq
    finally:
        await nc.close()


async def _kill_under_load(
    url: str, root: StoreRoot, kills: list[Callable[[], None]], per_publisher: int = 150, publishers: int = 4
) -> list[float]:
    """Publish ``publishers`` × ``per_publisher`` messages (each retried until acknowledged) while
    a pull consumer acks them; run ``kills`` in turn at even fractions of the acknowledged count.
    Returns, per kill, the time from it to the first PubAck after it."""
    total = per_publisher * publishers
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        await js.add_stream(name="K", subjects=["k.>"], duplicate_window=120)
        sub = await js.pull_subscribe("k.>", "C", stream="K", config=ConsumerConfig(ack_wait=2))
        pub = Publisher(js)
        killed: list[float] = []
        marks = [total * (k + 1) // (len(kills) + 1) for k in range(len(kills))]

        async def publisher(worker: int) -> None:
            for i in range(per_publisher):
                await pub.publish(f"k.{worker}", f"{worker}-{i}")
                if len(killed) < len(kills) and len(pub.acks) >= marks[len(killed)]:
                    kill = kills[len(killed)]
                    killed.append(time.monotonic())  # before the await: one kill per mark
                    await asyncio.to_thread(kill)
                    killed[kills.index(kill)] = time.monotonic()  # the owner is dead from here

        expected = {f"{w}-{i}" for w in range(publishers) for i in range(per_publisher)}
        acker = Acker(js, sub, expected, killed)
        await asyncio.wait_for(
            asyncio.gather(acker.run(total), *(publisher(w) for w in range(publishers))), timeout=180
        )
        info = await js.stream_info("K")
        assert (info.state.messages, info.state.last_seq) == (total, total)
        assert sorted(stored_payloads(root, "K")) == sorted(expected)  # each exactly once
        assert pub.errors == []
        assert not acker.acked_before_kill & set(acker.delivered_after_kill)
        local = root.local_path()
        if local is not None:  # the logs of an object store's tables: tests/test_storage_s3.py
            assert_fenced_logs(Path(local))
        return [min(t for _, t in pub.acks.values() if t > k) - k for k in killed]
    finally:
        await nc.close()
