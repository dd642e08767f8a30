"""The consumer state machine's run calls against the one-at-a-time calls they stand for (no
servers): a run of plain acks applied in one ``ack_run`` leaves the same state, and reports the same
floors, as the same acks applied one by one."""

from __future__ import annotations

import copy
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from gateway.engine.consumer import Consumer
from storage_delta.commit.writer import StoredMessage
from tests.test_consumer_model import NS, _add, _consumer, _stream


def _snapshot(c: Consumer) -> dict[str, Any]:
    """Everything a transition may change (pending records as tuples)."""
    return {
        "pending": {s: (p.cseq, p.deliveries, p.deadline_ns, p.sent_ns) for s, p in c.pending.items()},
        "order": list(c._order),
        "redeliver": list(c.redeliver),
        "queued": set(c._queued),
        "redelivered": set(c._redelivered),
        "deadlines": sorted(c._deadlines),
        "floor": (c.ack_floor_cseq, c.ack_floor_sseq, c.ack_floor_active_ns),
        "delivered": (c.dseq, c.sseq, c.last_active_ns),
        "num_pending": c.num_pending(),
        "next": c.next_seq(),
    }


def _one_by_one(c: Consumer, seqs: list[int], now: int, room: int) -> tuple[int, list[tuple[int, int, int]]]:
    """What the gateway did per ack before runs: the ack log's room is asked before each ack, and
    only an ack that settled something takes a row."""
    taken = 0
    settled: list[Any] = []
    for seq in seqs:
        if len(settled) >= room:
            break
        taken += 1
        if c.ack(seq, 0, now) is not None:
            settled.append((seq, c.ack_floor_sseq, c.ack_floor_cseq))
    return taken, settled


def _work(c: Consumer, rng: random.Random, now: int) -> None:
    """Random deliveries, naks, progress acks, expiries and single acks."""
    for _ in range(rng.randint(0, 30)):
        op = rng.random()
        if op < 0.6:
            seq = c.next_seq()
            if seq is not None:
                c.deliver(seq, now)
        elif op < 0.7 and c.pending:
            c.nak(rng.choice(sorted(c.pending)), rng.choice([0, 0, NS]), now)
        elif op < 0.75 and c.pending:
            c.progress(rng.choice(sorted(c.pending)), now)
        elif op < 0.85:
            c.expire(now)
        elif c.pending:
            seq = rng.choice(sorted(c.pending))
            c.ack(seq, c.pending[seq].cseq, now)
        now += NS // 10


def test_ack_run_equals_acks_one_by_one() -> None:
    """Runs in order, out of order, with duplicates, with acks of messages not delivered or no
    longer pending (redelivered, nak'd, past max_deliver), and cut short by the ack log's room."""
    rng = random.Random(5)
    configs: list[dict[str, Any]] = [
        {},
        {"max_deliver": 2, "ack_wait": NS},
        {"backoff": [NS, 2 * NS], "max_deliver": 3},
        {"max_ack_pending": 7},
        {"filter_subject": "m.s1"},
    ]
    for round_ in range(300):
        cfg = configs[round_ % len(configs)]
        c = _consumer(_stream(rng.randint(1, 60)), **cfg)
        now = NS
        for _ in range(rng.randint(1, 4)):
            _work(c, rng, now)
            now += 5 * NS
            delivered = sorted({*c.pending, rng.randint(1, 70), rng.randint(1, 70)})
            seqs = [rng.choice(delivered) for _ in range(rng.randint(0, 25))]
            if rng.random() < 0.5:
                seqs = sorted(set(seqs))  # the common shape: in delivery order
            room = rng.choice([0, 1, 3, 1000])
            twin = copy.deepcopy(c)
            expected = _one_by_one(twin, seqs, now, room)
            assert c.ack_run(seqs, now, room) == expected, (cfg, seqs, room)
            assert _snapshot(c) == _snapshot(twin), (cfg, seqs, room)


def _tail(c: Consumer, held: set[int]) -> Callable[[int], StoredMessage | None]:
    """The stream's tail cache, as if it held only ``held`` (the rest read from storage)."""
    return lambda seq: c.stream.tail.get(seq) if seq in held else None


def _deliver_one_by_one(c: Consumer, limit: int, now: int, held: set[int]) -> list[tuple[int, Any]]:
    """What the gateway did per message before runs: ``next_seq``, the tail lookup, ``deliver``."""
    out: list[tuple[int, Any]] = []
    lookup = _tail(c, held)
    while len(out) < limit:
        seq = c.next_seq()
        if seq is None or lookup(seq) is None:
            break
        done = c.deliver(seq, now)
        assert done is not None
        out.append((seq, done))
    return out


def test_deliver_run_equals_deliveries_one_by_one() -> None:
    """Runs of new messages, redeliveries (nak'd, expired) and a ``last_per_subject`` start's
    skip list, under every ack policy, with filters, backoff, the ack limit, deleted messages, messages
    not committed yet and tail misses (where a run stops): the same deliveries and state."""
    rng = random.Random(8)
    configs: list[dict[str, Any]] = [
        {},
        {"ack_policy": "none"},
        {"ack_policy": "all"},
        {"max_ack_pending": 5},
        {"filter_subject": "m.s1"},
        {"filter_subjects": ["m.s0", "m.s2"]},
        {"filter_subject": "m.*", "max_deliver": 2, "ack_wait": NS},
        {"backoff": [NS, 2 * NS], "max_deliver": 3},
        {"deliver_policy": "last_per_subject", "filter_subject": "m.>"},
    ]
    for round_ in range(300):
        cfg = configs[round_ % len(configs)]
        stream = _stream(rng.randint(0, 40), subjects=rng.randint(1, 4))
        c = _consumer(stream, **cfg)
        now = NS
        for _ in range(rng.randint(1, 5)):
            _work(c, rng, now)
            st = stream.state
            if st.messages and rng.random() < 0.3:
                stream.remove(rng.randint(st.first_seq, st.last_seq))
            if rng.random() < 0.3:
                _add(stream, f"m.s{rng.randrange(3)}", 200 + round_)
            if rng.random() < 0.2:
                stream.accept("m.s1", None, b"not yet", now)  # accepted, not committed
            now += 5 * NS
            c.expire(now)
            st = stream.state
            tail = {s for s in range(st.first_seq, st.last_seq + 1) if rng.random() < 0.9}
            limit = rng.choice([1, 3, 10, 100])
            twin = copy.deepcopy(c)
            expected = _deliver_one_by_one(twin, limit, now, tail)
            held, asked = _tail(c, tail), Counter[int]()

            def lookup(seq: int, held: Any = held, asked: Counter[int] = asked) -> StoredMessage | None:
                asked[seq] += 1
                return held(seq)  # type: ignore[no-any-return]

            run = c.deliver_run(limit, now, lookup)
            assert max(asked.values(), default=1) == 1  # each message asked for once (a byte budget)
            assert [(msg.seq, d) for msg, d in run] == expected, (cfg, limit)
            assert _snapshot(c) == _snapshot(twin), (cfg, limit)
