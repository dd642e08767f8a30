"""API answers the compatibility table states, against the real JetStream and jetlake: operations
only a cluster or the system account performs, and the stream's `max_consumers` limit."""

from __future__ import annotations

import asyncio
from typing import Any

from nats.aio.client import Client

from tests.jsapi import api, same, stream


async def answer(nc: Client, subject: str, body: bytes) -> Any:
    """The API's answer, or "silent" when none comes within a second."""
    try:
        return await asyncio.wait_for(api(nc, subject, body), 1)
    except TimeoutError:
        return "silent"


async def test_clustered_only_operations(targets: dict[str, str], unique: str) -> None:
    """A single server answers leader step-downs, peer removal, evacuation and move cancelling
    with 503/10010 whatever the stream or consumer (existing or not) and the body; a subject with
    a token too many or too few gets no answer."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await api(nc, f"CONSUMER.CREATE.{name}.c", {"stream_name": name, "config": {"durable_name": "c"}})
        requests = (
            (f"STREAM.LEADER.STEPDOWN.{name}", b""),
            ("STREAM.LEADER.STEPDOWN.NOSUCH", b"{bad"),
            (f"CONSUMER.LEADER.STEPDOWN.{name}.c", b""),
            (f"CONSUMER.LEADER.STEPDOWN.{name}.nosuch", b"{}"),
            (f"STREAM.PEER.REMOVE.{name}", b'{"peer":"x"}'),
            (f"STREAM.PEER.EVACUATE.{name}", b"junk"),
            (f"STREAM.CANCEL_MOVE.{name}", b""),
            ("STREAM.LEADER.STEPDOWN", b""),
            (f"CONSUMER.LEADER.STEPDOWN.{name}", b""),
            (f"STREAM.CANCEL_MOVE.{name}.x", b""),
            # the system account's operations: an ordinary account gets no answer
            ("META.LEADER.STEPDOWN", b""),
            ("SERVER.REMOVE", b"{}"),
            ("SERVER.EVACUATE", b""),
            ("META.RESCUE", b""),
            ("ACCOUNT.PURGE.ACC", b""),
            ("ACCOUNT.STREAM.MOVE.ACC.S", b""),
            ("ACCOUNT.STREAM.CANCEL_MOVE.ACC.S", b""),
        )
        answers = await asyncio.gather(*(answer(nc, subject, body) for subject, body in requests))
        return dict(zip([subject for subject, _ in requests], answers, strict=True))

    out = await same(targets, case, unique)
    assert out[f"STREAM.LEADER.STEPDOWN.{unique}"]["error"]["err_code"] == 10010
    assert out["META.LEADER.STEPDOWN"] == "silent"


async def test_max_consumers_enforced(targets: dict[str, str], unique: str) -> None:
    """A stream's `max_consumers` refuses a consumer beyond the limit (10026), counting ephemeral
    ones too; creating an existing consumer again is not a new one; a deleted one frees its place;
    raising the limit by an update admits more."""

    async def case(nc: Client, name: str) -> Any:
        out: dict[str, Any] = {"stream": (await stream(nc, name, max_consumers=2))["config"]["max_consumers"]}

        def create(consumer: str) -> Any:
            body = {"stream_name": name, "config": {"durable_name": consumer}}
            return api(nc, f"CONSUMER.CREATE.{name}.{consumer}", body)

        out["c1"] = (await create("c1")).get("error", "ok")
        eph = await api(nc, f"CONSUMER.CREATE.{name}", {"stream_name": name, "config": {}})
        out["ephemeral"] = eph.get("error", "ok")
        out["c2"] = (await create("c2")).get("error", "ok")
        out["c1 again"] = (await create("c1")).get("error", "ok")
        out["delete"] = await api(nc, f"CONSUMER.DELETE.{name}.c1")
        out["c2 after delete"] = (await create("c2")).get("error", "ok")
        out["c3"] = (await create("c3")).get("error", "ok")
        cfg = {"name": name, "subjects": [f"{name.lower()}.>"], "max_consumers": 3}
        out["update"] = (await api(nc, f"STREAM.UPDATE.{name}", cfg)).get("error", "ok")
        out["c3 after update"] = (await create("c3")).get("error", "ok")
        names = (await api(nc, f"CONSUMER.NAMES.{name}"))["consumers"]
        out["names"] = sorted(n for n in names if len(n) == 2)  # the durables (not the ephemeral)
        return out

    out = await same(targets, case, unique)
    assert out["c2"]["err_code"] == 10026
    assert out["names"] == ["c2", "c3"]
