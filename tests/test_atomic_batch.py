"""Atomic batch publish (``allow_atomic``) on the real JetStream and on jetlake: the same publishes,
the same replies (the empty reply of a held message, the commit's PubAck with ``batch`` and
``count``, every refusal), the same stream state while a batch is held and after, the same stored
messages (subjects, headers, payloads) and the same BATCH_ABANDONED advisories (fields in the
server's order, ids and times left out)."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from gateway.api import errors
from gateway.engine.atomic_batch import IDLE_TIMEOUT_NS, Abandoned, AtomicBatches, Dropped, Held
from tests.differential import api, assert_same

# A publish: subject suffix, payload, headers. ``B(id, seq)`` makes a batch message's headers.
Pub = tuple[str, bytes, dict[str, str]]


def B(batch: str, seq: int, commit: str | None = None, **extra: str) -> dict[str, str]:
    h = {"Nats-Batch-Id": batch, "Nats-Batch-Sequence": str(seq)}
    if commit is not None:
        h["Nats-Batch-Commit"] = commit
    h.update({k.replace("_", "-"): v for k, v in extra.items()})
    return h


PER_SUBJECT = {
    "max_msgs_per_subject": 1,
    "discard": "new",
    "discard_new_per_subject": True,
    "allow_rollup_hdrs": True,
}

CASES: list[tuple[str, dict[str, Any], list[Pub]]] = [
    ("commit", {}, [("x", b"1", B("a", 1)), ("y", b"2", B("a", 2)), ("x", b"3", B("a", 3, "1"))]),
    ("commit_alone", {}, [("x", b"1", B("a", 1, "1"))]),
    ("eob", {}, [("x", b"1", B("e", 1)), ("y", b"2", B("e", 2)), ("z", b"", B("e", 3, "eob"))]),
    ("eob_alone", {}, [("x", b"1", B("e", 1, "eob"))]),
    ("gap", {}, [("x", b"1", B("g", 1)), ("x", b"3", B("g", 3)), ("x", b"4", B("g", 4, "1"))]),
    ("unknown_batch", {}, [("x", b"1", B("u", 2)), ("x", b"1", B("u", 3, "1"))]),
    ("too_large_start", {}, [("x", b"1", B("t", 2000))]),
    ("missing_seq", {}, [("x", b"1", {"Nats-Batch-Id": "m"})]),
    ("bad_seq", {}, [("x", b"1", {"Nats-Batch-Id": "m", "Nats-Batch-Sequence": "x"})]),
    ("bad_commit", {}, [("x", b"1", B("c", 1)), ("x", b"2", B("c", 2, "yes")), ("x", b"3", B("c", 3, "1"))]),
    ("long_id", {}, [("x", b"1", B("i" * 65, 1, "1"))]),
    ("id_64", {}, [("x", b"1", B("i" * 64, 1, "1"))]),
    (
        "dup_in_batch",
        {},
        [("x", b"1", B("d", 1, Nats_Msg_Id="z")), ("x", b"2", B("d", 2, "1", Nats_Msg_Id="z"))],
    ),
    (
        "dup_of_stored",
        {},
        [("x", b"0", {"Nats-Msg-Id": "old"}), ("x", b"1", B("d", 1, "1", Nats_Msg_Id="old"))],
    ),
    ("expected_last_msg_id", {}, [("x", b"1", B("d", 1, "1", Nats_Expected_Last_Msg_Id="z"))]),
    (
        "expected_last_seq_first",
        {},
        [("x", b"1", B("s", 1, Nats_Expected_Last_Sequence="0")), ("x", b"2", B("s", 2, "1"))],
    ),
    ("expected_last_seq_wrong", {}, [("x", b"1", B("s", 1, "1", Nats_Expected_Last_Sequence="9"))]),
    (
        "expected_last_seq_second",
        {},
        [("x", b"1", B("s", 1)), ("x", b"2", B("s", 2, "1", Nats_Expected_Last_Sequence="1"))],
    ),
    (
        "expected_last_seq_second_wrong",
        {},
        [("x", b"1", B("s", 1)), ("x", b"2", B("s", 2, "1", Nats_Expected_Last_Sequence="7"))],
    ),
    (
        "expected_subject_seq_staged",
        {},
        [("x", b"1", B("s", 1)), ("x", b"2", B("s", 2, "1", Nats_Expected_Last_Subject_Sequence="0"))],
    ),
    (
        "expected_subject_seq_other",
        {},
        [("y", b"1", B("s", 1)), ("x", b"2", B("s", 2, "1", Nats_Expected_Last_Subject_Sequence="0"))],
    ),
    ("ttl_not_allowed", {}, [("x", b"1", B("t", 1)), ("x", b"2", B("t", 2, "1", Nats_TTL="5s"))]),
    ("too_big_message", {"max_msg_size": 4}, [("x", b"12345", B("b", 1, "1"))]),
    (
        "discard_new_full",
        {"max_msgs": 2, "discard": "new"},
        [("x", b"1", B("f", 1)), ("x", b"2", B("f", 2)), ("x", b"3", B("f", 3, "1"))],
    ),
    (
        "discard_new_fits",
        {"max_msgs": 3, "discard": "new"},
        [("x", b"1", B("f", 1)), ("x", b"2", B("f", 2)), ("x", b"3", B("f", 3, "1"))],
    ),
    (
        "limits_old",
        {"max_msgs": 2},
        [("x", b"1", B("f", 1)), ("x", b"2", B("f", 2)), ("x", b"3", B("f", 3, "1"))],
    ),
    (
        "interleaved",
        {},
        [
            ("x", b"a1", B("a", 1)),
            ("y", b"b1", B("b", 1)),
            ("x", b"a2", B("a", 2, "1")),
            ("y", b"b2", B("b", 2, "1")),
        ],
    ),
    ("plain_between", {}, [("x", b"a1", B("a", 1)), ("p", b"plain", {}), ("x", b"a2", B("a", 2, "1"))]),
    *[
        (
            f"discard_new_bytes_{storage}_{n}",
            {"max_bytes": n, "discard": "new", "storage": storage},
            [("x", b"1", B("f", 1)), ("x", b"2", B("f", 2, "1"))],
        )
        # one byte short of what the two take, as each store sizes a message, and just enough
        for storage, n in (("file", 221), ("file", 222), ("memory", 183), ("memory", 184))
    ],
    (
        "discard_new_with_stored",
        {"max_msgs": 2, "discard": "new"},
        [("x", b"0", {}), ("x", b"1", B("f", 1)), ("y", b"2", B("f", 2, "1"))],
    ),
    (
        "discard_new_eob",
        {"max_msgs": 2, "discard": "new"},
        [("x", b"1", B("f", 1)), ("y", b"2", B("f", 2)), ("y", b"", B("f", 3, "eob"))],
    ),
    (
        "discard_new_memory",
        {"max_msgs": 1, "discard": "new", "storage": "memory"},
        [("x", b"1", B("f", 1)), ("x", b"2", B("f", 2, "1"))],
    ),
    # each message is checked in turn, the limit last: a later message's error does not come first
    *[
        (
            f"discard_new_before_{label}",
            {"max_msgs": 1, "discard": "new"},
            [("x", b"1", B("f", 1, **first)), ("x", b"2", B("f", 2)), ("x", b"3", B("f", 3, "1", **last))],
        )
        for label, first, last in (
            ("expected_seq", {}, {"Nats_Expected_Last_Sequence": "9"}),
            ("expected_msg_id", {}, {"Nats_Expected_Last_Msg_Id": "z"}),
            ("dup_id", {"Nats_Msg_Id": "a"}, {"Nats_Msg_Id": "a"}),
            ("ttl", {}, {"Nats_TTL": "5s"}),
            ("after_expected_seq", {"Nats_Expected_Last_Sequence": "9"}, {}),
        )
    ],
    (
        "discard_new_bytes_before_expected_seq",
        {"max_bytes": 120, "discard": "new"},
        [
            ("x", b"1", B("f", 1)),
            ("x", b"2", B("f", 2)),
            ("x", b"3", B("f", 3, "1", Nats_Expected_Last_Sequence="9")),
        ],
    ),
    *[
        (f"per_subject_{label}", {**PER_SUBJECT, **extra}, pubs)
        for label, extra, pubs in (
            ("new", {}, [("x", b"1", B("f", 1)), ("x", b"2", B("f", 2, "1"))]),
            ("stored", {}, [("x", b"0", {}), ("x", b"2", B("f", 1, "1"))]),
            ("other", {}, [("x", b"1", B("f", 1)), ("y", b"2", B("f", 2, "1"))]),
            (
                "replaces",
                {"discard_new_per_subject": False},
                [("x", b"1", B("f", 1)), ("x", b"2", B("f", 2, "1"))],
            ),
            (
                "before_expected_seq",
                {},
                [
                    ("x", b"1", B("f", 1)),
                    ("x", b"2", B("f", 2)),
                    ("y", b"3", B("f", 3, "1", Nats_Expected_Last_Subject_Sequence="5")),
                ],
            ),
            # a rollup is not held to its subject's limit, but counts for the messages after it
            (
                "rollup_full",
                {},
                [("x", b"0", {}), ("x", b"1", B("f", 1, Nats_Rollup="sub")), ("y", b"2", B("f", 2, "1"))],
            ),
            (
                "rollup_then_same",
                {},
                [("x", b"1", B("f", 1, Nats_Rollup="sub")), ("x", b"2", B("f", 2, "1"))],
            ),
            ("rollup_second", {}, [("x", b"1", B("f", 1)), ("x", b"2", B("f", 2, "1", Nats_Rollup="sub"))]),
            ("rollup_plain", {}, [("x", b"0", {}), ("x", b"1", {"Nats-Rollup": "sub"})]),
        )
    ],
    (
        "discard_new_rollup_full",
        {"max_msgs": 1, "discard": "new", "allow_rollup_hdrs": True},
        [("x", b"0", {}), ("x", b"1", B("f", 1, "1", Nats_Rollup="sub"))],
    ),
    *[
        (f"rollup_{label}", {"allow_rollup_hdrs": True}, pubs)
        for label, pubs in (
            ("all_second", [("x", b"1", B("f", 1)), ("y", b"2", B("f", 2, "1", Nats_Rollup="all"))]),
            (
                "all_first",
                [("z", b"0", {}), ("x", b"1", B("f", 1, Nats_Rollup="all")), ("y", b"2", B("f", 2, "1"))],
            ),
            (
                "sub_first",
                [("x", b"0", {}), ("x", b"1", B("f", 1, Nats_Rollup="sub")), ("y", b"2", B("f", 2, "1"))],
            ),
            (
                "sub_other",
                [("x", b"0", {}), ("y", b"1", B("f", 1)), ("x", b"2", B("f", 2, "1", Nats_Rollup="sub"))],
            ),
            ("sub_again", [("x", b"1", B("f", 1)), ("x", b"2", B("f", 2, "1", Nats_Rollup="sub"))]),
        )
    ],
    # one message's checks in the server's order: the expected stream and TTL before the msg id,
    # the msg id before the expected sequences
    *[
        (
            f"order_{label}",
            config,
            [("x", b"1", B("f", 1, Nats_Msg_Id="a")), ("x", b"2", B("f", 2, "1", **last))],
        )
        for label, config, last in (
            ("ttl_then_dup_id", {}, {"Nats_Msg_Id": "a", "Nats_TTL": "5s"}),
            ("bad_ttl_then_dup_id", {"allow_msg_ttl": True}, {"Nats_Msg_Id": "a", "Nats_TTL": "x"}),
            ("stream_then_dup_id", {}, {"Nats_Msg_Id": "a", "Nats_Expected_Stream": "zz"}),
            ("ttl_then_expected_seq", {}, {"Nats_Expected_Last_Sequence": "1", "Nats_TTL": "5s"}),
        )
    ],
    (
        "order_stored_dup_then_expected_seq",
        {},
        [
            ("x", b"0", {"Nats-Msg-Id": "old"}),
            ("x", b"1", B("d", 1, "1", Nats_Msg_Id="old", Nats_Expected_Last_Sequence="9")),
        ],
    ),
    ("resent_first", {}, [("x", b"1", B("r", 1)), ("x", b"1", B("r", 1))]),
    ("eob_after_gap", {}, [("x", b"1", B("g", 1)), ("x", b"", B("g", 3, "eob"))]),
    ("bad_commit_first", {}, [("x", b"1", B("c", 1, "yes"))]),
    ("api_level_above", {}, [("x", b"1", B("a", 1)), ("x", b"2", B("a", 2, Nats_Required_Api_Level="99"))]),
    ("api_level_above_first", {}, [("x", b"1", B("a", 1, "1", Nats_Required_Api_Level="x"))]),
    (
        "api_level_met",
        {},
        [("x", b"1", B("a", 1, Nats_Required_Api_Level="1")), ("x", b"2", B("a", 2, "1"))],
    ),
]


@pytest.mark.parametrize(("label", "config", "pubs"), CASES, ids=[c[0] for c in CASES])
async def test_atomic_batches(
    targets: dict[str, str], unique: str, label: str, config: dict[str, Any], pubs: list[Pub]
) -> None:
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        abandoned = await nc.subscribe(f"{ABANDONED}.{name}")
        created = await api(
            nc,
            f"STREAM.CREATE.{name}",
            {"name": name, "subjects": [f"{p}.>"], "allow_atomic": True, **config},
        )
        assert "error" not in created, created
        seen: list[Any] = []
        for suffix, data, headers in pubs:
            reply = await nc.request(f"{p}.{suffix}", data, headers=headers or None, timeout=5)
            body = json.loads(reply.data) if reply.data else ""
            state = (await api(nc, f"STREAM.INFO.{name}"))["state"]
            seen.append([body, state["messages"], state["last_seq"]])
        stored = []
        for seq in range(1, seen[-1][2] + 1):
            got = await api(nc, f"STREAM.MSG.GET.{name}", {"seq": seq})
            if "message" in got:
                m = got["message"]
                hdrs = base64.b64decode(m["hdrs"]).decode() if m.get("hdrs") else ""
                stored.append([m["subject"], hdrs, m.get("data", "")])
        return [seen, stored, await _advisories(abandoned)]

    await assert_same(targets, case, unique)


ABANDONED = "$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED"


def _advisory(msg: Msg) -> list[Any]:
    """An advisory's subject, its fields in order, and their values but the id and time."""
    body = json.loads(msg.data)
    return [msg.subject, list(body), {k: v for k, v in body.items() if k not in ("id", "timestamp")}]


async def _advisories(sub: Subscription) -> list[Any]:
    """The advisories ``sub`` has received: both servers send one before the answer to the
    publish that caused it, and an API answer after it, so those received by now are all."""
    return [_advisory(await sub.next_msg(1)) for _ in range(sub.pending_msgs)]


async def test_a_stream_without_allow_atomic_refuses_batches(targets: dict[str, str], unique: str) -> None:
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{p}.>"]})
        out = []
        for headers in (B("a", 1), {"Nats-Batch-Id": "a"}, B("a", 1, "1")):
            out.append(json.loads((await nc.request(f"{p}.x", b"1", headers=headers, timeout=5)).data))
        return out

    await assert_same(targets, case, unique)


CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("allow_atomic", {"allow_atomic": True}),
    ("atomic_async", {"allow_atomic": True, "persist_mode": "async"}),
    ("mirror_atomic", {"allow_atomic": True, "mirror": {"name": "X"}, "subjects": None}),
]


@pytest.mark.parametrize(("label", "extra"), CONFIGS, ids=[c[0] for c in CONFIGS])
async def test_allow_atomic_configs(
    targets: dict[str, str], unique: str, label: str, extra: dict[str, Any]
) -> None:
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        req = {"name": name, "subjects": [f"{p}.>"], **extra}
        created = await api(nc, f"STREAM.CREATE.{name}", req)
        turned_off = await api(nc, f"STREAM.UPDATE.{name}", {**req, "allow_atomic": False})
        return [created, turned_off if "error" not in created else None]

    await assert_same(targets, case, unique)


async def test_an_idle_batch_times_out(targets: dict[str, str], unique: str) -> None:
    """Ten seconds after its last message a held batch is abandoned (advisory ``timeout``, sent by
    the clock, not by the next message); its next message is of an unknown batch (10176)."""
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        abandoned = await nc.subscribe(f"{ABANDONED}.{name}")
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{p}.>"], "allow_atomic": True})
        replies = [(await nc.request(f"{p}.x", b"1", headers=B("t", 1), timeout=5)).data.decode()]
        replies.append((await nc.request(f"{p}.x", b"1", headers=B("k", 1), timeout=5)).data.decode())
        await asyncio.sleep(6)
        replies.append((await nc.request(f"{p}.x", b"2", headers=B("k", 2), timeout=5)).data.decode())
        timed_out = _advisory(await abandoned.next_msg(10))  # "t", about 10 s after its message
        replies.append((await nc.request(f"{p}.x", b"2", headers=B("t", 2, "1"), timeout=5)).data.decode())
        replies.append((await nc.request(f"{p}.x", b"3", headers=B("k", 3, "1"), timeout=5)).data.decode())
        state = (await api(nc, f"STREAM.INFO.{name}"))["state"]
        return [replies, timed_out, await _advisories(abandoned), state["messages"]]

    await assert_same(targets, case, unique)


async def test_a_batch_past_1000_messages_is_abandoned(targets: dict[str, str], unique: str) -> None:
    """The 1,001st message abandons its batch (10199, advisory ``large``); 1,000 and an ``eob``
    commit."""
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        abandoned = await nc.subscribe(f"{ABANDONED}.{name}")
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{p}.>"], "allow_atomic": True})
        replies = []
        for batch, commit in (("big", "1"), ("fits", "eob")):
            for seq in range(1, 1001):
                await nc.publish(f"{p}.x", b"m", headers=B(batch, seq))
            last = await nc.request(f"{p}.x", b"m", headers=B(batch, 1001, commit), timeout=5)
            replies.append(last.data.decode())
        state = (await api(nc, f"STREAM.INFO.{name}"))["state"]
        return [replies, await _advisories(abandoned), state["messages"]]

    await assert_same(targets, case, unique)


async def test_turning_allow_atomic_off_drops_held_batches(targets: dict[str, str], unique: str) -> None:
    """Off: the stream's held batches go, without an advisory, and its batch messages are refused
    (10174); on again, the next message of a batch held before is of an unknown batch (10176). A
    deleted stream's batches go without an advisory too."""
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        abandoned = await nc.subscribe(f"{ABANDONED}.{name}")
        req = {"name": name, "subjects": [f"{p}.>"], "allow_atomic": True}
        await api(nc, f"STREAM.CREATE.{name}", req)
        replies = [(await nc.request(f"{p}.x", b"1", headers=B("o", 1), timeout=5)).data.decode()]
        await api(nc, f"STREAM.UPDATE.{name}", {**req, "allow_atomic": False})
        replies.append((await nc.request(f"{p}.x", b"1", headers=B("n", 1), timeout=5)).data.decode())
        await api(nc, f"STREAM.UPDATE.{name}", req)
        replies.append((await nc.request(f"{p}.x", b"2", headers=B("o", 2, "1"), timeout=5)).data.decode())
        replies.append((await nc.request(f"{p}.x", b"1", headers=B("d", 1), timeout=5)).data.decode())
        await api(nc, f"STREAM.DELETE.{name}")
        await api(nc, f"STREAM.CREATE.{name}", req)
        replies.append((await nc.request(f"{p}.x", b"2", headers=B("d", 2, "1"), timeout=5)).data.decode())
        state = (await api(nc, f"STREAM.INFO.{name}"))["state"]
        return [replies, await _advisories(abandoned), state["messages"]]

    await assert_same(targets, case, unique)


def test_a_batch_past_its_idle_time_is_abandoned_whoever_finds_it() -> None:
    """The timer's ``expire`` abandons an idle batch (``timeout``) and leaves a batch that is not
    idle yet; a message that finds its batch past the idle time before the timer did abandons it
    as the server does when its timer could not be reset (``incomplete``)."""
    batches = AtomicBatches()
    hdrs = b"NATS/1.0\r\nNats-Batch-Id: %s\r\nNats-Batch-Sequence: %d\r\n\r\n"
    first = batches.hold("S", "s.x", hdrs % (b"a", 1), b"", 0)
    assert first == Held("a", IDLE_TIMEOUT_NS)
    assert batches.hold("S", "s.x", hdrs % (b"b", 1), b"", 0) == Held("b", IDLE_TIMEOUT_NS)
    assert batches.expire("S", "a", IDLE_TIMEOUT_NS) is None  # not idle for longer yet
    assert batches.expire("S", "a", IDLE_TIMEOUT_NS + 1) == Abandoned("S", "a", "timeout")
    assert batches.expire("S", "a", IDLE_TIMEOUT_NS + 2) is None  # gone: announced once
    late = batches.hold("S", "s.x", hdrs % (b"b", 2), b"", IDLE_TIMEOUT_NS + 1)
    assert late == Dropped(errors.ATOMIC_PUBLISH_INCOMPLETE, Abandoned("S", "b", "incomplete"))
    assert batches.expire("S", "b", IDLE_TIMEOUT_NS + 2) is None
