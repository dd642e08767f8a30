"""``fast_batch`` (#20): one fast batch publisher (ADR-50 fast ingest) streams ``messages`` messages
of ``size`` bytes into an ``allow_batched`` stream as ADR-50's client does (it waits for flow acks
once ``outstanding`` acks' worth of messages are unanswered, and follows the flow the server asks
for), then ends the batch (operation 3) and waits for its PubAck; on the real JetStream and on
jetlake in one run: messages per second, and jetlake's rate over JetStream's. jetlake sends each
flow ack only once the messages it covers are durable in Delta.

    python -m bench.fast_batch [--messages 20000] [--size 128] [--flow 100] [--outstanding 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
from nats.aio.msg import Msg

from tests.differential import api
from tests.harness import Jetlake, ReferenceJetStream, serving

Result = dict[str, Any]


async def publish_batch(url: str, messages: int, size: int, flow: int, outstanding: int) -> float:
    """Messages per second of one fast batch, from its first message to its PubAck."""
    async with await nats.connect(url) as nc:
        config = {"name": "FAST", "subjects": ["fast.>"], "allow_batched": True}
        made = await api(nc, "STREAM.CREATE.FAST", config)
        assert "error" not in made, made
        inbox = nc.new_inbox()
        acked, step = 0, flow
        moved = asyncio.Event()
        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

        async def on_answer(msg: Msg) -> None:
            nonlocal acked, step
            body = json.loads(msg.data)
            if body.get("type") == "ack":
                acked, step = max(acked, body["seq"]), body["msgs"]
                moved.set()
            elif "type" not in body and not done.done():
                done.set_result(body)

        await nc.subscribe(f"{inbox}.>", cb=on_answer)
        payload = b"x" * size
        t0 = time.perf_counter()
        for seq in range(1, messages + 1):
            await nc.publish("fast.x", payload, reply=f"{inbox}.b.{flow}.ok.{seq}.{0 if seq == 1 else 1}.$FI")
            while (seq == 1 and not moved.is_set()) or acked + step * outstanding <= seq:
                moved.clear()
                await asyncio.wait_for(moved.wait(), 30)
        await nc.publish("fast.x", b"", reply=f"{inbox}.b.{flow}.ok.{messages + 1}.3.$FI")
        ack = await asyncio.wait_for(done, 30)
        elapsed = time.perf_counter() - t0
        assert ack.get("count") == messages, ack
        state = (await api(nc, "STREAM.INFO.FAST"))["state"]
        assert state["messages"] == messages, state
    return messages / elapsed


def run(work: Path, messages: int, size: int, flow: int, outstanding: int) -> Result:
    out: Result = {"workload": "fast_batch", "messages": messages, "size": size, "flow": flow}
    out["outstanding"] = outstanding
    for name, target in (("jetstream", ReferenceJetStream(work / "js")), ("jetlake", Jetlake(work / "jl"))):
        for server in serving(target):
            rate = asyncio.run(publish_batch(server.url, messages, size, flow, outstanding))
            out[f"{name}_msgs_per_s"] = round(rate)
    out["ratio"] = round(out["jetlake_msgs_per_s"] / out["jetstream_msgs_per_s"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--flow", type=int, default=100)
    ap.add_argument("--outstanding", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-fast-batch-") as tmp:
        print(json.dumps(run(Path(tmp), args.messages, args.size, args.flow, args.outstanding)), flush=True)


if __name__ == "__main__":
    main()
