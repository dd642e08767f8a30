"""Where consumers start and what they see, against the real JetStream and jetlake: deliver
policies all, last, new, by_start_sequence, by_start_time, last_per_subject; filter_subject and
filter_subjects; deleted messages (holes) skipped by delivery and by num_pending."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from nats.aio.client import Client

from tests.jsapi import api, publish, pull, same, state, stream

POLICIES: list[dict[str, Any]] = [
    {"deliver_policy": "all"},
    {"deliver_policy": "last"},
    {"deliver_policy": "new"},
    {"deliver_policy": "by_start_sequence", "opt_start_seq": 4},
    {"deliver_policy": "by_start_sequence", "opt_start_seq": 100},  # beyond the end
    {"deliver_policy": "by_start_time"},  # the time between the two halves
    {"deliver_policy": "last_per_subject", "filter_subject": "{s}.*"},
    {"deliver_policy": "last_per_subject", "filter_subjects": ["{s}.s0", "{s}.s2"]},
    {"deliver_policy": "all", "filter_subject": "{s}.s1"},
    {"deliver_policy": "all", "filter_subjects": ["{s}.s0", "{s}.s2"]},
    {"deliver_policy": "last", "filter_subject": "{s}.s1"},
    {"deliver_policy": "by_start_sequence", "opt_start_seq": 2, "filter_subject": "{s}.s2"},
]


@pytest.mark.parametrize("policy", POLICIES, ids=[str(i) for i in range(len(POLICIES))])
async def test_deliver_policy(targets: dict[str, str], unique: str, policy: dict[str, Any]) -> None:
    """Each start: the messages delivered (sequences, pending counts in the ack token), the info
    before and after, and what a later publish adds. Messages 3 and 7 are deleted first."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        await stream(nc, name)
        await publish(nc, name, 5, subjects=3)
        await asyncio.sleep(0.3)
        middle = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        await asyncio.sleep(0.3)
        js = nc.jetstream()
        for i in range(5, 10):
            await js.publish(f"{s}.s{i % 3}", f"{i:03d}".encode())
        for seq in (3, 7):
            await api(nc, f"STREAM.MSG.DELETE.{name}", {"seq": seq})
        cfg = {k: (v.replace("{s}", s) if isinstance(v, str) else v) for k, v in policy.items()}
        if "filter_subjects" in cfg:
            cfg["filter_subjects"] = [f.replace("{s}", s) for f in cfg["filter_subjects"]]
        if cfg["deliver_policy"] == "by_start_time":
            cfg["opt_start_time"] = middle
        body = {"stream_name": name, "config": {"durable_name": "c", "ack_policy": "explicit", **cfg}}
        created = await api(nc, f"CONSUMER.CREATE.{name}.c", body)
        before = state(created)
        got = await pull(nc, name, "c", {"batch": 20, "expires": 400_000_000}, 21)
        await js.publish(f"{s}.s1", b"later")
        later = await pull(nc, name, "c", {"batch": 5, "expires": 300_000_000}, 6)
        return {
            "before": before,
            "got": got,
            "later": later,
            "after": state(await api(nc, f"CONSUMER.INFO.{name}.c")),
        }

    await same(targets, case, unique)


STARTS: list[dict[str, Any]] = [
    {"deliver_policy": "all"},
    {"deliver_policy": "by_start_sequence", "opt_start_seq": 1},
    {"deliver_policy": "by_start_sequence", "opt_start_seq": 9},  # beyond the end: kept
    {"deliver_policy": "by_start_time", "opt_start_time": "2000-01-01T00:00:00Z"},
    {"deliver_policy": "last"},
    {"deliver_policy": "new"},
]


async def test_a_consumer_starts_no_lower_than_the_streams_first_sequence(
    targets: dict[str, str], unique: str
) -> None:
    """A purged stream (three messages, two kept), a stream purged empty and one whose config
    starts at sequence 5: a new consumer's delivered and ack floor count the sequences below the
    stream's first as passed (the server moves a start below the first sequence up to it), so its
    info and what it delivers agree."""

    async def case(nc: Client, name: str) -> Any:
        out = []
        for kind in ("kept", "empty", "first"):
            s = f"{name}{kind}".upper()
            body: dict[str, Any] = {"name": s, "subjects": [f"{s.lower()}.>"]}
            if kind == "first":
                body["first_seq"] = 5
            await api(nc, f"STREAM.CREATE.{s}", body)
            if kind != "first":
                for i in range(3):
                    await nc.request(f"{s.lower()}.x", b"m%d" % i)
                await api(nc, f"STREAM.PURGE.{s}", {"keep": 2} if kind == "kept" else {})
            for i, cfg in enumerate(STARTS):
                config = {"durable_name": f"c{i}", "ack_policy": "explicit", **cfg}
                created = await api(nc, f"CONSUMER.CREATE.{s}.c{i}", {"stream_name": s, "config": config})
                got = await pull(nc, s, f"c{i}", {"batch": 5, "expires": 200_000_000}, 6)
                out.append([kind, cfg, state(created), got])
        return out

    await same(targets, case, unique)
