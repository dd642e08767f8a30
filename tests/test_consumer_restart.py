"""Consumer state across restarts and crashes: the ack log brings every durable consumer back.

A clean restart: each consumer's info is identical to before (jetlake against itself), and the
same sequence against the real JetStream, restarted from its on-disk store, gives the same answers.
``kill -9`` at random moments of a consume-and-ack load: nothing whose ``ack_sync`` returned comes
back, everything else does, delivery counts and ``num_redelivered`` carry on, durable consumers and
their configs survive; ephemeral ones come back and go after their ``inactive_threshold``, as on the
real server with file storage.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from tests.differential import api
from tests.harness import Jetlake, ReferenceJetStream, scrub

STREAM = "RESTART"


# Durable consumers whose state the restart must keep, one per behaviour it pins.
CONSUMERS: dict[str, dict[str, Any]] = {
    # explicit acks with holes in the floor, a nak'd (redelivered) and a terminated message
    "EXPLICIT": {"ack_policy": "explicit"},
    # filtered: num_pending and sequences count only matching messages
    "FILTERED": {"ack_policy": "explicit", "filter_subject": "restart.even"},
    # ack all: one ack moves the floor over everything below it
    "ACKALL": {"ack_policy": "all"},
    # ack none: the floor follows deliveries
    "NOACK": {"ack_policy": "none"},
    # paused until far in the future
    "PAUSED": {"ack_policy": "explicit", "pause_until": "2099-01-01T00:00:00Z"},
    # starts at a sequence
    "FROM": {"ack_policy": "explicit", "deliver_policy": "by_start_sequence", "opt_start_seq": 20},
    # CONSUMER.RESET after some deliveries and acks: it starts again from the reset sequence
    "RESETME": {"ack_policy": "explicit"},
}


async def build_state(nc: Client) -> None:
    """Publish, then drive each consumer to a state with something in every part of it."""
    js = nc.jetstream()
    await js.add_stream(name=STREAM, subjects=["restart.>"])
    for i in range(60):
        await js.publish(f"restart.{'even' if i % 2 == 0 else 'odd'}", f"m{i}".encode())
    for name, cfg in CONSUMERS.items():
        body = {"stream_name": STREAM, "config": {"durable_name": name, **cfg}}
        await api(nc, f"CONSUMER.CREATE.{STREAM}.{name}", body)
    for name in ("EXPLICIT", "FILTERED", "ACKALL", "NOACK", "FROM"):
        sub = await js.pull_subscribe_bind(name, STREAM)
        for i, m in enumerate(await sub.fetch(12, timeout=5)):
            await answer(name, i, m)
        if name in ("EXPLICIT", "FILTERED"):
            # the nak'd message comes back (delivery 2) with the next ones; all stay pending
            await sub.fetch(3, timeout=5)
        await nc.flush()
    await reset_midway(nc)
    await asyncio.sleep(0.3)


async def answer(name: str, i: int, m: Msg) -> None:
    """The i-th message of a consumer's first fetch: the explicit ones leave holes in the floor, a
    nak and a term; ACKALL acks the eighth and with it all before."""
    if name == "ACKALL" and i == 7:
        await m.ack_sync()
    elif name in ("EXPLICIT", "FILTERED", "FROM"):
        if i in (0, 1, 4, 5, 9):
            await m.ack_sync()
        elif i == 2:
            await m.nak()
        elif i == 3:
            await m.term()


async def reset_midway(nc: Client) -> None:
    """RESETME: deliveries and acks, CONSUMER.RESET to sequence 5, then more of both."""
    sub = await nc.jetstream().pull_subscribe_bind("RESETME", STREAM)
    for m in await sub.fetch(8, timeout=5):
        if m.metadata.sequence.stream % 3 == 0:
            await m.ack_sync()
    await api(nc, f"CONSUMER.RESET.{STREAM}.RESETME", {"seq": 5})
    for m in await sub.fetch(4, timeout=5):
        if m.metadata.sequence.stream == 6:
            await m.ack_sync()


async def infos(url: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    try:
        out = {name: await api(nc, f"CONSUMER.INFO.{STREAM}.{name}") for name in CONSUMERS}
        out["_stream"] = (await api(nc, f"STREAM.INFO.{STREAM}"))["state"]
        return out
    finally:
        await nc.close()


async def run_build(url: str) -> None:
    nc = await nats.connect(url)
    try:
        await build_state(nc)
    finally:
        await nc.close()


#: Fields relative to the moment of the answer: its time, and how long a pause still runs.
NOW_RELATIVE = {"ts", "pause_remaining"}


def without_now(answers: dict[str, Any]) -> dict[str, Any]:
    return {k: {f: v for f, v in a.items() if f not in NOW_RELATIVE} for k, a in answers.items()}


def test_clean_restart_keeps_every_consumer_info(tmp_path: Path) -> None:
    gw = Jetlake(tmp_path / "jetlake")
    ref = ReferenceJetStream(tmp_path / "reference")
    gw.start()
    try:
        ref.start()
        asyncio.run(run_build(gw.url))
        asyncio.run(run_build(ref.url))
        before = asyncio.run(infos(gw.url))
        ref_before = asyncio.run(infos(ref.url))
        assert scrub(without_now(before)) == scrub(without_now(ref_before))
        assert before["EXPLICIT"]["num_redelivered"] == 1
        assert before["EXPLICIT"]["ack_floor"]["stream_seq"] == 2
        assert before["EXPLICIT"]["num_ack_pending"] == 8
        assert before["PAUSED"]["config"]["pause_until"] == "2099-01-01T00:00:00Z"

        assert gw.stop_gateway() == 0
        gw.start_gateway()
        ref.stop()
        ref.start()
        after = asyncio.run(infos(gw.url))
        # identical to before, timestamps included (only the answer's own time differs)
        assert without_now(after) == without_now(before)
        # and the same as the real JetStream after its restart
        assert scrub(without_now(after)) == scrub(without_now(asyncio.run(infos(ref.url))))
    finally:
        gw.stop()
        ref.stop()


EPHEMERAL_THRESHOLD_NS = 3_000_000_000


async def ephemerals(url: str) -> dict[str, str]:
    """Ephemeral consumers of a fresh stream, by what they hold: a pull consumer with a message
    delivered and not acked, one whose message was acked, one never used, and a push consumer
    nobody subscribes to; all with a short ``inactive_threshold``."""
    nc = await nats.connect(url)
    try:
        await api(nc, f"STREAM.CREATE.{STREAM}", {"name": STREAM, "subjects": ["restart.>"]})
        for _ in range(3):
            await nc.jetstream().publish("restart.x", b"m")
        names = {}
        for label in ("pending", "acked", "idle", "push"):
            cfg: dict[str, Any] = {"ack_policy": "explicit", "inactive_threshold": EPHEMERAL_THRESHOLD_NS}
            if label == "push":
                cfg["deliver_subject"] = "nobody.listens"
            answer = await api(nc, f"CONSUMER.CREATE.{STREAM}", {"stream_name": STREAM, "config": cfg})
            names[label] = answer["name"]
        for label in ("pending", "acked"):
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
            await nc.publish(
                f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{names[label]}", b'{"batch":1}', reply=inbox
            )
            msg = await sub.next_msg(timeout=3)
            if label == "acked":
                await msg.ack_sync()
        return names
    finally:
        await nc.close()


async def ephemerals_left(url: str, names: dict[str, str], waits: tuple[float, ...]) -> list[list[str]]:
    """Which of ``names`` are left after each of ``waits`` seconds from now."""
    nc = await nats.connect(url)
    try:
        start, out = time.monotonic(), []
        for wait in waits:
            await asyncio.sleep(max(0.0, start + wait - time.monotonic()))
            left = (await api(nc, f"CONSUMER.NAMES.{STREAM}"))["consumers"]
            out.append(sorted(label for label, name in names.items() if name in left))
        return out
    finally:
        await nc.close()


@pytest.mark.waits
def test_ephemeral_consumers_come_back_after_a_restart(tmp_path: Path) -> None:
    """As the real server with file storage: ephemeral consumers come back after a restart and
    go ``inactive_threshold`` after it unless used, but a pull consumer with a message waiting
    for its ack stays until that ack wait (30 s) is over."""
    gw = Jetlake(tmp_path / "jetlake")
    ref = ReferenceJetStream(tmp_path / "reference")
    waits = (0.3, EPHEMERAL_THRESHOLD_NS / 1e9 + 1.5)
    left = {}

    def restart_gateway() -> None:
        assert gw.stop_gateway() == 0
        gw.start_gateway()

    def restart_reference() -> None:
        ref.stop()
        ref.start()

    try:
        for target, server, restart in (
            ("jetlake", gw, restart_gateway),
            ("jetstream", ref, restart_reference),
        ):
            server.start()
            names = asyncio.run(ephemerals(server.url))
            restart()  # each right after its own build: the thresholds run meanwhile
            left[target] = asyncio.run(ephemerals_left(server.url, names, waits))
        assert left["jetlake"] == left["jetstream"] == [["acked", "idle", "pending", "push"], ["pending"]]
    finally:
        gw.stop()
        ref.stop()


# ---- kill -9 during a consume-and-ack load -------------------------------------------------------

MARGIN_S = 3.0  # deliveries older than this at the kill are surely committed (flush is 50 ms)


class Observed:
    """What the client saw before the kill."""

    def __init__(self) -> None:
        self.synced: set[int] = set()  # ack_sync returned
        self.in_flight: set[int] = set()  # ack_sync sent, no answer before the kill
        self.deliveries: dict[int, list[tuple[int, float]]] = {}  # seq -> [(delivery count, when)]


async def consume_until_killed(
    gw: Jetlake, kill_at: float, seed: int
) -> tuple[Observed, float, dict[str, Any]]:
    nc = await nats.connect(gw.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=STREAM, subjects=["restart.>"])
        for chunk in range(0, 400, 50):  # in order, many in flight (each PubAck waits for a commit)
            futs = [
                await js.publish_async(f"restart.{i % 4}", f"m{i}".encode()) for i in range(chunk, chunk + 50)
            ]
            await asyncio.gather(*futs)
        cfg = {
            "durable_name": "WORK",
            "ack_policy": "explicit",
            "ack_wait": 1_500_000_000,
            "max_ack_pending": 100,
        }
        await api(nc, f"CONSUMER.CREATE.{STREAM}.WORK", {"stream_name": STREAM, "config": cfg})
        eph = await api(
            nc, f"CONSUMER.CREATE.{STREAM}", {"stream_name": STREAM, "config": {"ack_policy": "explicit"}}
        )
        config = (await api(nc, f"CONSUMER.INFO.{STREAM}.WORK"))["config"]
        sub = await js.pull_subscribe_bind("WORK", STREAM)
        rng = random.Random(seed)
        seen = Observed()
        start = time.monotonic()
        killer = threading.Timer(kill_at, gw.kill_gateway)
        killer.start()

        async def ack(m: Msg, seq: int) -> None:
            seen.in_flight.add(seq)
            try:
                await m.ack_sync(timeout=2)
            except Exception:
                return
            seen.in_flight.discard(seq)
            seen.synced.add(seq)

        try:
            while time.monotonic() - start < kill_at + 1:
                try:
                    msgs = await sub.fetch(20, timeout=0.5)
                except Exception:
                    await asyncio.sleep(0.05)
                    continue
                acks = []
                for m in msgs:
                    seq = m.metadata.sequence.stream
                    seen.deliveries.setdefault(seq, []).append(
                        (m.metadata.num_delivered, time.monotonic() - start)
                    )
                    # every 13th is never acked before the kill, a fifth of the rest left for redelivery
                    if seq % 13 and rng.random() < 0.8:
                        acks.append(ack(m, seq))
                await asyncio.gather(*acks)
        finally:
            killer.join()
    finally:
        await nc.close()
    return seen, kill_at, {"config": config, "ephemeral": eph["name"]}


async def drain_after_restart(gw: Jetlake, seen: Observed) -> tuple[dict[int, list[int]], dict[str, Any]]:
    """Consume everything that comes back, acking each; the first info is taken before any fetch."""
    nc = await nats.connect(gw.url)
    after: dict[int, list[int]] = {}
    try:
        first = await api(nc, f"CONSUMER.INFO.{STREAM}.WORK")
        js = nc.jetstream()
        sub = await js.pull_subscribe_bind("WORK", STREAM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            info = await api(nc, f"CONSUMER.INFO.{STREAM}.WORK")
            if info["num_pending"] == 0 and info["num_ack_pending"] == 0:
                break
            try:
                msgs = await sub.fetch(50, timeout=0.5)
            except Exception:
                continue
            for m in msgs:
                after.setdefault(m.metadata.sequence.stream, []).append(m.metadata.num_delivered)
            await asyncio.gather(*(m.ack_sync(timeout=5) for m in msgs))
        first["_final"] = await api(nc, f"CONSUMER.INFO.{STREAM}.WORK")
        return after, first
    finally:
        await nc.close()


async def ephemeral_gone(gw: Jetlake, name: str) -> dict[str, Any]:
    nc = await nats.connect(gw.url)
    try:
        return await api(nc, f"CONSUMER.INFO.{STREAM}.{name}")
    finally:
        await nc.close()


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(3))
def test_kill_9_keeps_acked_acked_and_redelivers_the_rest(tmp_path: Path, trial: int) -> None:
    gw = Jetlake(tmp_path)
    gw.start_server()
    try:
        gw.start_gateway({"JETLAKE_ACK_FLUSH_INTERVAL_MS": "50"})
        kill_at = random.Random(100 + trial).uniform(4.0, 7.0)
        seen, kill_at, before = asyncio.run(consume_until_killed(gw, kill_at, trial))
        assert seen.synced, "no ack_sync returned before the kill"
        gw.start_gateway({"JETLAKE_ACK_FLUSH_INTERVAL_MS": "50"})
        after, info = asyncio.run(drain_after_restart(gw, seen))

        # no message whose ack_sync returned is delivered again
        assert not seen.synced & set(after)
        # every message not acked is delivered again (or for the first time)
        assert set(range(1, 401)) - seen.synced - seen.in_flight <= set(after)
        assert info["_final"]["ack_floor"]["stream_seq"] == 400
        # delivery counts carry on: a message seen (unacked) long enough before the kill comes back
        # with a higher count than the client saw
        old = {
            seq: max(dc for dc, when in ds if when < kill_at - MARGIN_S)
            for seq, ds in seen.deliveries.items()
            if seq not in seen.synced | seen.in_flight and any(when < kill_at - MARGIN_S for _, when in ds)
        }
        assert old, "no unacked delivery old enough to check"
        for seq, dc in old.items():
            assert after[seq][0] > dc, (seq, dc, after[seq])
        # num_redelivered carries on: messages seen redelivered long before the kill still count
        redelivered_old = {s for s, dc in old.items() if dc > 1}
        assert info["num_redelivered"] >= len(redelivered_old)
        assert info["delivered"]["consumer_seq"] >= sum(
            1 for ds in seen.deliveries.values() for _, when in ds if when < kill_at - MARGIN_S
        )
        # the durable consumer and its config survive; the ephemeral one came back and goes
        # after its inactive_threshold (5 s), unused
        assert info["config"] == before["config"]
        time.sleep(6)
        gone = asyncio.run(ephemeral_gone(gw, before["ephemeral"]))
        assert gone["error"]["err_code"] == 10014
    finally:
        gw.stop()


def newest_version(log: Path) -> int:
    return max(int(p.stem) for p in log.glob("*.json"))


async def define_then_change(url: str, acks_log: Path) -> tuple[int, dict[str, Any]]:
    """A stream of three subjects, consumer ``U`` created and its first message acked; then, after
    the ack log's newest version so far (returned), ``U`` updated, ``LAST`` created with
    ``last_per_subject``, ``U`` paused."""
    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(name=STREAM, subjects=["restart.>"])
        for i in range(9):
            await nc.jetstream().publish(f"restart.s{i % 3}", f"m{i}".encode())
        base = {"durable_name": "U", "ack_policy": "explicit", "max_deliver": 5}
        await api(nc, f"CONSUMER.CREATE.{STREAM}.U", {"stream_name": STREAM, "config": base})
        sub = await nc.jetstream().pull_subscribe_bind("U", STREAM)
        for m in await sub.fetch(1, timeout=5):
            await m.ack_sync()  # durable, and with it U's create row before it
        cut = await asyncio.to_thread(newest_version, acks_log)
        changed = {"stream_name": STREAM, "config": {**base, "max_deliver": 7}}
        assert "error" not in await api(nc, f"CONSUMER.CREATE.{STREAM}.U", changed)
        last = {
            "durable_name": "LAST",
            "ack_policy": "explicit",
            "deliver_policy": "last_per_subject",
            "filter_subject": "restart.>",
        }
        created = await api(nc, f"CONSUMER.CREATE.{STREAM}.LAST", {"stream_name": STREAM, "config": last})
        assert "error" not in created
        paused = await api(nc, f"CONSUMER.PAUSE.{STREAM}.U", {"pause_until": "2099-01-01T00:00:00Z"})
        assert paused["paused"] is True
        return cut, await api(nc, f"CONSUMER.INFO.{STREAM}.U")
    finally:
        await nc.close()


async def info_and_last(url: str, name: str) -> tuple[dict[str, Any], list[int]]:
    """Consumer ``name``'s info, and the stream sequences ``LAST`` delivers (none: [])."""
    nc = await nats.connect(url)
    try:
        info = await api(nc, f"CONSUMER.INFO.{STREAM}.{name}")
        sub = await nc.jetstream().pull_subscribe_bind("LAST", STREAM)
        try:
            return info, [m.metadata.sequence.stream for m in await sub.fetch(11, timeout=2)]
        except nats.errors.TimeoutError:
            return info, []
    finally:
        await nc.close()


def test_kill_9_before_the_ack_log_holds_a_create_or_an_update(tmp_path: Path) -> None:
    """A consumer create or update is one durable commit, the catalog's; the ack log's create and
    config rows follow unawaited (#23). ``kill -9`` after the answers, with the ack log's commits
    of those rows cut off (as when they had not landed): the restart gives each consumer what its
    answer said, the updated and paused config, and ``last_per_subject``'s start (the last message
    of each subject, not every message)."""
    gw = Jetlake(tmp_path)
    gw.start()
    try:
        acks_log = gw.data_root / "acks" / "_delta_log"
        cut, before = asyncio.run(define_then_change(gw.url, acks_log))
        gw.kill_gateway()
        for entry in acks_log.glob("*.json"):  # whichever of them landed before the kill
            if int(entry.stem) > cut:
                entry.unlink()
        gw.start_gateway()
        info, delivered = asyncio.run(info_and_last(gw.url, "U"))
        assert info["config"] == before["config"]
        assert info["config"]["max_deliver"] == 7
        assert info["paused"] is True
        assert delivered == [7, 8, 9]
    finally:
        gw.stop()


async def create_then_update_at_once(url: str) -> dict[str, Any]:
    """``LAST`` (``last_per_subject``, whose messages are 8, 9 and 11, not a run) created and,
    right after its answer, updated."""
    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(name=STREAM, subjects=["restart.>"])
        for i in range(11):
            await nc.jetstream().publish(f"restart.s{i % 3 if i < 9 else 0}", f"m{i}".encode())
        cfg = {
            "durable_name": "LAST",
            "ack_policy": "explicit",
            "deliver_policy": "last_per_subject",
            "filter_subject": "restart.>",
        }
        for config in (cfg, {**cfg, "max_deliver": 7}):
            body = {"stream_name": STREAM, "config": config}
            answer = await api(nc, f"CONSUMER.CREATE.{STREAM}.LAST", body)
            assert "error" not in answer
        return answer
    finally:
        await nc.close()


def test_kill_9_after_an_update_that_came_right_after_the_create(tmp_path: Path) -> None:
    """The update's catalog entry replaces the create's, whose start (``last_per_subject``'s
    sequences) a restart needs while the ack log lacks the create row: the update waits for that
    row first. With rows otherwise left to a 60 s flush, ``kill -9`` after the update's answer:
    the consumer comes back updated and at its start (the last message of each subject)."""
    gw = Jetlake(tmp_path)
    gw.gateway_env["JETLAKE_ACK_FLUSH_INTERVAL_MS"] = "60000"
    gw.start()
    try:
        before = asyncio.run(create_then_update_at_once(gw.url))
        gw.kill_gateway()
        gw.start_gateway()
        info, delivered = asyncio.run(info_and_last(gw.url, "LAST"))
        assert info["config"] == before["config"]
        assert info["config"]["max_deliver"] == 7
        assert delivered == [8, 9, 11]
    finally:
        gw.stop()
