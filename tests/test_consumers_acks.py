"""Acks against the real JetStream and jetlake: every kind, double acks, ack policies, ack_wait,
max_deliver with its advisory, nak delay, backoff, max_ack_pending, ack samples, and the seed
walkthrough (DISPATCH on ORDERS) number for number. Timing cases use short waits with wide margins."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from tests.jsapi import api, consumer, describe, publish, pull, same, state, stream

S = 1_000_000_000


async def _events(nc: Client, name: str) -> tuple[Any, list[dict[str, Any]]]:
    """Collect the consumer advisories and metrics of stream ``name`` (ids and times dropped)."""
    seen: list[dict[str, Any]] = []

    async def on(msg: Msg) -> None:
        body = json.loads(msg.data)
        if body.get("stream") == name:
            for key in ("id", "timestamp", "ack_time"):
                body.pop(key, None)
            seen.append({"subject": msg.subject, **body})

    sub = await nc.subscribe("$JS.EVENT.>", cb=on)
    return sub, seen


def _advisories(seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The consumer advisories and metrics, in order (the API audit is another issue's)."""
    return [e for e in seen if ".API" not in e["subject"] and "STREAM." not in e["subject"]]


@pytest.mark.slow
async def test_seed_walkthrough_dispatch_on_orders(targets: dict[str, str], unique: str) -> None:
    """The seed's DISPATCH consumer on ORDERS, step by step: the server's numbers after each
    fetch, ack, unacked fetch and redelivery (docs/wire-notes.md: info shows the last delivered)."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        await stream(nc, name)
        await consumer(nc, name, "DISPATCH", ack_policy="explicit", ack_wait=1_000_000_000)
        sub = await js.pull_subscribe_bind("DISPATCH", name)
        steps: dict[str, Any] = {"empty": state(await api(nc, f"CONSUMER.INFO.{name}.DISPATCH"))}
        await js.publish(f"{name.lower()}.processed", b"order 4")
        (m,) = await sub.fetch(1, timeout=3)
        await m.ack_sync()
        steps["acked"] = state(await api(nc, f"CONSUMER.INFO.{name}.DISPATCH"))
        await js.publish(f"{name.lower()}.processed", b"order 5")
        (m,) = await sub.fetch(1, timeout=3)
        steps["no_ack"] = state(await api(nc, f"CONSUMER.INFO.{name}.DISPATCH"))
        await asyncio.sleep(2.0)  # ack_wait runs out
        (m,) = await sub.fetch(1, timeout=3)
        steps["again"] = (m.data.decode(), m.metadata.num_delivered)
        steps["no_ack_again"] = state(await api(nc, f"CONSUMER.INFO.{name}.DISPATCH"))
        await asyncio.sleep(2.0)
        (m,) = await sub.fetch(1, timeout=3)
        await m.ack_sync()
        steps["finally"] = state(await api(nc, f"CONSUMER.INFO.{name}.DISPATCH"))
        return steps

    out = await same(targets, case, unique)
    assert out["no_ack_again"]["delivered"] == {"consumer_seq": 3, "stream_seq": 2}
    assert out["no_ack_again"]["num_redelivered"] == 1


@pytest.mark.waits
async def test_every_ack_kind(targets: dict[str, str], unique: str) -> None:
    """+ACK, -NAK, +WPI, +TERM with a reason, legacy +OK and an empty body, each sent with a reply
    (all answered); the nak'd message comes back, the termed one does not; advisories for nak and
    term; a second ack of an acked message is still answered."""

    async def case(nc: Client, name: str) -> Any:
        sub_ev, seen = await _events(nc, name)
        await stream(nc, name)
        await publish(nc, name, 7)
        await consumer(nc, name, "k", ack_policy="explicit")
        got = await pull(nc, name, "k", {"batch": 7, "expires": 2_000_000_000}, 8)
        replies = {}
        for body, seq in (
            (b"+ACK", 1),
            (b"-NAK", 2),
            (b"+WPI", 3),
            (b"+TERM too big", 4),
            (b"+OK", 5),
            (b"", 6),
        ):
            token = f"$JS.ACK.{name}.k.1.{seq}.{seq}.0.0"
            reply = await nc.request(token, body, timeout=2)
            replies[body.decode() or "empty"] = reply.data.decode()
        again = await nc.request(f"$JS.ACK.{name}.k.1.1.1.0.0", b"+ACK", timeout=2)
        info = state(await api(nc, f"CONSUMER.INFO.{name}.k"))
        redelivered = await pull(nc, name, "k", {"batch": 5, "expires": 1_000_000_000}, 6)
        after = state(await api(nc, f"CONSUMER.INFO.{name}.k"))
        await asyncio.sleep(0.3)
        await sub_ev.unsubscribe()
        return {
            "got": got,
            "replies": replies,
            "again": again.data.decode(),
            "info": info,
            "redelivered": redelivered,
            "after": after,
            "events": _advisories(seen),
        }

    out = await same(targets, case, unique)
    assert out["info"]["num_ack_pending"] == 3
    kinds = [e["type"].rsplit(".", 1)[1] for e in out["events"]]
    assert kinds == ["consumer_action", "nak", "terminated"], kinds
    assert out["events"][2]["reason"] == "too big"


@pytest.mark.waits
async def test_ack_policy_all_and_none(targets: dict[str, str], unique: str) -> None:
    """Ack all: acking the 3rd of 5 acks 1-3 and moves the floor there; an older ack then changes
    nothing. Ack none: delivery moves the floor, nothing is pending."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await publish(nc, name, 5)
        await consumer(nc, name, "all", ack_policy="all")
        await consumer(nc, name, "none", ack_policy="none")
        got_all = await pull(nc, name, "all", {"batch": 5, "expires": 1_000_000_000}, 6)
        await nc.request(f"$JS.ACK.{name}.all.1.3.3.0.2", b"+ACK", timeout=2)
        mid = state(await api(nc, f"CONSUMER.INFO.{name}.all"))
        await nc.request(f"$JS.ACK.{name}.all.1.2.2.0.3", b"+ACK", timeout=2)
        late = state(await api(nc, f"CONSUMER.INFO.{name}.all"))
        got_none = await pull(nc, name, "none", {"batch": 3, "expires": 1_000_000_000}, 3)
        none = state(await api(nc, f"CONSUMER.INFO.{name}.none"))
        return {"got_all": got_all, "mid": mid, "late": late, "got_none": got_none, "none": none}

    out = await same(targets, case, unique)
    assert out["mid"]["ack_floor"] == {"consumer_seq": 3, "stream_seq": 3}


async def test_term_advised_and_acks_answered_as_by_the_server(targets: dict[str, str], unique: str) -> None:
    """Every +TERM is advised with the numbers of its token, whatever it changed (an acked
    message, a second term, a message not yet delivered, an ack-all consumer's floor). An ack or
    term of a message above the last delivered one is not answered (the server ignores it; a nak
    or +WPI is answered); the acks of a consumer that takes none (ack none) or does not exist
    hear "no responders" naming the ack subject, and change nothing."""

    async def case(nc: Client, name: str) -> Any:
        sub_ev, seen = await _events(nc, name)
        await stream(nc, name)
        await publish(nc, name, 6)
        for c, policy, n in (("t", "explicit", 4), ("n", "none", 2), ("a", "all", 3)):
            await consumer(nc, name, c, ack_policy=policy)
            await pull(nc, name, c, {"batch": n, "expires": 500_000_000}, n)

        def token(c: str, seq: int, deliveries: int = 1) -> str:
            return f"$JS.ACK.{name}.{c}.{deliveries}.{seq}.{seq}.0.0"

        answered = []
        for subject, body in (
            (token("t", 1), b"+ACK"),
            (token("t", 1), b"+TERM after ack"),
            (token("t", 2), b"+TERM"),
            (token("t", 2, 3), b"+TERM again"),
            (token("t", 5), b"-NAK"),
            (token("t", 5), b"+WPI"),
            (token("a", 2), b"+ACK"),
            (token("a", 1), b"+TERM"),
        ):
            answered.append((await nc.request(subject, body, timeout=2)).data.decode())
        inbox = nc.new_inbox()
        quiet = await nc.subscribe(inbox)
        for subject, body in (
            (token("t", 6), b"+TERM"),
            (token("t", 9), b"+TERM"),
            (token("t", 5), b"+ACK"),
            (token("t", 5), b""),
            (token("a", 5), b"+ACK"),
            (token("n", 1), b"+ACK"),
            (token("n", 1), b"+TERM"),
            (token("zz", 1), b"-NAK"),
        ):
            await nc.publish(subject, body, reply=inbox)
        heard = []
        try:
            while True:
                msg = await quiet.next_msg(timeout=0.5)
                heard.append(describe(msg))
        except TimeoutError:
            pass
        infos = {c: state(await api(nc, f"CONSUMER.INFO.{name}.{c}")) for c in ("t", "n", "a")}
        await asyncio.sleep(0.3)
        await sub_ev.unsubscribe()
        events = [
            (
                e["type"].rsplit(".", 1)[1],
                e.get("consumer"),
                e.get("stream_seq"),
                e.get("deliveries"),
                e.get("reason"),
            )
            for e in _advisories(seen)
            if "consumer_action" not in e["type"]
        ]
        return {"answered": answered, "heard": heard, "infos": infos, "events": events}

    out = await same(targets, case, unique)
    assert [status[1] for status in out["heard"]] == ["503", "503", "503"]
    assert [e[2] for e in out["events"]] == [1, 2, 2, 1, 6, 9]


async def test_nak_places_the_message_as_the_server_does(targets: dict[str, str], unique: str) -> None:
    """A plain -NAK queues its message for redelivery ahead of new messages, behind those nak'd
    before it, also on a consumer with a backoff (which holds back only ack-wait redeliveries);
    a -NAK with a delay takes a message already queued off the queue until the delay is over."""

    def order(got: list[Any]) -> list[Any]:
        return [(m[4], m[3]) if m[0] == "msg" else m[:2] for m in got]  # (stream seq, deliveries)

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await publish(nc, name, 8)
        batch = {"batch": 4, "expires": 500_000_000}
        await consumer(nc, name, "q", ack_policy="explicit")
        first = await pull(nc, name, "q", batch, 4)
        for seq, body in ((3, b"-NAK"), (1, b"-NAK"), (2, b"+ACK"), (4, b"+ACK")):
            await nc.request(f"$JS.ACK.{name}.q.1.{seq}.{seq}.0.0", body, timeout=2)
        queued = await pull(nc, name, "q", batch, 4)
        await consumer(nc, name, "b", ack_policy="explicit", backoff=[5 * S, 10 * S], max_deliver=3)
        backoff = await pull(nc, name, "b", {"batch": 1}, 1)
        await nc.request(f"$JS.ACK.{name}.b.1.1.1.0.0", b"-NAK", timeout=2)
        backoff += await pull(nc, name, "b", {"batch": 1}, 1)
        await consumer(nc, name, "d", ack_policy="explicit")
        delayed = await pull(nc, name, "d", {"batch": 2}, 2)
        await nc.request(f"$JS.ACK.{name}.d.1.1.1.0.0", b"-NAK", timeout=2)
        await nc.request(f"$JS.ACK.{name}.d.1.1.1.0.0", b'-NAK {"delay": 5000000000}', timeout=2)
        delayed += await pull(nc, name, "d", {"batch": 2}, 2)
        return {
            "queued": order(first + queued),
            "backoff": order(backoff),
            "delayed": order(delayed),
        }

    out = await same(targets, case, unique)
    assert [seq for seq, _ in out["queued"]] == ["1", "2", "3", "4", "3", "1", "5", "6"]
    assert out["backoff"] == [("1", "1"), ("1", "2")]
    assert out["delayed"] == [("1", "1"), ("2", "1"), ("3", "1"), ("4", "1")]


@pytest.mark.slow
async def test_ack_wait_max_deliver_advisory(targets: dict[str, str], unique: str) -> None:
    """Unacked messages come back after ack_wait with a higher delivery count; after max_deliver
    they leave pending (the floor stays) and MAX_DELIVERIES is published."""

    async def case(nc: Client, name: str) -> Any:
        sub_ev, seen = await _events(nc, name)
        await stream(nc, name)
        await publish(nc, name, 2)
        await consumer(nc, name, "w", ack_policy="explicit", ack_wait=600_000_000, max_deliver=2)
        rounds = []
        for _ in range(3):
            rounds.append(await pull(nc, name, "w", {"batch": 5, "expires": 400_000_000}, 6, wait=1.5))
            await asyncio.sleep(1.0)
        # The server settles exhausted messages lazily (on its pending timer or the next request):
        # compare once both have settled.
        await pull(nc, name, "w", {"batch": 5, "expires": 400_000_000}, 6, wait=1.5)
        await asyncio.sleep(1.5)
        info = state(await api(nc, f"CONSUMER.INFO.{name}.w"))
        await sub_ev.unsubscribe()
        return {"rounds": rounds, "info": info, "events": _advisories(seen)}

    out = await same(targets, case, unique)
    assert out["info"]["num_ack_pending"] == 0
    assert [e["stream_seq"] for e in out["events"] if "MAX_DELIVERIES" in e["subject"]] == [1, 2]


@pytest.mark.slow
async def test_nak_delay_and_backoff(targets: dict[str, str], unique: str) -> None:
    """-NAK {"delay"} holds the redelivery back for the delay; with backoff the redeliveries
    follow its steps and max_deliver ends them."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await publish(nc, name, 1)
        await consumer(nc, name, "n", ack_policy="explicit")
        first = await pull(nc, name, "n", {"batch": 1, "expires": 500_000_000}, 1)
        await nc.request(f"$JS.ACK.{name}.n.1.1.1.0.0", b'-NAK {"delay": 1500000000}', timeout=2)
        early = await pull(nc, name, "n", {"batch": 1, "expires": 500_000_000}, 1, wait=1.0)
        await asyncio.sleep(1.5)
        late = await pull(nc, name, "n", {"batch": 1, "expires": 500_000_000}, 1)
        await consumer(
            nc, name, "b", ack_policy="explicit", backoff=[600_000_000, 1_500_000_000], max_deliver=3
        )
        b1 = await pull(nc, name, "b", {"batch": 1, "expires": 200_000_000}, 1)
        b_early = await pull(nc, name, "b", {"batch": 1, "expires": 100_000_000}, 1, wait=0.5)
        await asyncio.sleep(0.8)
        b2 = await pull(nc, name, "b", {"batch": 1, "expires": 200_000_000}, 1)
        b_wait = await pull(nc, name, "b", {"batch": 1, "expires": 500_000_000}, 1, wait=1.0)
        await asyncio.sleep(1.5)
        b3 = await pull(nc, name, "b", {"batch": 1, "expires": 200_000_000}, 1)
        third = state(await api(nc, f"CONSUMER.INFO.{name}.b"))
        await asyncio.sleep(1.8)
        # exhausted: the server settles it on the next request or its timer
        b4 = await pull(nc, name, "b", {"batch": 1, "expires": 300_000_000}, 1)
        await asyncio.sleep(1.0)
        return {
            "first": first,
            "early": early,
            "late": late,
            "b": [b1, b_early, b2, b_wait, b3, b4],
            "third": third,
            "info": state(await api(nc, f"CONSUMER.INFO.{name}.b")),
        }

    out = await same(targets, case, unique)
    assert out["late"][0][0] == "msg"
    assert [r[0][3] if r[0][0] == "msg" else r[0][1] for r in out["b"]] == [
        "1",
        "408",
        "2",
        "408",
        "3",
        "408",
    ]
    assert out["third"]["num_ack_pending"] == 1
    assert out["info"]["num_ack_pending"] == 0


async def test_max_ack_pending_and_samples(targets: dict[str, str], unique: str) -> None:
    """At max_ack_pending delivery stops until an ack frees a slot; sample_freq 100% publishes
    an ack metric for every ack."""

    async def case(nc: Client, name: str) -> Any:
        sub_ev, seen = await _events(nc, name)
        await stream(nc, name)
        await publish(nc, name, 5)
        await consumer(nc, name, "m", ack_policy="explicit", max_ack_pending=2, sample_freq="100%")
        first = await pull(nc, name, "m", {"batch": 5, "expires": 500_000_000}, 6)
        await nc.request(f"$JS.ACK.{name}.m.1.1.1.0.4", b"+ACK", timeout=2)
        second = await pull(nc, name, "m", {"batch": 5, "expires": 500_000_000}, 6)
        info = state(await api(nc, f"CONSUMER.INFO.{name}.m"))
        await asyncio.sleep(0.3)
        await sub_ev.unsubscribe()
        return {"first": first, "second": second, "info": info, "events": _advisories(seen)}

    out = await same(targets, case, unique)
    assert [e["stream_seq"] for e in out["events"] if "METRIC" in e["subject"]] == [1]


async def test_ack_next(targets: dict[str, str], unique: str) -> None:
    """+NXT acks and pulls the next messages to the ack's reply subject (bare count and JSON)."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await publish(nc, name, 4)
        await consumer(nc, name, "x", ack_policy="explicit")
        first = await pull(nc, name, "x", {"batch": 1}, 1)
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish(f"$JS.ACK.{name}.x.1.1.1.0.3", b"+NXT 2", reply=inbox)
        got = [describe(await sub.next_msg(timeout=2)) for _ in range(2)]
        await nc.publish(f"$JS.ACK.{name}.x.1.2.2.0.2", b'+NXT {"batch": 1}', reply=inbox)
        got.append(describe(await sub.next_msg(timeout=2)))
        return {"first": first, "got": got, "info": state(await api(nc, f"CONSUMER.INFO.{name}.x"))}

    await same(targets, case, unique)


async def test_ack_floor_after_redelivered_ack(targets: dict[str, str], unique: str) -> None:
    """A redelivered message keeps its first consumer sequence for the floor: acking it right
    above the floor moves the floor, and a later ack below a redelivered pending message stops
    the floor just under it (not under its new consumer sequence)."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        await stream(nc, name)
        await publish(nc, name, 6)
        await consumer(nc, name, "r", ack_policy="explicit", ack_wait=30_000_000_000)
        sub = await js.pull_subscribe_bind("r", name)
        first = await sub.fetch(6, timeout=3)
        await first[2].nak()
        (again,) = await sub.fetch(1, timeout=3)
        await first[5].nak()
        (later,) = await sub.fetch(1, timeout=3)
        seqs = [m.metadata.sequence for m in (again, later)]
        steps: dict[str, Any] = {"redelivered": [(s.consumer, s.stream) for s in seqs]}
        for label, m in [("1", first[0]), ("2", first[1]), ("3", again), ("5", first[4]), ("4", first[3])]:
            await m.ack_sync()
            steps[label] = state(await api(nc, f"CONSUMER.INFO.{name}.r"))
        await later.ack_sync()
        steps["6"] = state(await api(nc, f"CONSUMER.INFO.{name}.r"))
        return steps

    out = await same(targets, case, unique)
    assert out["3"]["ack_floor"] == {"consumer_seq": 3, "stream_seq": 3}
    assert out["4"]["ack_floor"] == {"consumer_seq": 5, "stream_seq": 5}


async def test_acks_back_to_back(targets: dict[str, str], unique: str) -> None:
    """Acks sent back to back (jetlake gets them in one read of the leaf link and applies the
    plain ones as runs) mixed with every other kind and two consumers, in an order that shows any
    reordering: a nak before an ack is advised, a nak after one does nothing, a duplicate
    changes nothing; ack_syncs sent last are answered; then the redelivery."""

    async def case(nc: Client, name: str) -> Any:
        sub_ev, seen = await _events(nc, name)
        await stream(nc, name)
        await publish(nc, name, 12)
        for c in ("a", "b"):
            await consumer(nc, name, c, ack_policy="explicit")
            await pull(nc, name, c, {"batch": 12, "expires": 2_000_000_000}, 12)

        def ack(c: str, seq: int, body: bytes = b"+ACK") -> tuple[str, bytes]:
            return (f"$JS.ACK.{name}.{c}.1.{seq}.{seq}.0.0", body)

        burst = [
            *(ack("a", s) for s in (1, 2)),
            ack("b", 1),
            ack("a", 3),
            ack("a", 4, b"-NAK"),
            ack("a", 4),
            ack("a", 5),
            ack("a", 5, b"-NAK"),
            *(ack("b", s) for s in (2, 2, 12)),
            ack("a", 6, b"+WPI"),
            ack("a", 7),
            ack("a", 8, b"+TERM"),
            ack("a", 9, b""),
            ack("a", 11, b"-NAK"),
            ack("a", 10),
        ]
        for subject, body in burst:
            await nc.publish(subject, body)
        # ack_sync last on each: the real server answers once the consumer took all before it
        replies = [(await nc.request(*ack(c, s), timeout=2)).data.decode() for c, s in (("b", 3), ("a", 12))]
        infos = {c: state(await api(nc, f"CONSUMER.INFO.{name}.{c}")) for c in ("a", "b")}
        again = await pull(nc, name, "a", {"batch": 3, "expires": 500_000_000}, 4)
        await asyncio.sleep(0.3)
        await sub_ev.unsubscribe()
        events = [(e["type"].rsplit(".", 1)[1], e.get("stream_seq")) for e in _advisories(seen)]
        return {"replies": replies, "infos": infos, "again": again, "events": events}

    out = await same(targets, case, unique)
    assert out["infos"]["a"]["ack_floor"] == {"consumer_seq": 5, "stream_seq": 5}
    assert out["infos"]["b"]["num_ack_pending"] == 8
    # the nak before an ack counts, the one after it does not
    advised = [e for e in out["events"] if e[0] != "consumer_action"]
    assert advised == [("nak", 4), ("terminated", 8), ("nak", 11)]
