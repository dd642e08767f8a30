"""Per-message TTL (ADR-43) against the real JetStream: which Nats-TTL values are accepted, when
messages leave the stream, and the delete markers subject_delete_marker_ttl asks for. Timed steps
sample well away from every deadline (at least 0.4 s on either side)."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import pytest
from nats.aio.client import Client

from tests.differential import assert_same, assert_same_across_restart
from tests.harness import Jetlake, ReferenceJetStream
from tests.test_publish_semantics import api, pub, state

S = 1_000_000_000


async def messages(nc: Client, name: str) -> list[Any]:
    """Every live message as (seq, subject, headers, payload), read with MSG.GET."""
    info = await api(nc, f"STREAM.INFO.{name}")
    out = []
    for seq in range(info["state"]["first_seq"], info["state"]["last_seq"] + 1):
        got = await api(nc, f"STREAM.MSG.GET.{name}", {"seq": seq})
        if "message" in got:
            m = got["message"]
            hdrs = base64.b64decode(m["hdrs"]).decode() if m.get("hdrs") else None
            out.append((m["seq"], m["subject"], hdrs, base64.b64decode(m.get("data") or b"").decode()))
    return out


# Nats-TTL values on a stream with allow_msg_ttl: seconds, Go durations and "never" are stored; zero,
# sub-second, fractional and negative values are refused with 10165 (ADR-43 says 0 is ignored;
# 2.15.1 refuses it); "00" parses as zero seconds, which is no TTL.
TTL_VALUES = ["1s", "2", "never", "NEVER", "0", "500ms", "1.5", "-1", "00", "1h", "1m30s", "soon", ""]


async def test_ttl_values(targets: dict[str, str], unique: str) -> None:
    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{s}.>"], "allow_msg_ttl": True})
        answers = [await pub(nc, f"{s}.a", b"x", {"Nats-TTL": v}) for v in TTL_VALUES]
        return {"answers": answers, "state": state(await api(nc, f"STREAM.INFO.{name}"))}

    out = await assert_same(targets, case, unique)
    assert out["answers"][4]["error"]["err_code"] == 10165


async def test_ttl_disabled(targets: dict[str, str], unique: str) -> None:
    """Without allow_msg_ttl a valid TTL is refused (10166); an invalid one fails its parse (10165)."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{s}.>"]})
        return [await pub(nc, f"{s}.a", b"x", {"Nats-TTL": v}) for v in ("5s", "never", "0", "bogus")]

    out = await assert_same(targets, case, unique)
    assert out[0]["error"]["err_code"] == 10166


async def test_ttl_raised_to_marker_ttl(targets: dict[str, str], unique: str) -> None:
    """A TTL below subject_delete_marker_ttl is raised to it, and the stored header says so."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        cfg = {"name": name, "subjects": [f"{s}.>"], "subject_delete_marker_ttl": 5 * S}
        await api(nc, f"STREAM.CREATE.{name}", cfg)
        await pub(nc, f"{s}.a", b"1", {"Nats-TTL": "2s", "X-Other": "kept"})
        await pub(nc, f"{s}.b", b"2", {"Nats-TTL": "10s"})
        await pub(nc, f"{s}.c", b"3", {"Nats-TTL": "never"})
        return await messages(nc, name)

    out = await assert_same(targets, case, unique)
    assert "Nats-TTL: 5" in out[0][2]


@pytest.mark.waits
async def test_ttl_expiry_and_never(targets: dict[str, str], unique: str) -> None:
    """A TTL removes its message on time; `never` outlives MaxAge, a longer TTL does not."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        cfg = {"name": name, "subjects": [f"{s}.>"], "allow_msg_ttl": True, "max_age": 2 * S}
        await api(nc, f"STREAM.CREATE.{name}", cfg)
        t0 = time.monotonic()
        await pub(nc, f"{s}.a", b"1", {"Nats-TTL": "1s"})
        await pub(nc, f"{s}.b", b"2")
        await pub(nc, f"{s}.c", b"3", {"Nats-TTL": "never"})
        await pub(nc, f"{s}.d", b"4", {"Nats-TTL": "1h"})
        steps = []
        for at in (0.5, 1.5, 2.6):
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            steps.append((state(await api(nc, f"STREAM.INFO.{name}")), await messages(nc, name)))
        return steps

    out = await assert_same(targets, case, unique)
    assert [m[1] for m in out[2][1]] == [f"{unique.lower()}.c"]


@pytest.mark.waits
async def test_delete_markers(targets: dict[str, str], unique: str) -> None:
    """With subject_delete_marker_ttl, the expiry of a subject's last message (by TTL or MaxAge)
    places a marker (Nats-Marker-Reason: MaxAge, Nats-TTL, Nats-Rollup: sub) that expires in turn;
    a subject that still has messages gets none."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        cfg = {"name": name, "subjects": [f"{s}.>"], "subject_delete_marker_ttl": S, "max_age": 3 * S}
        await api(nc, f"STREAM.CREATE.{name}", cfg)
        t0 = time.monotonic()
        await pub(nc, f"{s}.a", b"1", {"Nats-TTL": "1s"})  # its subject's last: a marker
        await pub(nc, f"{s}.b", b"2", {"Nats-TTL": "1s"})  # b has a newer message: no marker
        await pub(nc, f"{s}.b", b"3")
        steps = []
        for at in (0.5, 1.6, 2.6, 3.6):
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            steps.append((state(await api(nc, f"STREAM.INFO.{name}")), await messages(nc, name)))
        return steps

    out = await assert_same(targets, case, unique)
    marker = out[1][1][-1]
    assert marker[1:] == (
        f"{unique.lower()}.a",
        "NATS/1.0\r\nNats-Marker-Reason: MaxAge\r\nNats-TTL: 1s\r\nNats-Rollup: sub\r\n\r\n",
        "",
    )


@pytest.mark.slow
async def test_ttl_survives_restart(reference: ReferenceJetStream, jetlake: Jetlake, unique: str) -> None:
    """The TTL schedule is rebuilt from the stored headers: a message whose TTL runs out while the
    gateway is down or restarting is gone afterwards, as on the real server."""
    t0 = time.monotonic()

    async def before(nc: Client, name: str) -> Any:
        s = name.lower()
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{s}.>"], "allow_msg_ttl": True})
        return [
            await pub(nc, f"{s}.a", b"1", {"Nats-TTL": "4s"}),
            await pub(nc, f"{s}.b", b"2", {"Nats-TTL": "never"}),
            await pub(nc, f"{s}.c", b"3", {"Nats-TTL": "1h"}),
        ]

    async def after(nc: Client, name: str) -> Any:
        await asyncio.sleep(max(0.0, t0 + 5.0 - time.monotonic()))  # past the 4 s TTL
        return await messages(nc, name)

    _, second = await assert_same_across_restart(reference, jetlake, before, after, unique, kill=False)
    assert [m[1] for m in second] == [f"{unique.lower()}.b", f"{unique.lower()}.c"]


async def test_no_markers_from_delete_and_purge(targets: dict[str, str], unique: str) -> None:
    """ADR-43 plans Remove and Purge markers for the delete and purge APIs; 2.15.1 places none."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        cfg = {"name": name, "subjects": [f"{s}.>"], "subject_delete_marker_ttl": S}
        await api(nc, f"STREAM.CREATE.{name}", cfg)
        for subj in ("a", "b", "c"):
            await pub(nc, f"{s}.{subj}")
        deleted = await api(nc, f"STREAM.MSG.DELETE.{name}", {"seq": 1})
        purged = await api(nc, f"STREAM.PURGE.{name}", {"filter": f"{s}.b"})
        return [deleted, purged, state(await api(nc, f"STREAM.INFO.{name}")), await messages(nc, name)]

    out = await assert_same(targets, case, unique)
    assert out[2]["messages"] == 1
