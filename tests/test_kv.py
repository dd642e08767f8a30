"""nats-py's key-value API, unchanged, against the real JetStream and jetlake: the same calls give
the same entries, revisions and errors. A KV bucket is a stream (``KV_<bucket>``, subjects
``$KV.<bucket>.>``) with per-subject history, rollups and direct get; its ``$KV…`` publishes reach
jetlake through the hub's mapping into the API domain."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from nats.aio.client import Client
from nats.js.kv import KeyValue

from tests.differential import assert_same


def entry(e: KeyValue.Entry | None) -> Any:
    if e is None:
        return None
    return {
        "key": e.key,
        "value": e.value.decode() if e.value is not None else None,
        "revision": e.revision,
        "operation": e.operation,
    }


async def attempt(call: Awaitable[Any]) -> Any:
    """The call's result, or the error nats-py raises (its type and text)."""
    try:
        result = await call
    except Exception as exc:
        return {"error": type(exc).__name__, "text": str(exc)}
    if isinstance(result, KeyValue.Entry):
        return entry(result)
    return result


async def test_kv_put_get_update_delete_purge(targets: dict[str, str], unique: str) -> None:
    """Revisions, create/update with expected revision, delete and purge markers, and their errors."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        kv = await js.create_key_value(bucket=name, history=5)
        steps: list[Any] = [
            await attempt(kv.put("a", b"1")),
            await attempt(kv.put("a", b"2")),
            await attempt(kv.put("b.c", b"x")),
            await attempt(kv.get("a")),
            await attempt(kv.get("a", revision=1)),
            await attempt(kv.get("missing")),
            await attempt(kv.update("a", b"3", last=2)),
            await attempt(kv.update("a", b"4", last=2)),  # wrong revision
            await attempt(kv.create("a", b"5")),  # exists
            await attempt(kv.create("new", b"n")),
            await attempt(kv.delete("a")),
            await attempt(kv.get("a")),  # deleted
            await attempt(kv.create("a", b"again")),  # create over a delete marker
            await attempt(kv.purge("b.c")),
            await attempt(kv.get("b.c")),
            await attempt(kv.delete("new", last=999)),  # wrong revision
        ]
        status = await kv.status()
        steps.append({"values": status.values, "history": status.history, "bucket": status.bucket})
        info = await js.stream_info(f"KV_{name}")
        steps.append({"messages": info.state.messages, "last_seq": info.state.last_seq})
        steps.append(await attempt(js.delete_key_value(name)))
        steps.append(await attempt(kv.get("new")))
        steps.append(await attempt(kv.put("new", b"gone")))
        return steps

    out = await assert_same(targets, case, unique)
    assert out[7]["error"] == "KeyWrongLastSequenceError"


async def test_kv_per_key_ttl_and_limit_markers(targets: dict[str, str], unique: str) -> None:
    """ADR-48 on ADR-43: create and purge with a TTL, and a bucket with limit_marker_ttl whose
    expired keys leave a MaxAge marker that get() reports as a missing key."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        kv = await js.create_key_value(bucket=name, history=2, ttl=3, limit_marker_ttl=1)
        t0 = asyncio.get_running_loop().time()
        steps: list[Any] = [
            await attempt(kv.create("short", b"s", msg_ttl=1)),
            await attempt(kv.put("plain", b"p")),
            await attempt(kv.purge("plain", msg_ttl=1)),
        ]
        await asyncio.sleep(max(0.0, t0 + 1.6 - asyncio.get_running_loop().time()))
        steps += [await attempt(kv.get("short")), await attempt(kv.get("plain"))]
        info = await js.stream_info(f"KV_{name}")
        steps.append({"messages": info.state.messages, "last_seq": info.state.last_seq})
        steps.append(await attempt(kv.create("short", b"again")))  # over the marker
        return steps

    out = await assert_same(targets, case, unique)
    assert out[3] == {"key": "short", "value": None, "revision": 4, "operation": None}  # the marker


async def test_kv_history_keys_watch(targets: dict[str, str], unique: str) -> None:
    """history, keys and a watch read the bucket through ordered consumers; entries keep their
    ``$KV…`` subjects."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        kv = await js.create_key_value(bucket=name, history=3)
        for i in range(5):
            await kv.put("h", str(i).encode())
        await kv.put("k2", b"v")
        await kv.delete("k2")
        await kv.put("k3", b"v")
        history = [entry(e) for e in await kv.history("h")]
        keys = sorted(await kv.keys())
        watcher = await kv.watchall()
        seen = []
        async for e in watcher:
            if e is None:
                break
            seen.append(entry(e))
        await kv.put("k4", b"live")
        live = await watcher.updates(timeout=5)
        await watcher.stop()
        return {"history": history, "keys": keys, "initial": seen, "live": entry(live)}

    out = await assert_same(targets, case, unique)
    assert [e["value"] for e in out["history"]] == ["2", "3", "4"]


async def test_kv_with_the_domain_named(targets: dict[str, str], unique: str) -> None:
    """A client that names the domain (``jetstream(domain="jetlake")``) addresses the API as
    ``$JS.jetlake.API.…``: the same KV answers as from a real JetStream in domain ``jetlake``, also
    for a put published under that prefix (``$JS.jetlake.API.$KV.<bucket>.<key>``)."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream(domain="jetlake")
        kv = await js.create_key_value(bucket=name, history=2)
        return [
            await attempt(kv.put("k", b"1")),
            await attempt(kv.update("k", b"2", last=1)),
            await attempt(kv.update("k", b"3", last=1)),
            await attempt(kv.get("k")),
            await attempt(kv.delete("k")),
            await attempt(kv.get("k")),
            await attempt(kv.create("k", b"again")),
            # a put under the domain's API prefix, as nats.js sends it for a named domain
            (await js.publish(f"$JS.jetlake.API.$KV.{name}.p", b"prefixed")).seq,
            await attempt(kv.get("p")),
        ]

    out = await assert_same(targets, case, unique)
    assert out[2]["error"] == "KeyWrongLastSequenceError"
