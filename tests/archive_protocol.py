"""A client of the server's stream snapshot and restore protocol, driven with plain nats-py
requests (as the ``nats`` CLI's ``stream backup``/``restore`` drive it): what every step showed."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from tests.differential import api

#: How long a snapshot may take to close (a window that runs dry ends after 5 s).
SNAPSHOT_WAIT_S = 10.0


@dataclass
class Snapshot:
    """What a snapshot showed: the answer, each chunk (its size and reply subject), the closing
    message's headers, and the archive's bytes."""

    answer: dict[str, Any]
    chunks: list[tuple[int, str]] = field(default_factory=list)
    closing: dict[str, str] | None = None
    archive: bytes = b""

    def shape(self) -> dict[str, Any]:
        """The protocol's observable shape, alike on both servers whatever the archive's bytes:
        chunk replies (as patterns), which chunks had one, and the closing status."""
        full = [size for size, reply in self.chunks if reply]
        return {
            "replies": sorted(
                {re.sub(r"\.[^.]+\.\d+\.\d+$", ".<id>.<len>.<n>", r) for _, r in self.chunks if r}
            ),
            "reply tokens": all(
                r.endswith(f".{size}.{i}") for i, (size, r) in enumerate(self.chunks[: len(full)], 1)
            ),
            "full chunks of one size": len(set(full)) <= 1,
            "only the last without reply": all(r for _, r in self.chunks[:-1]),
            "closing": self.closing,
        }


async def snapshot(
    nc: Client,
    stream: str,
    request: dict[str, Any] | None = None,
    ack: bool = True,
    wait_s: float = SNAPSHOT_WAIT_S,
) -> Snapshot:
    """Ask for a snapshot of ``stream`` delivered to a fresh inbox; acknowledge each chunk that
    has a reply (unless ``ack`` is False) and collect everything up to the closing empty message."""
    inbox = nc.new_inbox()
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    taken = Snapshot(answer={})
    parts: list[bytes] = []

    async def on_chunk(msg: Msg) -> None:
        if not msg.data:
            taken.closing = dict(msg.headers or {})
            if not done.done():
                done.set_result(None)
            return
        parts.append(msg.data)
        taken.chunks.append((len(msg.data), msg.reply))
        if msg.reply and ack:
            await nc.publish(msg.reply, b"")

    sub = await nc.subscribe(inbox, cb=on_chunk)
    try:
        taken.answer = await api(
            nc, f"STREAM.SNAPSHOT.{stream}", {"deliver_subject": inbox, **(request or {})}
        )
        if "error" not in taken.answer:
            await asyncio.wait_for(done, wait_s)
    finally:
        await sub.unsubscribe()
    taken.archive = b"".join(parts)
    return taken


@dataclass
class Restored:
    """What a restore showed: the answer, each chunk's reply, and the closing answer."""

    answer: dict[str, Any]
    chunk_replies: list[bytes | dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] | None = None


async def restore(
    nc: Client, stream: str, config: dict[str, Any], archive: bytes, chunk: int = 4096, wait_s: float = 10.0
) -> Restored:
    """Restore ``archive`` as ``stream``: the request, each chunk sent as a request (an error
    answer to a chunk ends it), then the closing empty request and its answer."""
    answer = await api(nc, f"STREAM.RESTORE.{stream}", {"config": config})
    out = Restored(answer)
    if "error" in answer:
        return out
    subject = answer["deliver_subject"]
    for i in range(0, len(archive), chunk):
        reply = await nc.request(subject, archive[i : i + chunk], timeout=5)
        if reply.data:
            out.chunk_replies.append(json.loads(reply.data))
            return out
        out.chunk_replies.append(b"")
    final = await nc.request(subject, b"", timeout=wait_s)
    out.final = json.loads(final.data)
    return out
