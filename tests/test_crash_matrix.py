"""Crash matrix: ``kill -9`` of the gateway at seeded random moments of a mixed publish/consume load.

Each trial runs several nats-py publishers, each giving every message a ``Nats-Msg-Id`` and retrying
it (on time-out, no responders or any error) until a PubAck comes back, and one pull consumer that
acks most deliveries with ``ack_sync``. A thread kills the gateway with SIGKILL at a random moment
and starts it again; the load carries on through the outage and stops a little later. Then
everything left is drained and the stored table is read back with DuckDB. Per trial:

- every PubAck'd message is stored, under the sequence its PubAck named;
- no message is stored twice: a retry of a message whose PubAck the kill swallowed gets the
  original sequence back (``duplicate``), because the gateway rebuilds its duplicate window from
  the stored tail;
- stored sequences are contiguous from 1;
- no message whose ``ack_sync`` returned is ever delivered again;
- every message delivered but not acked before the kill is delivered again after it, and in the
  end every message is acknowledged (ack floor = last sequence, nothing pending).

``TRIALS`` trials, one pytest case each (``trial-N``), about 12-20 s each on a busy 2-core machine:
6 in CI, ``JETLAKE_CRASH_TRIALS`` outside it (``make crash-matrix`` runs 100). Each trial prints its
figures; the module prints the totals (trials, acknowledged, lost, duplicates stored, time) at its end.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from tests.differential import api
from tests.harness import Jetlake, duckdb_connection

#: ``alone``: kill -9 trials under sync publishing; a neighbour's fsyncs would stretch their waits.
pytestmark = pytest.mark.alone

STREAM = "MATRIX"
TRIALS = int(os.environ.get("JETLAKE_CRASH_TRIALS", "6"))
PUBLISHERS = 4
GATEWAY_ENV = {"JETLAKE_ACK_FLUSH_INTERVAL_MS": "50"}


@dataclass
class Totals:
    """The module's figures over its trials, printed at its end (the report ``make crash-matrix`` gives)."""

    trials: int = 0
    acked: int = 0
    lost: int = 0  # PubAck'd messages not stored under their PubAck's sequence
    stored_twice: int = 0  # messages stored more than once
    began: float = field(default_factory=time.monotonic)


TOTALS = Totals()


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    """Prints the totals once every trial has run (``-s`` shows them)."""
    yield
    print(
        f"crash matrix: {TOTALS.trials} trials, {TOTALS.acked} acknowledged messages, "
        f"{TOTALS.lost} lost, {TOTALS.stored_twice} stored twice, "
        f"{time.monotonic() - TOTALS.began:.0f} s"
    )


@dataclass
class Seen:
    """What the clients saw; times are ``time.monotonic()`` of the test process."""

    acked: dict[str, int] = field(default_factory=dict)  # msg id -> PubAck seq
    duplicates: int = 0  # PubAcks that said ``duplicate`` (a retry of something already stored)
    retries: int = 0  # publish attempts that failed and were retried
    deliveries: dict[int, list[float]] = field(default_factory=dict)  # seq -> delivery times
    synced: dict[int, float] = field(default_factory=dict)  # seq -> when its ack_sync returned
    # ack_sync failed: the ack may still have been committed, so a redelivery is not required
    ack_failed: set[int] = field(default_factory=set)
    violations: list[int] = field(default_factory=list)  # delivered after its ack_sync returned
    started: float = field(default_factory=time.monotonic)
    killed_at: float = 0.0  # SIGKILL sent
    dead_at: float = 0.0  # the process is gone: nothing it answers arrives after this
    restarted_at: float = 0.0


class Killer(threading.Thread):
    """Kills the gateway at ``at`` seconds, then starts it again (``start_gateway`` waits for it)."""

    def __init__(self, gw: Jetlake, at: float, seen: Seen) -> None:
        super().__init__()
        self.gw, self.at, self.seen = gw, at, seen
        self.error: BaseException | None = None

    def run(self) -> None:
        time.sleep(self.at)
        self.seen.killed_at = time.monotonic()
        self.gw.kill_gateway()
        self.seen.dead_at = time.monotonic()
        try:
            self.gw.start_gateway(GATEWAY_ENV)
            self.seen.restarted_at = time.monotonic()
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc


async def publisher(nc: Client, worker: int, stop: asyncio.Event, seen: Seen) -> None:
    """Publishes ``worker-i`` until told to stop; each message retried until acked."""
    js = nc.jetstream()
    i = 0
    while not stop.is_set():
        msg_id = f"{worker}-{i}"
        while True:
            try:
                ack = await js.publish(
                    f"matrix.{worker}", msg_id.encode(), timeout=1, headers={"Nats-Msg-Id": msg_id}
                )
                break
            except Exception:
                seen.retries += 1
                await asyncio.sleep(0.05)
        seen.acked[msg_id] = ack.seq
        seen.duplicates += bool(ack.duplicate)
        i += 1


def deliver(m: Msg, seen: Seen) -> int:
    seq = m.metadata.sequence.stream
    if seq in seen.synced:
        seen.violations.append(seq)
    seen.deliveries.setdefault(seq, []).append(time.monotonic())
    return seq


async def ack(m: Msg, seq: int, seen: Seen) -> None:
    try:
        await m.ack_sync(timeout=2)
    except Exception:
        seen.ack_failed.add(seq)
        return
    seen.synced[seq] = time.monotonic()


async def consumer(nc: Client, stop: asyncio.Event, seen: Seen, rng: random.Random) -> None:
    """Fetches and acks about four in five deliveries with ``ack_sync``; the rest wait for ack_wait."""
    sub = await nc.jetstream().pull_subscribe_bind("WORK", STREAM)
    while not stop.is_set():
        try:
            msgs = await sub.fetch(25, timeout=0.5)
        except Exception:
            await asyncio.sleep(0.05)
            continue
        seqs = [deliver(m, seen) for m in msgs]
        await asyncio.gather(
            *(ack(m, s, seen) for m, s in zip(msgs, seqs, strict=True) if rng.random() < 0.8)
        )


async def drain(nc: Client, seen: Seen) -> dict[str, Any]:
    """Consumes and acks everything still pending (redeliveries after ack_wait included)."""
    sub = await nc.jetstream().pull_subscribe_bind("WORK", STREAM)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        info = await api(nc, f"CONSUMER.INFO.{STREAM}.WORK")
        if info["num_pending"] == 0 and info["num_ack_pending"] == 0:
            return info
        try:
            msgs = await sub.fetch(100, timeout=0.5)
        except Exception:
            continue
        await asyncio.gather(*(ack(m, deliver(m, seen), seen) for m in msgs))
    raise AssertionError(f"consumer not drained: {info}")


async def create_work(nc: Client) -> None:
    """The stream the load publishes to and the pull consumer that works it off (ack wait 1 s)."""
    await api(nc, f"STREAM.CREATE.{STREAM}", {"name": STREAM, "subjects": ["matrix.>"]})
    cfg = {"durable_name": "WORK", "ack_policy": "explicit", "ack_wait": 1_000_000_000}
    await api(nc, f"CONSUMER.CREATE.{STREAM}.WORK", {"stream_name": STREAM, "config": cfg})


async def run_trial(gw: Jetlake, rng: random.Random) -> tuple[Seen, dict[str, Any]]:
    nc = await nats.connect(gw.url, max_reconnect_attempts=-1)
    try:
        await create_work(nc)
        seen = Seen()
        stop = asyncio.Event()
        killer = Killer(gw, rng.uniform(0.2, 3.0), seen)
        tasks = [asyncio.create_task(publisher(nc, w, stop, seen)) for w in range(PUBLISHERS)]
        tasks.append(asyncio.create_task(consumer(nc, stop, seen, rng)))
        killer.start()
        await asyncio.to_thread(killer.join)
        await asyncio.sleep(rng.uniform(0.5, 1.5))  # load on the restarted gateway
        stop.set()
        await asyncio.gather(*tasks)
        if killer.error:
            raise killer.error
        return seen, await drain(nc, seen)
    finally:
        await nc.close()


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(TRIALS), ids=lambda t: f"trial-{t}")
def test_kill_9_under_mixed_load(tmp_path: Path, trial: int) -> None:
    rng = random.Random(9000 + trial)
    gw = Jetlake(tmp_path)
    gw.start_server()
    try:
        gw.start_gateway(GATEWAY_ENV)
        seen, info = asyncio.run(run_trial(gw, rng))
        rows = (
            duckdb_connection()
            .execute(
                "SELECT seq, data FROM delta_scan(?) WHERE stream = ? ORDER BY seq",
                [str(gw.data_root / "messages"), STREAM],
            )
            .fetchall()
        )
        stored = {seq: bytes(data).decode() for seq, data in rows}
        seqs = [seq for seq, _ in rows]
        redeliveries = sum(len(d) for d in seen.deliveries.values()) - len(seqs)
        print(
            f"trial {trial + 1}/{TRIALS}: killed after {seen.killed_at - seen.started:.2f} s, back "
            f"{seen.restarted_at - seen.killed_at:.1f} s later, {len(seen.acked)} acked, "
            f"{len(seqs)} stored, {seen.retries} publish retries, {seen.duplicates} duplicate "
            f"PubAcks, {len(seen.ack_failed)} failed ack_syncs, {redeliveries} redeliveries"
        )
        TOTALS.trials += 1
        TOTALS.acked += len(seen.acked)
        TOTALS.lost += sum(stored.get(seq) != msg_id for msg_id, seq in seen.acked.items())
        TOTALS.stored_twice += len(seqs) - len(set(stored.values()))
        assert seen.acked, "nothing published"
        # contiguous; every PubAck'd message stored under its PubAck's sequence; none stored twice
        assert seqs == list(range(1, len(seqs) + 1))
        assert {msg_id: stored.get(seq) for msg_id, seq in seen.acked.items()} == {
            msg_id: msg_id for msg_id in seen.acked
        }
        assert sorted(stored.values()) == sorted(seen.acked)
        # nothing acked with ack_sync came back; everything seen unacked at the kill came back
        assert seen.violations == []
        unacked_at_kill = {
            seq
            for seq, times in seen.deliveries.items()
            if times[0] < seen.killed_at
            and seen.synced.get(seq, float("inf")) > seen.dead_at
            and seq not in seen.ack_failed
        }
        assert unacked_at_kill, "no delivery was left unacked at the kill"
        for seq in unacked_at_kill:
            assert any(t > seen.killed_at for t in seen.deliveries[seq]), (
                seq,
                seen.killed_at,
                seen.dead_at,
                seen.deliveries[seq],
                seen.synced.get(seq),
            )
        # in the end everything was acknowledged: by an ack_sync that returned, or by one whose
        # answer was lost (to the kill or a time-out) after the ack was committed
        assert set(seen.synced) <= set(seqs)
        assert set(seqs) - set(seen.synced) <= seen.ack_failed
        assert info["ack_floor"]["stream_seq"] == len(seqs)
    finally:
        gw.stop()
