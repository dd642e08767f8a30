"""How often an idle gateway wakes up: ``strace`` on the gateway process while nothing happens.

The event loop (the main thread) sleeps in ``epoll_wait`` with a timeout until its next timer, or
with none when no timer is armed; each such sleep is one wake-up (``wake-ups/s``). A wake-up that
resumes a task costs a second, non-blocking ``epoll_wait`` (``epoll_wait/s`` counts both);
``syscalls/s`` counts every system call of every thread. Two states are measured: a gateway with
no streams, and one holding a stream with MaxAge and per-message TTLs, a durable pull consumer with
a long-poll request waiting (60 s expiry, 5 s idle heartbeat) and a push consumer with a subscriber
and a 5 s idle heartbeat, its messages delivered and acked; each with the HTTP monitor on (as
``jetlake serve`` runs by default) and off. Run:

    .venv/bin/python -m bench.idle_wakeups [--seconds 10]

It needs ``strace`` and permission to trace a child process (ptrace_scope 0 or 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from tests.harness import Jetlake

S = 1_000_000_000
LINE = re.compile(r"(\d+)\s+(?:<\.\.\. (\w+) resumed>(.*)|(\w+)\((.*))$")
#: the timeout, last argument of epoll_wait, as strace prints the end of the call
TIMEOUT = re.compile(r",\s*(-?\d+)\)\s*=")


def strace_counts(pid: int, seconds: float) -> dict[str, int]:
    """System calls of every thread of ``pid`` over ``seconds``, by name; ``loop_epoll_wait``: the
    event loop's (the main thread's) ``epoll_wait`` calls, and ``sleeps``: those that could block
    (a timeout other than 0)."""
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        proc = subprocess.Popen(
            ["strace", "-f", "-qq", "-o", out.name, "-p", str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(seconds)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        counts: dict[str, int] = {"sleeps": 0, "loop_epoll_wait": 0}
        for line in out:
            m = LINE.match(line.rstrip("\n"))
            if m is None:
                continue
            thread, resumed, rest_resumed, name, rest = m.groups()
            if name is not None:  # a call starts (its end may come on a later line)
                counts[name] = counts.get(name, 0) + 1
            else:
                name, rest = resumed, rest_resumed
            if int(thread) != pid or name not in ("epoll_wait", "epoll_pwait"):
                continue
            if resumed is None:
                counts["loop_epoll_wait"] += 1
            timeout = TIMEOUT.search(rest)
            if timeout is not None and timeout.group(1) != "0":
                counts["sleeps"] += 1
        return counts


async def populate(url: str) -> Client:
    """A stream and two consumers in the state described above; the connection stays open (the
    pull request and the push subscription wait on it)."""
    nc = await nats.connect(url)
    api = "$JS.API."

    async def call(subject: str, body: dict[str, object]) -> None:
        answer = json.loads((await nc.request(api + subject, json.dumps(body).encode(), timeout=10)).data)
        assert "error" not in answer, answer

    await call(
        "STREAM.CREATE.idle",
        {
            "name": "idle",
            "subjects": ["idle.>"],
            "max_age": 3600 * S,
            "allow_msg_ttl": True,
            "subject_delete_marker_ttl": 60 * S,
        },
    )
    for i in range(100):
        hdrs = {"Nats-TTL": "1h"} if i % 2 else None
        await nc.request(f"idle.{i % 10}", b"x" * 64, timeout=10, headers=hdrs)
    await call("CONSUMER.CREATE.idle.pull", {"stream_name": "idle", "config": {"durable_name": "pull"}})
    acked = 0
    all_acked = asyncio.Event()

    async def on_msg(msg: Msg) -> None:
        nonlocal acked
        if msg.reply:
            await msg.respond(b"+ACK")
            acked += 1
            if acked >= 200:
                all_acked.set()

    push_inbox = nc.new_inbox()
    await nc.subscribe(push_inbox, cb=on_msg)
    push = {"durable_name": "push", "deliver_subject": push_inbox, "idle_heartbeat": 5 * S}
    await call("CONSUMER.CREATE.idle.push", {"stream_name": "idle", "config": push})
    pull_inbox = nc.new_inbox()
    await nc.subscribe(pull_inbox, cb=on_msg)
    next_subject = api + "CONSUMER.MSG.NEXT.idle.pull"
    await nc.publish(next_subject, json.dumps({"batch": 100}).encode(), reply=pull_inbox)
    await asyncio.wait_for(all_acked.wait(), 10)
    # the long poll that stays waiting
    body = {"batch": 1, "expires": 60 * S, "idle_heartbeat": 5 * S}
    await nc.publish(next_subject, json.dumps(body).encode(), reply=pull_inbox)
    await nc.flush()
    await asyncio.sleep(1)  # the acks' log commit, the last deliveries' ack-log rows
    return nc


def measure(seconds: float, monitor: bool) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    label = "monitor on" if monitor else "monitor off"
    with tempfile.TemporaryDirectory() as tmp:
        lake = Jetlake(Path(tmp) / "jetlake")
        if not monitor:
            lake.monitor_port = 0
        lake.start()
        try:
            assert lake.gateway is not None
            pid = lake.gateway.pid
            time.sleep(2)
            out[f"no streams, {label}"] = _rates(strace_counts(pid, seconds), seconds)

            async def busy() -> None:
                nc = await populate(lake.url)
                try:
                    # measured while this connection (and its waiting request) stays open
                    counts = await asyncio.to_thread(strace_counts, pid, seconds)
                    out[f"stream + pull (waiting) + push consumers, {label}"] = _rates(counts, seconds)
                finally:
                    await nc.close()

            asyncio.run(busy())
        finally:
            lake.stop()
    return out


def _rates(counts: dict[str, int], seconds: float) -> dict[str, float]:
    calls = sum(counts.values()) - counts["sleeps"] - counts["loop_epoll_wait"]
    return {
        "wake-ups/s": round(counts["sleeps"] / seconds, 1),
        "epoll_wait/s": round(counts["loop_epoll_wait"] / seconds, 1),
        "syscalls/s (all threads)": round(calls / seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    for monitor in (True, False):
        for state, figures in measure(args.seconds, monitor).items():
            print(f"{state}: {figures}")


if __name__ == "__main__":
    main()
