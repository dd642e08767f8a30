"""Servers with their HTTP monitors on (jetlake with a monitor token, the real nats-server with
``-m``), HTTP helpers, the ack-floor scenario the monitor, dashboard and notebook tests share, and
a publish-and-consume load the dashboard and Grafana tests watch."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.js.client import JetStreamContext
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import Jetlake, ReferenceJetStream, free_port, serving, wait_port

TOKEN = "monitor-test-token"


class MonitoredJetlake(Jetlake):
    """jetlake whose gateway asks for a monitor token (set through the environment, as documented),
    with more ``JETLAKE_*`` settings when given."""

    def __init__(self, workdir: Path, settings: dict[str, str] | None = None) -> None:
        super().__init__(workdir)
        # every answer reads the tables afresh: what a test just did shows at once
        self.gateway_env = {
            "JETLAKE_MONITOR_TOKEN": TOKEN,
            "JETLAKE_MONITOR_LAKE_REFRESH_MS": "0",
            **(settings or {}),
        }

    def start(self) -> None:
        super().start()
        assert self.gateway is not None
        try:
            wait_port(self.monitor_port, self.gateway)  # uvicorn binds after the API answers
        except BaseException:
            self.stop()
            raise


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MonitoredJetlake]:
    yield from serving(MonitoredJetlake(Path(tmp_path_factory.mktemp("monitored"))))


@pytest.fixture(scope="module")
def monitored_reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceJetStream]:
    """The real JetStream with its HTTP monitor on (its /jsz is the shape jetlake's copies)."""
    yield from serving(
        ReferenceJetStream(Path(tmp_path_factory.mktemp("monitored-reference")), monitor_port=free_port())
    )


def monitor_url(target: ReferenceJetStream | MonitoredJetlake) -> str:
    return f"http://127.0.0.1:{target.monitor_port}"


def http_get(url: str, token: str | None = TOKEN) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as res:
            return res.status, res.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def get_json(url: str, token: str | None = TOKEN) -> Any:
    status, body = http_get(url, token)
    assert status == 200, body
    return json.loads(body)


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus text exposition, by name and labels."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


async def api(nc: Client, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    msg = await nc.request(f"$JS.API.{subject}", json.dumps(body).encode() if body else b"", timeout=5)
    return dict(json.loads(msg.data))


async def ack_floor_scenario(nc: Client, name: str) -> None:
    """A stream of 10 messages on two subjects and two consumers at different points: ``fast`` has
    acked a prefix and holds two unacked; ``slow`` holds one unacked and one redelivered (NAK)."""
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
    for i in range(10):
        await js.publish(f"{name.lower()}.{'a' if i % 3 else 'b'}", f"m{i}".encode() * (i + 1))
    fast = await js.pull_subscribe(f"{name.lower()}.>", durable="fast", stream=name)
    msgs = await fast.fetch(6, timeout=5)
    for m in msgs[:4]:
        await m.ack_sync()
    slow = await js.pull_subscribe(f"{name.lower()}.>", durable="slow", stream=name)
    first = await slow.fetch(2, timeout=5)
    await first[1].ack_sync()
    await nc.request(first[0].reply, b"-NAK", timeout=5)  # answered once the NAK is processed
    again = await slow.fetch(1, timeout=5)
    assert again[0].metadata.num_delivered == 2


@contextlib.asynccontextmanager
async def load(nc: Client, name: str, max_msgs: int = -1) -> AsyncIterator[None]:
    """Publish and consume on a new stream ``name`` (keeping ``max_msgs``) while the block runs: one
    publisher awaiting each PubAck, consumer ``fast`` fetching and acking everything, consumer
    ``slow`` fetching a few at a time and acking none (its lag and ack-pending grow). The tasks end
    with the block."""
    js = nc.jetstream()
    subject = f"{name.lower()}.load"
    await js.add_stream(name=name, subjects=[f"{name.lower()}.>"], max_msgs=max_msgs)
    fast = await js.pull_subscribe(subject, durable="fast", stream=name)
    slow = await js.pull_subscribe(subject, durable="slow", stream=name)

    # Told to stop rather than cancelled: nats-py swallows a cancellation at some of its awaits (a
    # fetch's, a flush's), and a task that went on after it kept the block's exit waiting forever.
    stop = asyncio.Event()

    async def publish() -> None:
        i = 0
        while not stop.is_set():
            await js.publish(subject, b"x" * (64 + i % 64))
            i += 1

    async def consume(sub: JetStreamContext.PullSubscription, batch: int, ack: bool) -> None:
        while not stop.is_set():
            try:
                msgs = await sub.fetch(batch, timeout=1)
            except nats.errors.TimeoutError:
                continue
            if ack:
                for m in msgs:
                    await m.ack()

    tasks = [
        asyncio.create_task(publish()),
        asyncio.create_task(consume(fast, 100, True)),
        asyncio.create_task(consume(slow, 2, False)),
    ]
    try:
        yield
    finally:
        stop.set()
        # each ends within a fetch's timeout or a PubAck's; what failed on the way is not this
        # helper's to judge (the tests look at the numbers)
        await asyncio.gather(*tasks, return_exceptions=True)
