"""Push consumers against the real JetStream and jetlake: delivery to the deliver subject
(only while it has interest), queue groups, headers_only, idle heartbeats, replay original,
rate limits, and nats-py's push subscribe and ordered consumer."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError

from tests.jsapi import api, describe, publish, same, state, stream

S = 1_000_000_000


async def _collect(sub: Any, n: int, wait: float = 3.0) -> list[Any]:
    return [describe(await sub.next_msg(timeout=wait)) for _ in range(n)]


async def test_push_delivers_while_subject_has_interest(targets: dict[str, str], unique: str) -> None:
    """Nothing is delivered while nobody listens on the deliver subject; a subscriber gets
    everything under the stored subjects with the ack tokens; acks move the floor."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await publish(nc, name, 4, subjects=2)
        deliver = f"deliver.{name.lower()}"
        body = {
            "stream_name": name,
            "config": {"durable_name": "p", "ack_policy": "explicit", "deliver_subject": deliver},
        }
        await api(nc, f"CONSUMER.CREATE.{name}.p", body)
        await asyncio.sleep(0.3)
        idle = state(await api(nc, f"CONSUMER.INFO.{name}.p"))
        sub = await nc.subscribe(deliver)
        got = await _collect(sub, 4)
        await publish(nc, name, 1)
        got += await _collect(sub, 1)
        for seq in (1, 2, 5):
            await nc.request(f"$JS.ACK.{name}.p.1.{seq}.{seq}.0.0", b"+ACK", timeout=2)
        return {"idle": idle, "got": got, "info": state(await api(nc, f"CONSUMER.INFO.{name}.p"))}

    out = await same(targets, case, unique)
    assert out["idle"]["delivered"]["consumer_seq"] == 0


async def test_push_bound_only_to_its_exact_subject_and_group(targets: dict[str, str], unique: str) -> None:
    """``push_bound`` (and delivery) needs a subscription on exactly the deliver subject: a plain
    one for a consumer without ``deliver_group``, one in that queue group for a consumer with one
    (bound while any member is left). A wildcard subscription, a queue subscriber of a consumer
    without group and a plain or other-group subscriber of one with a group bind nothing and get
    nothing; the info says so at once in create, INFO and LIST."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        await stream(nc, name)
        await publish(nc, name, 1)

        async def bound(durable: str) -> Any:
            await nc.flush()
            await asyncio.sleep(0.1)  # the server's consumer takes the interest change in its own loop
            return (await api(nc, f"CONSUMER.INFO.{name}.{durable}")).get("push_bound")

        async def nothing(sub: Any) -> bool:
            try:
                await sub.next_msg(timeout=0.5)
            except TimeoutError:
                return True
            return False

        out: dict[str, Any] = {}
        plain, grouped = f"plain.{s}", f"grouped.{s}"
        early = await nc.subscribe(plain)
        cfg: dict[str, Any] = {"durable_name": "p", "ack_policy": "none", "deliver_subject": plain}
        created = await api(nc, f"CONSUMER.CREATE.{name}.p", {"stream_name": name, "config": cfg})
        out["created_with_subscriber"] = created.get("push_bound")
        out["got"] = describe(await early.next_msg(timeout=3))
        await early.unsubscribe()
        out["after_unsubscribe"] = await bound("p")
        for label, sub in (
            ("wildcard", await nc.subscribe("plain.*")),
            ("queue", await nc.subscribe(plain, queue="q")),
        ):
            out[label] = await bound("p")
            await publish(nc, name, 1)
            out[f"{label}_got_nothing"] = await nothing(sub)
            await sub.unsubscribe()
        cfg = {"durable_name": "g", "ack_policy": "none", "deliver_subject": grouped, "deliver_group": "q"}
        created = await api(nc, f"CONSUMER.CREATE.{name}.g", {"stream_name": name, "config": cfg})
        out["group_created"] = created.get("push_bound")
        for label, sub in (
            ("group_plain", await nc.subscribe(grouped)),
            ("group_other", await nc.subscribe(grouped, queue="r")),
        ):
            out[label] = await bound("g")
            out[f"{label}_got_nothing"] = await nothing(sub)
            await sub.unsubscribe()
        members = [await nc.subscribe(grouped, queue="q") for _ in range(2)]
        out["group_two"] = await bound("g")
        await members[0].unsubscribe()
        out["group_one"] = await bound("g")
        listed = (await api(nc, f"CONSUMER.LIST.{name}"))["consumers"]
        out["listed"] = sorted((c["name"], c.get("push_bound")) for c in listed)
        await members[1].unsubscribe()
        out["group_none"] = await bound("g")
        return out

    out = await same(targets, case, unique)
    assert out["created_with_subscriber"] is True
    assert out["group_one"] is True
    assert out["wildcard"] is None
    assert out["wildcard_got_nothing"] is True


async def test_push_queue_group_and_headers_only(targets: dict[str, str], unique: str) -> None:
    """A deliver_group spreads messages over the queue subscribers (together they see each once);
    headers_only sends the headers and Nats-Msg-Size instead of the payload."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        await stream(nc, name)
        for i in range(6):
            await js.publish(f"{name.lower()}.x", f"body{i}".encode(), headers={"K": str(i)})
        deliver = f"group.{name.lower()}"
        cfg = {"durable_name": "g", "ack_policy": "none", "deliver_subject": deliver, "deliver_group": "q"}
        seen: list[Any] = []

        async def on(msg: Any) -> None:
            seen.append(describe(msg))

        subs = [await nc.subscribe(deliver, queue="q", cb=on) for _ in range(2)]
        await api(nc, f"CONSUMER.CREATE.{name}.g", {"stream_name": name, "config": cfg})
        for _ in range(60):
            if len(seen) >= 6:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        for s in subs:
            await s.unsubscribe()
        hdr_sub = await nc.subscribe(f"hdr.{name.lower()}")
        cfg2 = {
            "durable_name": "h",
            "ack_policy": "none",
            "deliver_subject": f"hdr.{name.lower()}",
            "headers_only": True,
        }
        await api(nc, f"CONSUMER.CREATE.{name}.h", {"stream_name": name, "config": cfg2})
        hdrs = await _collect(hdr_sub, 2)
        return {"seen": sorted(seen), "hdrs": hdrs}

    out = await same(targets, case, unique)
    assert len(out["seen"]) >= 6


async def test_push_idle_heartbeat(targets: dict[str, str], unique: str) -> None:
    """An idle push consumer with idle_heartbeat sends 100 Idle Heartbeat with the last sequences."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await publish(nc, name, 2)
        deliver = f"hb.{name.lower()}"
        sub = await nc.subscribe(deliver)
        cfg = {
            "durable_name": "b",
            "ack_policy": "none",
            "deliver_subject": deliver,
            "idle_heartbeat": 300_000_000,
        }
        await api(nc, f"CONSUMER.CREATE.{name}.b", {"stream_name": name, "config": cfg})
        got = await _collect(sub, 3)
        return got

    out = await same(targets, case, unique)
    assert out[2][1] == "100"


@pytest.mark.waits
async def test_push_replay_original_and_rate_limit(targets: dict[str, str], unique: str) -> None:
    """replay_policy original keeps the gaps between stored messages; rate_limit_bps lets a
    burst through at once (the server's limiter has a burst allowance)."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        await stream(nc, name)
        for i in range(3):
            await js.publish(f"{name.lower()}.r", f"{i}".encode())
            await asyncio.sleep(0.5)
        sub = await nc.subscribe(f"replay.{name.lower()}")
        cfg = {
            "durable_name": "r",
            "ack_policy": "none",
            "deliver_subject": f"replay.{name.lower()}",
            "replay_policy": "original",
        }
        start = time.monotonic()
        await api(nc, f"CONSUMER.CREATE.{name}.r", {"stream_name": name, "config": cfg})
        got = await _collect(sub, 3)
        replay_took = time.monotonic() - start
        await js.publish(f"{name.lower()}.big", b"x" * 2000)
        sub2 = await nc.subscribe(f"rate.{name.lower()}")
        cfg2 = {
            "durable_name": "l",
            "ack_policy": "none",
            "deliver_subject": f"rate.{name.lower()}",
            "filter_subject": f"{name.lower()}.big",
            "rate_limit_bps": 8000,
        }
        start = time.monotonic()
        await api(nc, f"CONSUMER.CREATE.{name}.l", {"stream_name": name, "config": cfg2})
        await js.publish(f"{name.lower()}.big", b"y" * 2000)
        rated = await _collect(sub2, 2, wait=5)
        rate_took = time.monotonic() - start
        # Two small messages fit the limiter's burst: they are not held back.
        return {
            "got": got,
            "replay_gaps_kept": replay_took > 0.8,
            "rated": len(rated),
            "burst": rate_took < 1.5,
        }

    out = await same(targets, case, unique)
    assert out["replay_gaps_kept"]


async def test_nats_py_push_and_ordered_consumer(targets: dict[str, str], unique: str) -> None:
    """nats-py's push subscribe (durable, manual acks) and its ordered consumer (ephemeral,
    flow control and heartbeats, ack none) read the whole stream in order."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        await stream(nc, name)
        await publish(nc, name, 30, subjects=3)
        durable = await js.subscribe(f"{name.lower()}.>", durable="push", manual_ack=True)
        got = []
        for _ in range(30):
            m = await durable.next_msg(timeout=3)
            got.append((m.subject, m.data.decode(), m.metadata.sequence.stream, m.metadata.num_pending))
            await m.ack()
        ordered = await js.subscribe(f"{name.lower()}.>", ordered_consumer=True)
        seq = []
        for _ in range(30):
            m = await ordered.next_msg(timeout=3)
            seq.append((m.data.decode(), m.metadata.sequence.stream))
        await publish(nc, name, 2)
        for _ in range(2):
            m = await ordered.next_msg(timeout=3)
            seq.append((m.data.decode(), m.metadata.sequence.stream))
        info = state(await api(nc, f"CONSUMER.INFO.{name}.push"))
        return {"got": got, "ordered": seq, "info": info}

    out = await same(targets, case, unique)
    assert len(out["ordered"]) == 32


async def test_push_flow_control(targets: dict[str, str], unique: str) -> None:
    """flow_control: with ~3 MB to deliver the subscriber gets `100 FlowControl Request`s with a
    `$JS.FC.<stream>.<consumer>.<token>` reply; answering them keeps delivery going to the end.
    (How many requests the server sends depends on its window; the count is not compared.)"""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        await stream(nc, name)
        s = name.lower()
        for start in range(0, 3000, 500):
            await asyncio.gather(*(js.publish(f"{s}.x", b"y" * 1024) for _ in range(start, start + 500)))
        requests: list[str] = []
        got = 0
        done = asyncio.Event()

        async def on(msg: Any) -> None:
            nonlocal got
            if msg.headers and msg.headers.get("Status") == "100":
                if msg.reply:
                    requests.append(msg.reply)
                    await nc.publish(msg.reply, b"")
                return
            got += 1
            if got == 3000:
                done.set()

        await nc.subscribe(f"fc.{s}", cb=on)
        cfg = {
            "durable_name": "f",
            "ack_policy": "none",
            "deliver_subject": f"fc.{s}",
            "flow_control": True,
            "idle_heartbeat": 1_000_000_000,
        }
        await api(nc, f"CONSUMER.CREATE.{name}.f", {"stream_name": name, "config": cfg})
        await asyncio.wait_for(done.wait(), 30)
        prefixes = {r.rsplit(".", 1)[0] for r in requests}
        return {"got": got, "asked": bool(requests), "prefixes": sorted(prefixes)}

    out = await same(targets, case, unique)
    assert out["asked"] is True


async def test_push_flow_control_stalled_heartbeat(targets: dict[str, str], unique: str) -> None:
    """A subscriber that never answers flow control stalls the consumer; its idle heartbeats then
    carry `Nats-Consumer-Stalled` naming the unanswered request's reply subject (the subject's
    random token differs per server, so only its equality to the request's reply is compared)."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        await stream(nc, name)
        s = name.lower()
        for start in range(0, 3000, 500):
            await asyncio.gather(*(js.publish(f"{s}.x", b"y" * 1024) for _ in range(start, start + 500)))
        requests: list[str] = []
        beats: list[dict[str, str]] = []
        stalled = asyncio.Event()

        async def on(msg: Any) -> None:
            if msg.headers and msg.headers.get("Status") == "100":
                if msg.reply:
                    requests.append(msg.reply)  # not answered
                elif requests:
                    beats.append(dict(msg.headers))
                    stalled.set()

        await nc.subscribe(f"st.{s}", cb=on)
        cfg = {
            "durable_name": "f",
            "ack_policy": "none",
            "deliver_subject": f"st.{s}",
            "flow_control": True,
            "idle_heartbeat": 500_000_000,
        }
        await api(nc, f"CONSUMER.CREATE.{name}.f", {"stream_name": name, "config": cfg})
        await asyncio.wait_for(stalled.wait(), 20)
        beat = beats[0]
        return {
            "requests": len(requests),
            "stalled_on_request": beat.get("Nats-Consumer-Stalled") == requests[-1],
            "keys": sorted(beat),
        }

    out = await same(targets, case, unique)
    assert out["stalled_on_request"] is True


@pytest.mark.waits
async def test_ack_policy_flow_control_acks_by_the_answers(targets: dict[str, str], unique: str) -> None:
    """``ack_policy: flow_control`` (2.15): deliveries wait for their ack (no ack wait, nothing is
    redelivered) until the subscriber answers a flow-control request, whose ``Nats-Last-Stream``
    and ``Nats-Last-Consumer`` headers ack everything up to them; a request goes out when
    ``max_ack_pending`` is reached and with each idle heartbeat while messages wait; ``+ACK`` on
    the ack subject hears "no responders"."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await publish(nc, name, 4)
        deliver = f"fc.{name.lower()}"
        seen: list[Any] = []
        requests: asyncio.Queue[str] = asyncio.Queue()

        async def on(msg: Any) -> None:
            if msg.reply.startswith("$JS.FC."):
                seen.append("request")
                requests.put_nowait(msg.reply)
            elif not (msg.headers or {}).get("Status"):
                seen.append(int(msg.reply.split(".")[5]))

        await nc.subscribe(deliver, cb=on)
        cfg = {
            "durable_name": "f",
            "ack_policy": "flow_control",
            "flow_control": True,
            "deliver_subject": deliver,
            "max_ack_pending": 2,
        }
        await api(nc, f"CONSUMER.CREATE.{name}.f", {"stream_name": name, "config": cfg})
        infos = []
        for last in (1, 3, 4):  # at max_ack_pending, again, then with the heartbeat
            reply = await asyncio.wait_for(requests.get(), 3)
            await asyncio.sleep(0.2)
            infos.append(state(await api(nc, f"CONSUMER.INFO.{name}.f")))
            await nc.publish(
                reply, b"", headers={"Nats-Last-Consumer": str(last), "Nats-Last-Stream": str(last)}
            )
            await asyncio.sleep(0.2)
            infos.append(state(await api(nc, f"CONSUMER.INFO.{name}.f")))
        try:
            await nc.request(f"$JS.ACK.{name}.f.1.4.4.0.0", b"+ACK", timeout=2)
            acked = "answered"
        except NoRespondersError:
            acked = "no responders"
        return {"seen": seen, "infos": infos, "acked": acked}

    out = await same(targets, case, unique)
    assert out["seen"] == [1, 2, "request", 3, "request", 4, "request"]
    assert [i["num_ack_pending"] for i in out["infos"]] == [2, 2, 2, 1, 1, 0]
    assert out["acked"] == "no responders"


@pytest.mark.waits
async def test_ephemeral_push_lives_while_bound_and_goes_after_its_threshold(
    targets: dict[str, str], unique: str
) -> None:
    """An ephemeral push consumer lives while a subscriber binds it (a plain one, or one in its
    deliver group), past its inactive_threshold; once none does (never bound, only a wildcard
    subscriber, unsubscribed) it goes after the threshold, and not before."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        await stream(nc, name)
        subs = {
            "kept": await nc.subscribe(f"kept.{s}"),
            "grouped": await nc.subscribe(f"grouped.{s}", queue="q"),
            "wildcard": await nc.subscribe("wildcard.*"),
            "gone": await nc.subscribe(f"gone.{s}"),
        }
        names = {}
        for label in subs:
            cfg = {"ack_policy": "none", "deliver_subject": f"{label}.{s}", "inactive_threshold": S}
            if label == "grouped":
                cfg["deliver_group"] = "q"
            answer = await api(nc, f"CONSUMER.CREATE.{name}", {"stream_name": name, "config": cfg})
            names[label] = answer["name"]
        await subs.pop("gone").unsubscribe()

        async def alive() -> list[str]:
            left = (await api(nc, f"CONSUMER.NAMES.{name}"))["consumers"]
            return sorted(label for label, cname in names.items() if cname in left)

        await asyncio.sleep(0.5)
        out = {"half_threshold": await alive()}
        await asyncio.sleep(1.5)
        out["past_threshold"] = await alive()
        await subs.pop("kept").unsubscribe()
        await asyncio.sleep(0.5)
        out["kept_unsubscribed_half"] = await alive()
        await asyncio.sleep(1.1)
        out["kept_unsubscribed_past"] = await alive()
        for sub in subs.values():
            await sub.unsubscribe()
        return out

    assert await same(targets, case, unique) == {
        "half_threshold": ["gone", "grouped", "kept", "wildcard"],
        "past_threshold": ["grouped", "kept"],
        "kept_unsubscribed_half": ["grouped", "kept"],
        "kept_unsubscribed_past": ["grouped"],
    }
