"""Small helpers the consumer tests share: raw API requests and raw pull requests."""

from __future__ import annotations

import json
from typing import Any

from nats.aio.client import Client
from nats.errors import TimeoutError

from tests.differential import run_case


async def api(nc: Client, subject: str, body: Any = b"") -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    msg = await nc.request(f"$JS.API.{subject}", data, timeout=5)
    return dict(json.loads(msg.data))


async def stream(nc: Client, name: str, **cfg: Any) -> dict[str, Any]:
    return await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{name.lower()}.>"], **cfg})


async def consumer(nc: Client, stream_name: str, name: str, **cfg: Any) -> dict[str, Any]:
    body = {"stream_name": stream_name, "config": {"durable_name": name, **cfg}}
    return await api(nc, f"CONSUMER.CREATE.{stream_name}.{name}", body)


async def publish(nc: Client, stream_name: str, count: int, subjects: int = 1, size: int = 3) -> None:
    js = nc.jetstream()
    for i in range(count):
        await js.publish(f"{stream_name.lower()}.s{i % subjects}", f"{i:0{size}d}".encode())


def describe(msg: Any) -> tuple[Any, ...]:
    """What a client sees of a delivered or status message (no times, no inbox names)."""
    hdrs = dict(msg.headers or {})
    status = hdrs.pop("Status", None)
    desc = hdrs.pop("Description", None)
    if status:
        return ("status", status, desc, tuple(sorted(hdrs.items())))
    toks = msg.reply.split(".")
    # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
    return (
        "msg",
        msg.subject,
        msg.data.decode(),
        toks[4],
        toks[5],
        toks[6],
        toks[8],
        tuple(sorted(hdrs.items())),
    )


async def pull(
    nc: Client, stream_name: str, name: str, body: Any, limit: int, wait: float = 2.0
) -> list[Any]:
    """A raw MSG.NEXT: what arrives on the inbox (at most ``limit`` messages, until quiet)."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream_name}.{name}", data, reply=inbox)
    out: list[Any] = []
    try:
        while len(out) < limit:
            out.append(describe(await sub.next_msg(timeout=wait)))
            if out[-1][0] == "status" and out[-1][1] != "100":
                break  # the request is over
    except TimeoutError:
        out.append("quiet")
    await sub.unsubscribe()
    return out


def state(info: dict[str, Any]) -> dict[str, Any]:
    """The numbers of a consumer info, without times."""
    keys = ("delivered", "ack_floor", "num_ack_pending", "num_redelivered", "num_waiting", "num_pending")
    return {
        k: {kk: vv for kk, vv in info[k].items() if kk != "last_active"}
        if isinstance(info[k], dict)
        else info[k]
        for k in keys
    }


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            out += _diff(a.get(k, "<missing>"), b.get(k, "<missing>"), f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: jetstream={a!r} jetlake={b!r}"]


async def same(targets: dict[str, str], case: Any, name: str) -> Any:
    """``assert_same`` that names each differing field when the servers disagree."""
    results = await run_case(targets, case, name)
    differences = _diff(results["jetstream"], results["jetlake"])
    if differences:
        print(json.dumps(results, indent=1, default=str))
    assert not differences, "\n".join(differences)
    return results["jetstream"]
