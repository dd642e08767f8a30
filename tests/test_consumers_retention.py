"""Retention by consumers against the real JetStream and jetlake: work-queue streams (consumer
rules, acked messages gone at once) and interest streams (kept until every interested consumer
acked; nothing kept without interest)."""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.client import Client

from tests.jsapi import api, consumer, publish, pull, same, state, stream

WQ_CONSUMERS: list[tuple[str, dict[str, Any]]] = [
    ("a", {"filter_subject": "{s}.s0"}),  # fine
    ("b", {}),  # 10099: unfiltered beside a filtered one
    ("c", {"filter_subject": "{s}.s0"}),  # 10100: the same filter again
    ("d", {"filter_subject": "{s}.s1"}),  # fine
    ("e", {"filter_subject": "{s}.>"}),  # 10100: overlaps
    ("f", {"filter_subject": "{s}.s2", "deliver_policy": "new"}),  # 10101
    ("g", {"filter_subject": "{s}.s3", "ack_policy": "none"}),  # 10084: pull without explicit acks
    ("h", {"filter_subject": "{s}.s4", "ack_policy": "all"}),  # 10098
    ("i", {"filter_subject": "{s}.s5", "deliver_subject": "wq.push"}),  # fine: push
]


@pytest.mark.waits
async def test_work_queue(targets: dict[str, str], unique: str) -> None:
    """Work-queue consumer rules, and acked messages (ack, term) leaving the stream at once while
    unacked and nak'd ones stay."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        await stream(nc, name, retention="workqueue")
        await publish(nc, name, 6, subjects=2)
        created = {}
        for cname, cfg in WQ_CONSUMERS:
            filled = {k: v.replace("{s}", s) if isinstance(v, str) else v for k, v in cfg.items()}
            filled.setdefault("ack_policy", "explicit")
            answer = await consumer(nc, name, cname, **filled)
            created[cname] = answer.get("error") or state(answer)
        got = await pull(nc, name, "a", {"batch": 3, "expires": 500_000_000}, 4)
        for seq, body in ((1, b"+ACK"), (3, b"+TERM"), (5, b"-NAK")):
            await nc.request(f"$JS.ACK.{name}.a.1.{seq}.{seq}.0.0", body, timeout=2)
        info = await api(nc, f"STREAM.INFO.{name}")
        gone = await api(nc, f"STREAM.MSG.GET.{name}", {"seq": 1})
        kept = await api(nc, f"STREAM.MSG.GET.{name}", {"seq": 5})
        return {
            "created": created,
            "got": got,
            "state": info["state"],
            "gone": gone.get("error"),
            "kept": kept.get("message", {}).get("seq"),
            "a": state(await api(nc, f"CONSUMER.INFO.{name}.a")),
            "d": state(await api(nc, f"CONSUMER.INFO.{name}.d")),
        }

    out = await same(targets, case, unique)
    assert out["state"]["messages"] == 4


@pytest.mark.waits
@pytest.mark.parametrize("ack_policy", ["explicit", "all"])
async def test_interest(targets: dict[str, str], unique: str, ack_policy: str) -> None:
    """Interest retention: a publish without consumers is acked and not kept; a message stays
    until every consumer whose filter matches it acked it; deleting a consumer releases what only
    it held."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        await stream(nc, name, retention="interest")
        js = nc.jetstream()
        lonely = await js.publish(f"{s}.s0", b"nobody")
        empty = (await api(nc, f"STREAM.INFO.{name}"))["state"]
        await consumer(nc, name, "all", ack_policy=ack_policy)
        await consumer(nc, name, "zero", ack_policy=ack_policy, filter_subject=f"{s}.s0")
        await publish(nc, name, 4, subjects=2)
        await pull(nc, name, "all", {"batch": 4, "expires": 500_000_000}, 5)
        await pull(nc, name, "zero", {"batch": 2, "expires": 500_000_000}, 3)
        for seq in (2, 3, 4, 5):
            await nc.request(f"$JS.ACK.{name}.all.1.{seq}.{seq - 1}.0.0", b"+ACK", timeout=2)
        after_all = (await api(nc, f"STREAM.INFO.{name}"))["state"]
        await nc.request(f"$JS.ACK.{name}.zero.1.2.1.0.0", b"+ACK", timeout=2)
        after_zero = (await api(nc, f"STREAM.INFO.{name}"))["state"]
        await api(nc, f"CONSUMER.DELETE.{name}.zero")
        after_delete = (await api(nc, f"STREAM.INFO.{name}"))["state"]
        return {
            "lonely": lonely.seq,
            "empty": empty,
            "after_all": after_all,
            "after_zero": after_zero,
            "after_delete": after_delete,
        }

    out = await same(targets, case, unique)
    assert out["empty"]["messages"] == 0


async def test_interest_ack_none_lets_go_once_delivered(targets: dict[str, str], unique: str) -> None:
    """On an interest stream a consumer with ``ack_policy: none`` stops holding a message when it
    delivers it: one only it wanted is gone at once, one another consumer wants stays for its ack."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        await stream(nc, name, retention="interest")
        await consumer(nc, name, "none", ack_policy="none")
        await consumer(nc, name, "odd", ack_policy="explicit", filter_subject=f"{s}.s1")
        await publish(nc, name, 4, subjects=2)
        await pull(nc, name, "none", {"batch": 3, "expires": 500_000_000}, 3)
        delivered = (await api(nc, f"STREAM.INFO.{name}"))["state"]
        await pull(nc, name, "odd", {"batch": 1, "expires": 500_000_000}, 1)
        await nc.request(f"$JS.ACK.{name}.odd.1.2.1.0.0", b"+ACK", timeout=2)
        acked = (await api(nc, f"STREAM.INFO.{name}"))["state"]
        return {"delivered": delivered, "acked": acked}

    out = await same(targets, case, unique)
    assert (out["delivered"]["first_seq"], out["delivered"]["messages"]) == (2, 2)
    assert (out["acked"]["first_seq"], out["acked"]["messages"]) == (4, 1)
