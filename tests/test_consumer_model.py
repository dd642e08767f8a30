"""The consumer state machine on its own (no servers): each transition's effect on the numbers,
and num_pending kept incrementally equal to a full recount under random work."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from gateway.api.consumer_config import normalize
from gateway.api.pull import PullRequest
from gateway.api.stream_config import normalize as stream_normalize
from gateway.engine.consumer import Consumer, PullRequestQueue, start_position
from gateway.engine.stream import Stream

NS = 1_000_000_000


def _stream(n: int, subjects: int = 3) -> Stream:
    stream = Stream(stream_normalize({"name": "M", "subjects": ["m.>"]}, "2.15.1"), 1, 1 << 20)
    for i in range(n):
        _add(stream, f"m.s{i % subjects}", i)
    return stream


def _add(stream: Stream, subject: str, i: int) -> None:
    msg = stream.accept(subject, None, str(i).encode(), (i + 1) * NS)
    stream.committed(msg.seq)


def _consumer(stream: Stream, **cfg: Any) -> Consumer:
    config = normalize({"durable_name": "c", "ack_policy": "explicit", **cfg}, "2.15.1")
    after, skip = start_position(stream, config, None)
    return Consumer(stream, config, 0, after, skip)


def _take(c: Consumer, now: int = 0) -> int:
    seq = c.next_seq()
    assert seq is not None
    done = c.deliver(seq, now)
    assert done is not None
    return done.seq


def test_ack_floor_and_redelivery_order() -> None:
    """Acks in order move the floor; a gap holds it; a nak'd message is delivered next."""
    c = _consumer(_stream(5))
    seqs = [_take(c) for _ in range(4)]
    assert seqs == [1, 2, 3, 4]
    c.ack(1, 1, 0)
    assert (c.ack_floor_cseq, c.ack_floor_sseq) == (1, 1)
    c.ack(3, 3, 0)
    assert (c.ack_floor_cseq, c.ack_floor_sseq) == (1, 1)
    assert c.nak(2, 0, 0)
    assert _take(c) == 2
    assert c.num_redelivered() == 1
    assert c.num_pending() == 1


def test_redelivery_queue_as_the_servers() -> None:
    """Plain naks queue in the order they came (a backoff does not hold them back); a nak with a
    delay takes its message off the queue; what one timer run finds expired is queued in stream
    order, as the server's checkPending sorts it."""
    c = _consumer(_stream(6), ack_wait=10 * NS, backoff=[10 * NS, 20 * NS], max_deliver=5)
    assert [_take(c, n * NS) for n in (3, 2, 1, 0)] == [1, 2, 3, 4]  # deadlines 13, 12, 11, 10 s
    assert c.nak(3, 0, 0)
    assert c.nak(1, 0, 0)
    assert list(c.redeliver) == [3, 1]
    assert c.nak(3, 5 * NS, 0)  # now due at 5 s, off the queue
    assert [c.next_seq(), list(c.redeliver)] == [1, [1]]
    assert _take(c, 1) == 1
    assert c.expire(20 * NS) == []
    assert list(c.redeliver) == [2, 3, 4]  # due at 12, 5 and 10 s


def test_flow_control_ack_policy_holds_without_deadlines() -> None:
    """``ack_policy: flow_control``: deliveries wait for their ack with no ack wait (nothing is
    ever redelivered) and an ack settles everything up to it, as ack all; an ack above the last
    delivered message is ignored."""
    c = _consumer(_stream(4), ack_policy="flow_control", deliver_subject="d", flow_control=True)
    assert [_take(c) for _ in range(3)] == [1, 2, 3]
    assert c.next_deadline_ns() is None
    assert c.expire(3600 * NS) == []
    assert c.ack(4, 4, 0) is None
    assert c.ack(2, 2, 0) is not None
    assert (sorted(c.pending), c.ack_floor_sseq) == ([3], 2)


def test_expire_and_max_deliver() -> None:
    """Past ack_wait a message is queued again; after max_deliver it leaves pending, the floor
    stays and the redelivered count keeps it."""
    c = _consumer(_stream(1), ack_wait=NS, max_deliver=2)
    _take(c, 0)
    assert c.expire(NS // 2) == []
    assert c.expire(NS) == []
    assert _take(c, NS) == 1
    assert c.expire(3 * NS) == [(1, 2)]
    assert c.pending == {}
    assert (c.ack_floor_cseq, c.ack_floor_sseq) == (0, 0)
    assert c.num_redelivered() == 1
    assert c.next_seq() is None


def test_ack_all_and_backoff() -> None:
    """Ack all settles everything up to the acked message; backoff sets each deadline."""
    c = _consumer(_stream(4), ack_policy="all")
    for _ in range(4):
        _take(c)
    c.ack(3, 3, 0)
    assert sorted(c.pending) == [4]
    assert (c.ack_floor_cseq, c.ack_floor_sseq) == (3, 3)
    b = _consumer(_stream(1), backoff=[NS, 5 * NS], max_deliver=5)
    _take(b, 0)
    assert b.pending[1].deadline_ns == NS
    b.expire(NS)
    _take(b, NS)
    assert b.pending[1].deadline_ns == 6 * NS


def test_num_pending_is_incremental_and_exact() -> None:
    """Random publishes, removals, deliveries, acks and naks: num_pending always equals a full
    recount, with and without a filter and for every start."""
    rng = random.Random(7)
    for cfg in (
        {},
        {"filter_subject": "m.s1"},
        {"deliver_policy": "last_per_subject", "filter_subject": "m.*"},
        {"deliver_policy": "by_start_sequence", "opt_start_seq": 30},
    ):
        stream = _stream(20)
        c = _consumer(stream, **cfg)
        stream.msg_removed.connect(c.forget)
        for i in range(400):
            op = rng.random()
            if op < 0.35:
                _add(stream, f"m.s{rng.randrange(4)}", 100 + i)
            elif op < 0.45 and stream.state.messages:
                stream.remove(rng.randint(stream.state.first_seq, stream.state.last_seq))
            elif op < 0.8:
                seq = c.next_seq()
                if seq is not None and stream.is_live(seq):
                    c.deliver(seq, i)
                elif seq is not None:
                    c.passed(seq)
            elif c.pending:
                seq = rng.choice(sorted(c.pending))
                if rng.random() < 0.7:
                    c.ack(seq, c.pending[seq].cseq, i)
                else:
                    c.nak(seq, 0, i)
            expected = stream.count_matching_after(max(c.sseq, c._resume), c.filters) + len(c._skip)
            assert c.num_pending() == expected, (cfg, i)


def test_cursor_names_what_a_fresh_search_finds() -> None:
    """The consumer's cursor (no search per delivery) gives the same next message as a search from
    its delivered sequence, through publishes (also uncommitted ones rolled back), deletes,
    purges (by subject, of a prefix, of everything with a jump), filter changes and resets."""
    rng = random.Random(11)
    for cfg in (
        {},
        {"filter_subject": "m.s1"},
        {"filter_subjects": ["m.s0", "m.s2"]},
        {"filter_subject": "m.*"},
    ):
        stream = _stream(30, subjects=4)
        c = _consumer(stream, **cfg)
        for i in range(1500):
            op = rng.random()
            if op < 0.425:
                _change_stream(rng, stream, c, op, i)
            else:
                _drive_consumer(rng, c, op, i)
            if not c.redeliver and not c._skip:
                assert c.next_seq() == stream.next_matching(c.sseq, c.filters), (cfg, i)


def _change_stream(rng: random.Random, stream: Stream, c: Consumer, op: float, i: int) -> None:
    """One random change of the stream under a consumer, ``op`` below 0.425: a step whose stream
    has no message falls through to the next."""
    st = stream.state
    if op < 0.25:
        _add(stream, f"m.s{rng.randrange(5)}", 100 + i)
    elif op < 0.28:
        stream.accept(f"m.s{rng.randrange(5)}", None, b"lost", (100 + i) * NS)
        stream.rollback()
    elif op < 0.38 and st.messages:
        stream.remove(rng.randint(st.first_seq, st.last_seq))
    elif op < 0.40 and st.messages:
        stream.remove(c.next_seq() or st.last_seq)
    elif op < 0.41:
        stream.purge(subject=f"m.s{rng.randrange(5)}")
    elif op < 0.42 and st.messages:
        stream.purge(seq=rng.randint(st.first_seq, st.last_seq + 1))
    else:
        stream.purge(seq=st.last_seq + rng.randint(1, 20))


def _drive_consumer(rng: random.Random, c: Consumer, op: float, i: int) -> None:
    """One random step of a consumer, ``op`` from 0.425: a filter change, a reset, a delivery or
    an ack."""
    if op < 0.44:
        filters = rng.choice([["m.s1"], ["m.s0", "m.s2"], ["m.*"], []])
        c.reconfigure(replace(c.config, filter_subject="", filter_subjects=tuple(filters)))
    elif op < 0.445:
        c.reset(0)
    elif op < 0.85:
        seq = c.next_seq()
        if seq is not None:
            c.deliver(seq, i)
    elif c.pending:
        seq = rng.choice(sorted(c.pending))
        c.ack(seq, c.pending[seq].cseq, i)


def test_flow_control_window() -> None:
    """A request after a window of bytes, delivery stalled at two windows until it is answered;
    a stale or foreign answer changes nothing."""
    from gateway.engine.flow_control import WINDOW, FlowControl

    fc = FlowControl("S", "c")
    assert fc.sent(WINDOW - 1) is None
    request = fc.sent(1)
    assert request is not None
    assert request.startswith("$JS.FC.S.c.")
    assert fc.sent(WINDOW) is None
    assert fc.stalled()
    assert not fc.answered("$JS.FC.S.c.nope")
    assert fc.answered(request)
    assert not fc.stalled()


def test_expired_requests_are_neither_served_nor_counted_before_the_timer_sweeps() -> None:
    """Delivery serves the oldest request: expired ones at the front go (the server checks expiry
    when it serves); ``num_waiting`` leaves out every expired request, wherever it waits."""
    q = PullRequestQueue(10)
    for reply, expires in (("a", 100), ("b", 0), ("c", 50), ("d", 300)):
        q.push(PullRequest(reply, 1, 0, expires, False, 0))
    assert q.live(49) == 4
    assert q.live(100) == 2  # a and c ran out; b never expires
    assert q.expire_head(99) == []  # c has run out, but a, before it, has not
    assert [r.reply for r in q.expire_head(100)] == ["a"]
    assert [r.reply for r in q] == ["b", "c", "d"]  # b has no expiry, so c waits for the sweep
    assert [r.reply for r in q.expire(100)] == ["c"]
    assert [r.reply for r in q.expire_head(1000)] == []  # b at the front never expires


def test_next_deadline_is_the_earliest_one_expire_would_act_on() -> None:
    """What a consumer's timer is set to: acked messages, re-armed deadlines (+WPI, a nak delay)
    and messages already queued for redelivery no longer count, so the timer does not wake for
    them; the answer is exactly when ``expire`` next has something to do."""
    c = _consumer(_stream(4), ack_wait=10 * NS)
    for now in (1, 2, 3):
        _take(c, now * NS)
    assert c.next_deadline_ns() == 11 * NS
    c.ack(1, 1, 5 * NS)
    assert c.next_deadline_ns() == 12 * NS  # the acked message's deadline is gone
    assert c.progress(2, 6 * NS)
    assert c.next_deadline_ns() == 13 * NS  # +WPI moved message 2 to 16 s
    assert c.nak(3, 0, 7 * NS)  # queued for redelivery now: no deadline until delivered again
    assert c.next_deadline_ns() == 16 * NS
    assert c.expire(15 * NS) == []
    assert list(c.redeliver) == [3]
    assert c.expire(16 * NS) == []
    assert c.next_deadline_ns() is None
