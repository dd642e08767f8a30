"""Limits and removals: after every publish, delete and purge, stream info (messages, bytes,
first/last sequence, num_deleted, deleted, per-subject counts) equals the real JetStream's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.aio.client import Client

from tests.differential import assert_same
from tests.streams_script import Step, full_state, run_script, run_step
from tests.test_thin_slice import api

P = ("pub", "a", 5)

CASES: list[tuple[str, dict[str, Any], list[Step]]] = [
    # max_msgs with discard old: the oldest go, the first sequence moves
    ("max_msgs_old", {"max_msgs": 3}, [("pub", f"s{i % 2}", i) for i in range(6)]),
    # max_msgs with discard new: the fourth publish is refused with 503/10077
    ("max_msgs_new", {"max_msgs": 3, "discard": "new"}, [P] * 5),
    # max_bytes discard old: a message larger than the limit removes everything, itself included
    ("max_bytes_old", {"max_bytes": 100}, [P, P, ("pub", "b", 20), ("pub", "c", 90)]),
    # max_bytes discard new: refused only when the sum would exceed the limit (equal is fine)
    ("max_bytes_new", {"max_bytes": 78, "discard": "new"}, [P, P, P]),
    # per-subject limit: the subject's oldest goes, leaving an interior hole
    ("per_subject", {"max_msgs_per_subject": 2}, [("pub", s, 1) for s in "aabbaacb"]),
    # per-subject refusals under discard_new_per_subject
    (
        "per_subject_new",
        {"max_msgs_per_subject": 1, "discard": "new", "discard_new_per_subject": True},
        [("pub", "a", 1), ("pub", "a", 1), ("pub", "b", 1)],
    ),
    # discard new with a per-subject limit: a replacing message passes MaxMsgs
    (
        "per_subject_replaces",
        {"max_msgs_per_subject": 1, "max_msgs": 2, "discard": "new"},
        [("pub", s, 1) for s in "aabcb"],
    ),
    # headers count 4 bytes plus the header block
    (
        "headers_bytes",
        {"max_bytes": 200},
        [("pub", "h", 3, {"K": "v"}), P, ("pub", "h", 3, {"Long": "x" * 40})],
    ),
    # deletes: interior hole, the first moving, errors for holes, beyond the end and below the first
    (
        "deletes",
        {},
        [
            *[("pub", f"s{i % 3}", 2) for i in range(8)],
            ("del", {"seq": 4}),
            ("del", {"seq": 4}),
            ("del", {"seq": 1}),
            ("del", {"seq": 2}),
            ("del", {"seq": 1}),
            ("del", {"seq": 99}),
            ("del", {}),
            ("del", {"seq": 5, "no_erase": True}),
            ("del", {"seq": 8}),
            ("del", {"seq": 8}),
            ("purge", {}),
            ("del", {"seq": 8}),
            ("del", {"seq": 9}),
        ],
    ),
    # purges: by filter, below a sequence, keep, the whole stream, and past the end
    (
        "purges",
        {},
        [
            *[("pub", f"s{i % 2}", 1) for i in range(12)],
            ("purge", {"filter": "{n}.s0", "seq": 6}),
            ("purge", {"filter": "{n}.*", "keep": 4}),
            ("purge", {"seq": 3, "keep": 1}),
            ("purge", {"seq": 10}),
            ("purge", {"keep": 1}),
            ("purge", {"filter": "{n}.nomatch"}),
            ("purge", {}),
            P,
            ("purge", {"seq": 30}),
            P,
        ],
    ),
    # purges of a fresh stream: a whole purge makes the first sequence 1, a filtered one does not
    ("fresh_purge", {}, [("purge", {"filter": "{n}.a"}), ("purge", {"keep": 2}), ("purge", {}), P]),
    # storage memory: a message counts as the memory store counts it (16 bytes, no header length)
    (
        "memory_bytes_new",
        {"storage": "memory", "max_bytes": 110, "discard": "new"},
        [P, ("pub", "h", 3, {"K": "v"}), P, P],
    ),
    # lowering a limit by update trims at once
    (
        "update_lowers",
        {},
        [P, P, P, P, ("update", {"max_msgs": 2}), P, ("update", {"max_msgs_per_subject": 1})],
    ),
]


def _fill(step: Step, name: str) -> Step:
    """Put the stream's subject prefix into purge filters written as ``{n}``."""
    if step[0] == "purge" and "filter" in step[1]:
        return (step[0], {**step[1], "filter": step[1]["filter"].replace("{n}", name.lower())})
    return step


@pytest.mark.parametrize(("label", "config", "steps"), CASES, ids=[c[0] for c in CASES])
async def test_limits_and_removals(
    targets: dict[str, str], unique: str, label: str, config: dict[str, Any], steps: list[Step]
) -> None:
    async def case(nc: Client, name: str) -> Any:
        return await run_script(nc, name, config, [_fill(s, name) for s in steps])

    out = await assert_same(targets, case, unique)
    assert out[0] is None, out[0]


@pytest.mark.waits
async def test_max_age_expires_on_a_timer(targets: dict[str, str], unique: str) -> None:
    """MaxAge removes messages once they are older, without any further request; the first
    sequence moves past them and a message published later stays."""

    async def case(nc: Client, name: str) -> Any:
        config = {"max_age": 2_000_000_000, "duplicate_window": 2_000_000_000}
        out = await run_script(nc, name, config, [P, P])
        await asyncio.sleep(1.0)
        out.append(await run_step(nc, name, P))
        await asyncio.sleep(1.5)  # the first two are 0.5 s past 2 s, the third 0.5 s short of it
        out.append(await full_state(nc, name))
        await asyncio.sleep(1.5)
        out.append(await full_state(nc, name))
        return out

    out = await assert_same(targets, case, unique)
    assert out[-2]["messages"] == 1
    assert out[-2]["first_seq"] == 3
    assert out[-1]["messages"] == 0
    assert out[-1]["first_seq"] == 4


async def test_memory_stream_counts_as_the_memory_store(targets: dict[str, str], unique: str) -> None:
    """``storage: memory``: a message counts 16 bytes with its subject, header block and payload
    (the file store: 30, and 4 more for a header block), in the stream state, in its byte limits
    and in ``$JS.API.INFO``'s ``memory`` (a file stream's count as ``storage``); ``max_bytes``
    reserves its bytes as ``reserved_memory`` (``reserved_storage``)."""

    async def case(nc: Client, name: str) -> Any:
        before = await api(nc, "INFO")
        steps: list[Step] = [P, ("pub", "h", 3, {"K": "v"}), P, P, ("pub", "c", 60)]
        script = await run_script(nc, name, {"storage": "memory", "max_bytes": 120}, steps)
        await run_script(nc, f"{name}F", {"max_bytes": 1000}, [P])
        after = await api(nc, "INFO")
        usage = ("memory", "storage", "reserved_memory", "reserved_storage")
        return {"script": script, **{k: after[k] - before[k] for k in usage}}

    out = await assert_same(targets, case, unique)
    assert out["memory"] == out["script"][-1]["bytes"] > 0
    assert (out["reserved_memory"], out["reserved_storage"]) == (120, 1000)
