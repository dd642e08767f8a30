"""Fast batch publish (``allow_batched``, ADR-50 fast ingest) on the real JetStream and on jetlake:
the same messages with the same ``….$FI`` reply subjects get the same answers on the batch's inbox
(flow acks at the server's cadence, gap and error reports, the final PubAck with ``batch`` and
``count``, every refusal), in the same order, and leave the same stream state and stored messages.

Each case ends by pinging every batch it used (operation 4 at batch sequence 1, which changes
nothing): the ping is answered after everything before it (a flow ack if the batch lives, 10208 if
it ended), so its answer tells the case that all answers are in, without waiting on a clock."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from gateway.adapters.publish import PublishPath
from gateway.adapters.registry import Registry
from gateway.api import errors
from gateway.api.configs import StreamConfig
from gateway.engine.fast_batch import FastBatches, FastRef, FlowAck, Refused, parse_reply
from gateway.engine.stream import Stream
from gateway.wire.leaf import LeafConnection
from gateway.wire.protocol import Msg as LeafMsg
from storage_delta.commit.writer import GroupCommitWriter, StoredMessage
from tests.differential import api, assert_same
from tests.harness import Jetlake

# A publish: subject suffix, payload, headers, reply tail (after the inbox prefix).
Pub = tuple[str, bytes, dict[str, str] | None, str]


def F(batch: str, seq: int, op: int, flow: int = 10, gap: str = "ok") -> str:
    return f"{batch}.{flow}.{gap}.{seq}.{op}.$FI"


def run_of(
    batch: str, ops: list[tuple[int, int]], flow: int = 10, gap: str = "ok", **hdrs: dict[str, str]
) -> list[Pub]:
    """Messages of one batch, ``(seq, op)`` each; ``hdrs`` by ``s<seq>``."""
    return [("x", b"m%d" % seq, hdrs.get(f"s{seq}"), F(batch, seq, op, flow, gap)) for seq, op in ops]


def appended(batch: str, n: int, last_op: int, flow: int = 10, gap: str = "ok") -> list[Pub]:
    """A batch of ``n`` messages started, appended to, and ended by ``last_op`` at ``n``."""
    ops = [(1, 0), *((s, 1) for s in range(2, n)), (n, last_op)]
    return run_of(batch, ops, flow, gap)


WRONG = {"Nats-Expected-Last-Sequence": "99"}
DUP = {"Nats-Msg-Id": "a"}
FULL = {"allow_batched": True, "max_msgs": 2, "discard": "new"}
FOUR = [(1, 0), (2, 1), (3, 1), (4, 2)]
A = {"allow_batched": True}

TWO_BATCHES = [*run_of("a", [(1, 0), (2, 1), (3, 1)], 20), *run_of("b", [(1, 0)], 20)]
for _s in range(4, 21):
    TWO_BATCHES += run_of("a", [(_s, 1)], 20) + run_of("b", [(_s - 2, 1)], 20)

CASES: list[tuple[str, dict[str, Any], list[Pub]]] = [
    # five messages, the last commits and is stored; flow 2: acks after 0, 2, 4
    ("commit", A, appended("b", 5, 2, flow=2)),
    # 25 messages then an end-of-batch (op 3, not stored); flow 10: acks at 0, 10, 20
    ("eob", A, appended("b", 26, 3)),
    # one message that commits at once: only the PubAck
    ("commit_alone", A, run_of("c", [(1, 2)])),
    # flow 3 over eleven messages
    ("flow_3", A, appended("f", 12, 3, flow=3)),
    # a flow above 500 is served as 500; 0, negative and non-numbers as 10
    ("flow_600", A, run_of("f", [(1, 0)], flow=600)),
    ("flow_0", A, [("x", b"m", None, "f.0.ok.1.0.$FI")]),
    ("flow_word", A, [("x", b"m", None, "f.abc.ok.1.0.$FI")]),
    # a second batch on the stream starts at one message per ack and doubles towards the flow
    ("two_batches", A, TWO_BATCHES),
    # gap allowed: reported, the batch goes on; the PubAck counts the batch sequence
    ("gap_ok", A, run_of("g", [(1, 0), (2, 1), (5, 1), (6, 2)], flow=2)),
    # gap not allowed: reported, the batch ends with what it stored; later messages are unknown
    ("gap_fail", A, run_of("g", [(1, 0), (2, 1), (5, 1), (6, 2)], flow=2, gap="fail")),
    # a sequence seen before ends the batch
    ("backward", A, run_of("g", [(1, 0), (2, 1), (3, 1), (2, 1), (4, 2)], flow=2)),
    # the batch id started again ends the batch
    ("restart", A, run_of("r", [(1, 0), (2, 1), (1, 0), (2, 1), (3, 2)])),
    # a batch never started: 10208
    ("unknown", A, run_of("u", [(3, 1)])),
    # after the commit the id is unknown, and a new batch of it can start
    ("after_commit", A, run_of("c", [(1, 0), (2, 2), (3, 1), (1, 2)])),
    # patterns the server refuses (10206): operation 5, sequence 0, start at 2, append at 1,
    # end of batch at 1, gap word, no token before the id, a sign
    ("bad_op", A, [("x", b"m", None, "b.10.ok.1.5.$FI")]),
    ("bad_seq_0", A, [("x", b"m", None, "b.10.ok.0.0.$FI")]),
    ("bad_start_2", A, [("x", b"m", None, "b.10.ok.2.0.$FI")]),
    ("bad_append_1", A, [("x", b"m", None, "b.10.ok.1.1.$FI")]),
    ("bad_eob_1", A, [("x", b"m", None, "b.10.ok.1.3.$FI")]),
    ("bad_gap", A, [("x", b"m", None, "b.10.maybe.1.0.$FI")]),
    ("bad_seq_sign", A, [("x", b"m", None, "b.10.ok.+1.0.$FI")]),
    ("bad_seq_max", A, [("x", b"m", None, "b.10.ok.18446744073709551615.1.$FI")]),
    # leading zeros are numbers; a flow past int64 wraps as Go's parser wraps it
    ("zeros", A, [("x", b"m", None, "b.10.ok.01.00.$FI")]),
    ("many_zeros", A, [("x", b"m", None, f"b.10.ok.{'0' * 30}1.0.$FI")]),
    ("flow_wraps", A, [("x", b"m", None, "b.18446744073709551916.ok.1.0.$FI")]),
    ("flow_wraps_negative", A, [("x", b"m", None, f"b.{'9' * 99}.ok.1.0.$FI")]),
    # not the suffix (case, extra token): an ordinary publish
    ("not_fast", A, [("x", b"m", None, "b.10.ok.1.0.$fi"), ("x", b"m", None, "b.10.ok.1.0.$FI.x")]),
    # ids up to 64 characters (10207 above)
    ("id_65", A, run_of("i" * 65, [(1, 0)])),
    ("id_64", A, run_of("i" * 64, [(1, 2)])),
    # a stream without allow_batched: 10205, before the pattern is looked at
    ("disabled", {}, [*run_of("b", [(1, 0)]), ("x", b"m", None, "b.10.ok.1.5.$FI")]),
    # max_msg_size is checked first (10054)
    ("too_big", {**A, "max_msg_size": 1}, run_of("m", [(1, 0), (2, 1), (3, 2)])),
    ("too_big_disabled", {"max_msg_size": 1}, run_of("m", [(1, 0)])),
    # a failed header check: reported (ok goes on, fail ends the batch with what it stored)
    ("err_mid_ok", A, run_of("e", [(1, 0), (2, 1), (3, 1), (4, 1), (5, 2)], flow=2, s3=WRONG)),
    ("err_mid_fail", A, run_of("e", [(1, 0), (2, 1), (3, 1), (4, 1), (5, 2)], flow=2, gap="fail", s3=WRONG)),
    # on the first message: ok reports it; fail answers as a plain publish would
    ("err_first_ok", A, run_of("e", [(1, 0), (2, 1), (3, 2)], flow=2, s1=WRONG)),
    ("err_first_fail", A, run_of("e", [(1, 0), (2, 1), (3, 2)], flow=2, gap="fail", s1=WRONG)),
    # on the commit: reported, and the batch ends without it
    ("err_commit", A, run_of("e", [(1, 0), (2, 1), (3, 2)], flow=2, s3=WRONG)),
    ("err_alone_ok", A, run_of("e", [(1, 2)], s1=WRONG)),
    ("err_alone_fail", A, run_of("e", [(1, 2)], gap="fail", s1=WRONG)),
    # duplicate msg ids count as stored and end nothing
    (
        "duplicates",
        A,
        run_of(
            "d",
            [(1, 0), (2, 1), (3, 1), (4, 1), (5, 2)],
            flow=2,
            s1={"Nats-Msg-Id": "a"},
            s2={"Nats-Msg-Id": "a"},
            s3={"Nats-Msg-Id": "a"},
            s4={"Nats-Msg-Id": "b"},
            s5={"Nats-Msg-Id": "b"},
        ),
    ),
    # a batch of one duplicate: its PubAck says so
    (
        "dup_alone_fail",
        A,
        [("x", b"0", DUP, ""), *run_of("d", [(1, 2)], gap="fail", s1=DUP)],
    ),
    (
        "dup_alone_ok",
        A,
        [("x", b"0", DUP, ""), *run_of("d", [(1, 2)], s1=DUP)],
    ),
    # a full discard-new stream refuses like a failed check
    (
        "full_ok",
        FULL,
        run_of("d", FOUR, flow=2),
    ),
    (
        "full_fail",
        FULL,
        run_of("d", FOUR, flow=2, gap="fail"),
    ),
    # pings: resend the last ack, report a gap (ok takes it, fail ends the batch), unknown batches
    ("ping", A, run_of("p", [(1, 0), (2, 1), (3, 1), (3, 4), (4, 1), (6, 4), (7, 2)], flow=2)),
    ("ping_gap_fail", A, run_of("p", [(1, 0), (2, 1), (3, 1), (5, 4), (6, 1)], flow=2, gap="fail")),
    ("ping_unknown", A, run_of("p", [(3, 4)])),
    # Nats-Required-Api-Level: too high ends the batch (412/10185); otherwise it is not stored
    ("api_level_high", A, run_of("a", [(1, 0), (2, 1), (3, 2)], s2={"Nats-Required-Api-Level": "99"})),
    ("api_level_ok", A, run_of("a", [(1, 0), (2, 1), (3, 2)], s2={"Nats-Required-Api-Level": "1"})),
    # batch headers of an atomic batch are stored as they are
    (
        "atomic_headers",
        {**A, "allow_atomic": True},
        run_of("h", [(1, 0), (2, 2)], s1={"Nats-Batch-Id": "z", "Nats-Batch-Sequence": "1", "a": "b"}),
    ),
    # no_ack: no first flow ack and no refusals, but the batch's own answers
    ("no_ack", {**A, "no_ack": True}, run_of("n", [(1, 0), (2, 1), (3, 1), (5, 1), (6, 1)], flow=2)),
    # an ordinary publish in the middle takes the next stream sequence
    ("plain_between", A, [*run_of("i", [(1, 0)]), ("y", b"p", None, "plain"), *run_of("i", [(2, 2)])]),
]


async def _fast_case(nc: Client, name: str, prefix: str, config: dict[str, Any], pubs: list[Pub]) -> Any:
    created = await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{prefix}.>"], **config})
    assert "error" not in created, created
    inbox = nc.new_inbox()
    answers: list[list[str]] = []
    # every batch the case names, or one it does not (answered 10208, or as the stream refuses it)
    probes = sorted({t.split(".")[-6] for *_, t in pubs if t.endswith(".$FI") and t.count(".") >= 5}) or [
        "zz"
    ]
    done = asyncio.Event()

    async def on_answer(msg: Msg) -> None:
        answers.append([msg.subject[len(inbox) + 1 :], msg.data.decode()])
        if msg.subject.startswith(f"{inbox}.probe.") and sum(
            a[0].startswith("probe.") for a in answers
        ) == len(probes):
            done.set()

    sub = await nc.subscribe(f"{inbox}.>", cb=on_answer)
    for suffix, data, headers, tail in pubs:
        reply = f"{inbox}.{tail}" if tail else ""
        await nc.publish(f"{prefix}.{suffix}", data, reply=reply, headers=headers)
    for batch in probes:
        await nc.publish(f"{prefix}.x", b"", reply=f"{inbox}.probe.{F(batch, 1, 4)}")
    await asyncio.wait_for(done.wait(), 10)
    await sub.unsubscribe()
    state = (await api(nc, f"STREAM.INFO.{name}"))["state"]
    stored = []
    for seq in range(max(1, state["first_seq"]), state["last_seq"] + 1):
        m = (await api(nc, f"STREAM.MSG.GET.{name}", {"seq": seq}))["message"]
        hdrs = base64.b64decode(m["hdrs"]).decode() if m.get("hdrs") else ""
        stored.append([m["subject"], hdrs, m.get("data", "")])
    return [answers, state["messages"], state["last_seq"], stored]


@pytest.mark.parametrize(("label", "config", "pubs"), CASES, ids=[c[0] for c in CASES])
async def test_fast_batches(
    targets: dict[str, str], unique: str, label: str, config: dict[str, Any], pubs: list[Pub]
) -> None:
    async def case(nc: Client, name: str) -> Any:
        return await _fast_case(nc, name, unique.lower(), config, pubs)

    await assert_same(targets, case, unique)


async def test_a_config_with_allow_batched(targets: dict[str, str], unique: str) -> None:
    """Accepted and echoed (``_nats.req.level`` 4), with async persistence and with allow_atomic
    too; refused on a mirror (10209); turned off and on by updates."""
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        out = []
        for extra in ({"persist_mode": "async"}, {"allow_atomic": True}, {"sources": [{"name": "O"}]}):
            out.append(
                await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{p}.>"], **A, **extra})
            )
            await api(nc, f"STREAM.DELETE.{name}")
        mirror = {"name": name, "mirror": {"name": "O"}, **A}
        out.append(await api(nc, f"STREAM.CREATE.{name}", mirror))
        req = {"name": name, "subjects": [f"{p}.>"]}
        out.append(await api(nc, f"STREAM.CREATE.{name}", req))
        out.append(await api(nc, f"STREAM.UPDATE.{name}", {**req, **A}))
        out.append(await api(nc, f"STREAM.UPDATE.{name}", req))
        return out

    await assert_same(targets, case, unique)


async def _answer_to(nc: Client, subject: str, reply: str) -> Any:
    """Publish one message with ``reply`` and read the one answer it gets."""
    sub = await nc.subscribe(reply, max_msgs=1)
    await nc.publish(subject, b"m", reply=reply)
    return json.loads((await sub.next_msg(5)).data)


async def test_turning_allow_batched_off_ends_the_batches(targets: dict[str, str], unique: str) -> None:
    """Off: 10205; on again: the batch is gone (10208)."""
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        req = {"name": name, "subjects": [f"{p}.>"], **A}
        await api(nc, f"STREAM.CREATE.{name}", req)
        inbox = nc.new_inbox()
        answers = []
        for step, tail in enumerate([F("t", 1, 0), F("t", 2, 1), F("t", 3, 1)]):
            if step:
                await api(nc, f"STREAM.UPDATE.{name}", {**req, "allow_batched": step == 2})
            answers.append(await _answer_to(nc, f"{p}.x", f"{inbox}.{tail}"))
        return answers

    await assert_same(targets, case, unique)


async def test_a_stream_holds_at_most_1000_fast_batches(targets: dict[str, str], unique: str) -> None:
    """The 1,001st batch in flight is refused (429/10211) until one ends."""
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{p}.>"], **A})
        inbox = nc.new_inbox()
        refused: list[str] = []
        done = asyncio.Event()

        async def on_answer(msg: Msg) -> None:
            if b"error" in msg.data or b'"batch"' in msg.data:
                refused.append(f"{msg.subject[len(inbox) + 1 :]} {msg.data.decode()}")
            if msg.subject.endswith(F("last", 1, 2)):
                done.set()

        await nc.subscribe(f"{inbox}.>", cb=on_answer)
        for i in range(1001):
            await nc.publish(f"{p}.x", b"", reply=f"{inbox}.{F(f'b{i}', 1, 0)}")
        for tail in (F("b5", 2, 2), F("new", 1, 0), F("last", 1, 2)):
            await nc.publish(f"{p}.x", b"", reply=f"{inbox}.{tail}")
        await asyncio.wait_for(done.wait(), 20)
        return refused

    await assert_same(targets, case, unique)


def test_an_idle_batch_is_gone_after_10_s() -> None:
    """The server's cleanup timer: ten seconds without a message and the batch is unknown; its id
    may start again."""
    fast = FastBatches()
    first = parse_reply("in.b.10.ok.1.0.$FI")
    later = parse_reply("in.b.10.ok.2.1.$FI")
    assert isinstance(first, FastRef)
    assert isinstance(later, FastRef)
    s = 1_000_000_000
    assert fast.begin("S", first, None, False, 0).answers == [FlowAck(0, 10)]
    fast.stored("S", first, 1)
    assert fast.begin("S", later, None, False, 10 * s).store  # 10 s is not yet idle too long
    fast.stored("S", later, 2)
    assert fast.begin("S", later, None, False, 20 * s + 1).answers == [
        Refused(errors.BATCH_PUBLISH_UNKNOWN_ID)
    ]
    assert fast.begin("S", first, None, False, 20 * s + 2).answers == [FlowAck(0, 10)]


class _Writer:
    """The group-commit writer's face to the publish path, with commits the test lands by hand."""

    def __init__(self) -> None:
        self.commits: list[asyncio.Future[None]] = []

    def admit(self, size: int, count: int = 1) -> None:
        pass

    def unadmit(self, size: int) -> None:
        pass

    def submit(self, messages: list[StoredMessage], admitted: bool = False) -> asyncio.Future[None]:
        self.commits.append(asyncio.get_running_loop().create_future())
        return self.commits[-1]


class _Leaf:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def publish(self, subject: str, data: bytes, hdrs: bytes | None = None) -> None:
        self.sent.append(data.decode())

    def publish_many(self, msgs: list[tuple[str, bytes]]) -> None:
        self.sent += [data.decode() for _, data in msgs]


async def test_no_answer_leaves_before_the_commit_it_speaks_for() -> None:
    """Flow acks and the PubAck wait for the commit holding the messages; a ping that stores
    nothing waits for the stream's commit in flight; a failed commit turns the answers into
    errors and ends the batch."""
    stream = Stream(StreamConfig("S", subjects=("s.>",), allow_batched=True), 1, 1 << 20)
    writer, leaf = _Writer(), _Leaf()
    registry = SimpleNamespace(route=lambda subject: stream)
    parts = (cast(Registry, registry), cast(GroupCommitWriter, writer), cast(LeafConnection, leaf))
    path = PublishPath(*parts, lambda stored: None, "")

    def send(tail: str) -> None:
        path.on_publish(LeafMsg("s.x", f"in.{tail}", None, b"m"))

    async def land(commit: asyncio.Future[None], exc: BaseException | None = None) -> None:
        if exc is None:
            commit.set_result(None)
        else:
            commit.set_exception(exc)
        await asyncio.sleep(0)  # its callbacks run

    for seq in (1, 2, 3):
        send(F("b", seq, 0 if seq == 1 else 1, flow=2))
    path.flush()
    assert leaf.sent == []
    await land(writer.commits[0])
    assert leaf.sent == ['{"type":"ack","seq":0,"msgs":2}', '{"type":"ack","seq":2,"msgs":2}']
    send(F("b", 4, 1, flow=2))
    path.flush()
    send(F("b", 1, 4, flow=2))  # a ping: stores nothing, answers after commit 1
    path.flush()
    assert len(writer.commits) == 2
    assert len(leaf.sent) == 2
    await land(writer.commits[1])
    assert leaf.sent[2:] == ['{"type":"ack","seq":4,"msgs":2}', '{"type":"ack","seq":4,"msgs":2}']
    send(F("b", 5, 1, flow=2))
    send(F("b", 6, 1, flow=2))
    path.flush()
    await land(writer.commits[2], OSError("disk gone"))
    assert [json.loads(a)["error"]["err_code"] for a in leaf.sent[4:]] == [10077]
    send(F("b", 7, 2, flow=2))
    path.flush()
    assert json.loads(leaf.sent[-1])["error"]["err_code"] == 10208


async def test_a_batch_idle_for_10_s_is_gone(targets: dict[str, str], unique: str) -> None:
    """Ten seconds without a message end a batch (10208 after; its id can start again); a message
    within them keeps it. Margins of several seconds either side of the limit. No BATCH_ABANDONED
    advisory: the server sends it for atomic batches only."""
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        abandoned = await nc.subscribe(f"$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED.{name}")
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{p}.>"], **A})
        inbox = nc.new_inbox()
        answers: list[str] = []
        done = asyncio.Event()

        async def on_answer(msg: Msg) -> None:
            answers.append(f"{msg.subject[len(inbox) + 1 :]} {msg.data.decode()}")
            if msg.subject.endswith(F("a", 1, 4)):
                done.set()

        await nc.subscribe(f"{inbox}.>", cb=on_answer)
        for tail in (F("a", 1, 0), F("b", 1, 0)):
            await nc.publish(f"{p}.x", b"", reply=f"{inbox}.{tail}")
        await asyncio.sleep(6)
        await nc.publish(f"{p}.x", b"", reply=f"{inbox}.{F('a', 2, 1)}")
        await asyncio.sleep(6)
        for tail in (F("b", 2, 1), F("b", 1, 0), F("a", 1, 4)):
            await nc.publish(f"{p}.x", b"", reply=f"{inbox}.{tail}")
        await asyncio.wait_for(done.wait(), 10)
        await api(nc, f"STREAM.INFO.{name}")  # an advisory would have come before its answer
        return [answers, abandoned.pending_msgs]

    await assert_same(targets, case, unique)


async def test_a_sealed_stream_refuses_fast_batches(targets: dict[str, str], unique: str) -> None:
    """400/10109, before anything else is looked at."""
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        req = {"name": name, "subjects": [f"{p}.>"], **A}
        await api(nc, f"STREAM.CREATE.{name}", req)
        await api(nc, f"STREAM.UPDATE.{name}", {**req, "sealed": True})
        inbox = nc.new_inbox()
        tails = (F("s", 1, 0), "s.10.ok.1.9.$FI")
        return [await _answer_to(nc, f"{p}.x", f"{inbox}.{tail}") for tail in tails]

    await assert_same(targets, case, unique)


async def _stream_until_killed(gw: Jetlake, kill_after_s: float) -> int:
    """Stream one fast batch (gap ``fail``, flow 10, two acks outstanding) until the gateway is
    killed; the highest batch sequence a flow ack vouched for."""
    async with await nats.connect(gw.url) as nc:
        await api(nc, "STREAM.CREATE.KILLED", {"name": "KILLED", "subjects": ["killed.>"], **A})
        inbox = nc.new_inbox()
        acked, step = 0, 10
        moved = asyncio.Event()

        async def on_answer(msg: Msg) -> None:
            nonlocal acked, step
            body = json.loads(msg.data)
            assert body.get("type") == "ack", body
            acked, step = max(acked, body["seq"]), body["msgs"]
            moved.set()

        await nc.subscribe(f"{inbox}.>", cb=on_answer)
        killer = asyncio.get_running_loop().call_later(kill_after_s, gw.kill_gateway)
        seq = 0
        try:
            while True:
                seq += 1
                await nc.publish(
                    "killed.x", b"%d" % seq, reply=f"{inbox}.{F('k', seq, min(seq - 1, 1), 10, 'fail')}"
                )
                while (seq == 1 and not moved.is_set()) or acked + step * 2 <= seq:
                    moved.clear()
                    await asyncio.wait_for(moved.wait(), 2)
        except TimeoutError:  # the gateway is gone
            pass
        finally:
            killer.cancel()
    return acked


@pytest.mark.slow
def test_kill_9_keeps_every_message_a_flow_ack_vouched_for(tmp_path: Path) -> None:
    """A flow ack for batch sequence N means 1..N are durable: after ``kill -9`` they are all there."""
    gw = Jetlake(tmp_path)
    gw.start()
    try:
        acked = asyncio.run(_stream_until_killed(gw, 1.5))
        assert acked > 10, "the batch made no progress before the kill"
        gw.start_gateway()

        async def read_back() -> list[Any]:
            async with await nats.connect(gw.url) as nc:
                state = (await api(nc, "STREAM.INFO.KILLED"))["state"]
                got = []
                for seq in sorted({1, acked // 2, acked}):
                    m = (await api(nc, "STREAM.MSG.GET.KILLED", {"seq": seq}))["message"]
                    got.append(base64.b64decode(m["data"]).decode())
                return [state["first_seq"], state["messages"] >= acked, got]

        assert asyncio.run(read_back()) == [1, True, [str(s) for s in sorted({1, acked // 2, acked})]]
    finally:
        gw.stop()


def test_50000_fast_batches_in_all() -> None:
    """Beyond a stream's 1,000, the gateway holds 50,000 fast batches in all (429/10211); an ended
    batch frees its place."""
    fast = FastBatches()
    for i in range(50_000):
        ref = parse_reply(f"in.b{i % 1000}.10.ok.1.0.$FI")
        assert isinstance(ref, FastRef)
        assert fast.begin(f"S{i // 1000}", ref, None, False, 0).store
    one_more = parse_reply("in.x.10.ok.1.2.$FI")
    assert isinstance(one_more, FastRef)
    refused = fast.begin("T", one_more, None, False, 0)
    assert refused.answers == [Refused(errors.BATCH_PUBLISH_TOO_MANY_INFLIGHT)]
    fast.forget_stream("S7")
    assert fast.begin("T", one_more, None, False, 0).store
