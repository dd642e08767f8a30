"""A small script language for stream differential tests: the same steps against both servers,
with the full stream state (deleted sequences and per-subject counts included) after every step."""

from __future__ import annotations

import json
from typing import Any

from nats.aio.client import Client

from tests.test_thin_slice import api

Step = tuple[Any, ...]


async def run_step(nc: Client, name: str, step: Step) -> Any:
    """One step; its observable answer."""
    kind, *args = step
    subj = name.lower()
    if kind == "pub":  # ("pub", subject suffix, payload size[, headers])
        hdrs = args[2] if len(args) > 2 else None
        msg = await nc.request(f"{subj}.{args[0]}", b"x" * args[1], timeout=5, headers=hdrs)
        return json.loads(msg.data)
    if kind == "del":  # ("del", body)
        return await api(nc, f"STREAM.MSG.DELETE.{name}", args[0])
    if kind == "purge":  # ("purge", body)
        return await api(nc, f"STREAM.PURGE.{name}", args[0])
    if kind == "get":  # ("get", body)
        return await api(nc, f"STREAM.MSG.GET.{name}", args[0])
    if kind == "update":  # ("update", config changes)
        cfg = (await api(nc, f"STREAM.INFO.{name}"))["config"]
        return await api(nc, f"STREAM.UPDATE.{name}", {**cfg, **args[0]})
    raise ValueError(kind)


async def full_state(nc: Client, name: str) -> Any:
    info = await api(nc, f"STREAM.INFO.{name}", {"deleted_details": True, "subjects_filter": ">"})
    return info.get("state", info)


async def run_script(nc: Client, name: str, config: dict[str, Any], steps: list[Step]) -> list[Any]:
    """Create the stream, run the steps; answers and states interleaved."""
    created = await api(
        nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{name.lower()}.>"], **config}
    )
    out: list[Any] = [created.get("error")]
    for step in steps:
        out.append(await run_step(nc, name, step))
        out.append(await full_state(nc, name))
    return out
