"""The object store (ADR-20) through nats-py's unmodified client, against the real JetStream and
jetlake: a bucket is a stream `OBJ_<bucket>` of chunk and meta subjects, read back through an
ordered push consumer."""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client

from tests.jsapi import api, same


async def test_object_store_put_get_list_delete(targets: dict[str, str], unique: str) -> None:
    """Objects of several chunks and of none, read back whole; replaced, listed, deleted (a
    deleted object is not found), the bucket's status and its stream, and the bucket deleted."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        obs = await js.create_object_store(name, description="objects")
        out: dict[str, Any] = {}
        big = bytes(i % 251 for i in range(300_000))  # three 128 KiB chunks
        info = await obs.put("big.bin", big)
        out["put"] = (info.name, info.size, info.chunks, info.digest)
        await obs.put("empty", b"")
        await obs.put("small.txt", b"one")
        await obs.put("small.txt", b"two")  # replaces the first
        got = await obs.get("big.bin")
        out["get"] = (got.data == big, got.info.size, got.info.chunks)
        out["small"] = (await obs.get("small.txt")).data
        out["empty"] = (await obs.get("empty")).data
        out["list"] = sorted((i.name, i.size, bool(i.deleted)) for i in await obs.list())
        await obs.delete("big.bin")
        try:
            await obs.get("big.bin")
            out["deleted"] = "found"
        except Exception as exc:  # nats-py raises ObjectNotFoundError or ObjectDeletedError
            out["deleted"] = type(exc).__name__
        status = await obs.status()
        out["status"] = (status.bucket, status.description, status.sealed)
        stream = (await api(nc, f"STREAM.INFO.OBJ_{name}"))["state"]
        out["stream"] = {k: stream[k] for k in ("messages", "first_seq", "last_seq", "num_subjects")}
        out["bucket deleted"] = await js.delete_object_store(name)
        return out

    out = await same(targets, case, unique)
    assert out["get"][0]
    assert out["put"][2] == 3
