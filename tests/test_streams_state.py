"""The Stream state machine on its own: random operations against a naive model (a dict of live
messages), the memory bound of the hole prefix, removals handed to the log only once durable, and
rollback over removals. No servers; the JetStream numbers themselves are pinned by the differential
tests in test_streams_limits.py."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from gateway.api import errors
from gateway.api.configs import StreamConfig
from gateway.engine.stream import Stream
from gateway.engine.stream_index import COMPACT_MIN
from storage_delta.format.nats import subject_matches
from storage_delta.format.schema import stored_size
from storage_delta.read.reader import StoredIndex


def make(**cfg: Any) -> Stream:
    return Stream(StreamConfig("S", subjects=("s.>",), **cfg), 1, 1 << 20)


class Model:
    """What a stream holds, the slow and obvious way."""

    def __init__(self) -> None:
        self.live: dict[int, tuple[str, int]] = {}
        self.last = 0
        self.compacted = False  # a whole purge makes even a fresh stream's first sequence 1

    def first(self) -> int:
        if self.live:
            return min(self.live)
        return self.last + 1 if self.last or self.compacted else 0


def check(stream: Stream, model: Model) -> None:
    st = stream.state
    assert st.messages == len(model.live)
    assert st.bytes == sum(size for _, size in model.live.values())
    assert st.last_seq == model.last
    assert st.first_seq == model.first()
    span = range(model.first(), model.last + 1)
    assert stream.deleted() == [s for s in span if s not in model.live]
    subjects = {subj for subj, _ in model.live.values()}
    assert stream.num_subjects == len(subjects)
    for subj in subjects | {"s.none"}:
        mine = [s for s, (x, _) in model.live.items() if x == subj]
        assert stream.last_seq_for(subj) == max(mine, default=0)
    for probe in (0, model.first(), (model.first() + model.last) // 2, model.last):
        for filters in ([], ["s.a"], ["s.*"], ["s.b", "s.c"]):
            want = min(
                (
                    s
                    for s, (x, _) in model.live.items()
                    if s >= probe and (not filters or any(subject_matches(f, x) for f in filters))
                ),
                default=None,
            )
            assert stream.first_seq_at_or_after(probe, filters) == want


@pytest.mark.parametrize("seed", range(4))
def test_random_operations_match_a_naive_model(seed: int) -> None:
    """publish / remove / purge (all forms) / per-subject limits: counts, holes, first and last
    sequence, last-by-subject and next-by-filter equal the model's after every step."""
    rng = random.Random(seed)
    stream, model = make(max_msgs_per_subject=6), Model()
    for _ in range(300):
        op = rng.random()
        if op < 0.6:
            subj = f"s.{rng.choice('abcd')}"
            data = b"x" * rng.randrange(5)
            msg = stream.accept(subj, None, data, 0)
            model.last = msg.seq
            model.live[msg.seq] = (subj, stored_size(subj, None, data))
            of_subj = sorted(s for s, (x, _) in model.live.items() if x == subj)
            for s in of_subj[: max(0, len(of_subj) - 6)]:
                del model.live[s]
        elif op < 0.8:
            seq = rng.randrange(1, model.last + 2)
            assert stream.remove(seq) == (seq in model.live)
            model.live.pop(seq, None)
        else:
            subject = rng.choice([None, "s.a", "s.*"])
            below = rng.choice([None, rng.randrange(1, model.last + 2)])
            keep = rng.choice([None, rng.randrange(0, 4)]) if below is None else None
            victims = sorted(
                s
                for s, (x, _) in model.live.items()
                if (subject is None or subject_matches(subject, x)) and (below is None or s < below)
            )
            if keep:
                victims = victims[: max(0, len(victims) - keep)]
            assert stream.purge(subject, below, keep) == len(victims)
            for s in victims:
                del model.live[s]
            model.compacted |= subject is None and not keep
        stream.committed(model.last)
        check(stream, model)


def test_hole_prefix_stays_bounded() -> None:
    """A stream at its MaxMsgs limit removes one message per publish; the per-sequence index is
    cut back, so its memory follows the limit, not the number of publishes."""
    stream = make(max_msgs=10)
    for _ in range(10 * COMPACT_MIN):
        stream.accept("s.a", None, b"x", 0)
    assert stream.state.messages == 10
    assert len(stream._index.sid) <= 2 * COMPACT_MIN + 10
    assert stream.state.first_seq == 10 * COMPACT_MIN - 9


def test_subjects_without_messages_are_forgotten() -> None:
    """Ever-new subjects under a limit (order ids, expired keys) do not grow the subject table."""
    stream = make(max_msgs=5)
    for i in range(1000):
        stream.accept(f"s.{i}", None, b"x", 0)
    assert len(stream._subject_names) <= 7
    assert stream.last_seq_for("s.999") == 1000
    assert stream.last_seq_for("s.3") == 0
    assert stream.subject_counts(">") == {f"s.{i}": 1 for i in range(995, 1000)}


def test_msg_removed_tells_every_removal() -> None:
    """Consumers hear of each removed message with its subject, also from a whole purge."""
    stream = make(max_msgs_per_subject=1)
    heard: list[tuple[int, str]] = []
    stream.msg_removed.connect(lambda seq, subject: heard.append((seq, subject)))
    for subj in ("s.a", "s.a", "s.b", "s.c"):
        stream.accept(subj, None, b"", 0)
    stream.remove(3)
    stream.purge()
    assert heard == [(1, "s.a"), (3, "s.b"), (2, "s.a"), (4, "s.c")]


def test_discard_new_refusal_changes_nothing() -> None:
    stream = make(max_msgs=1, discard="new")
    stream.accept("s.a", None, b"x", 0)
    before = stream.info_state(0)
    with pytest.raises(errors.ApiError) as refused:
        stream.accept("s.a", None, b"x", 0)
    assert refused.value.err_code == 10077
    assert stream.info_state(0) == before


def test_removals_reach_the_log_only_once_durable() -> None:
    """A removal of an uncommitted message waits: a failed commit may reuse its sequence."""
    stream = make()
    for _ in range(5):
        stream.accept("s.a", None, b"x", 0)
    stream.committed(3)
    stream.remove(2)
    stream.remove(4)
    assert stream.take_removals() == [(2, 2)]
    stream.committed(5)
    assert stream.take_removals() == [(4, 4)]
    assert stream.take_removals() == []


def test_rollback_over_removals() -> None:
    """Rolling back uncommitted messages restores counts; removals of lost sequences vanish."""
    stream = make()
    for _ in range(3):
        stream.accept("s.a", None, b"x", 0)
    stream.committed(2)
    stream.remove(3)
    stream.remove(1)
    stream.rollback()
    assert (stream.state.messages, stream.state.first_seq, stream.state.last_seq) == (1, 2, 2)
    assert stream.take_removals() == [(1, 1)]
    assert stream.accept("s.b", None, b"y", 0).seq == 3


def test_restore_replays_the_log() -> None:
    """Recovery: stored rows, then the removal log's ranges, then the last removed sequence."""
    stream = make()
    for seq in (1, 2, 3, 5):
        stream.restore(seq, seq, "s.a", 31)
    stream.restore_removed(1, 2)
    stream.restore_removed(5, 9)
    stream.restore_last_seq(9)
    assert (stream.state.messages, stream.state.first_seq, stream.state.last_seq) == (1, 3, 9)
    assert stream.take_removals() == []
    assert stream.accept("s.a", None, b"", 10).seq == 10


def test_last_matching_and_last_per_subject() -> None:
    stream = make()
    for subj in ("s.a", "s.b", "s.a", "s.c"):
        stream.accept(subj, None, b"", 0)
    stream.remove(4)
    assert stream.last_matching([]) == 3
    assert stream.last_matching(["s.b"]) == 2
    assert stream.last_per_subject([]) == [2, 3]
    assert stream.last_per_subject(["s.a", "s.c"]) == [3]


def test_bulk_restore_answers_as_row_by_row() -> None:
    """``restore_stored`` (recovery, arrays at once) leaves the same stream as ``restore`` per row:
    counts, holes where sequences are missing, per-subject answers, and what removals do next."""
    rng = random.Random(7)
    seqs = sorted(rng.sample(range(5, 400), 250))
    rows = [(s, 1000 + s, f"s.{rng.choice('abcdefg')}", rng.randrange(31, 90)) for s in seqs]
    one, bulk = make(max_msgs_per_subject=30), make(max_msgs_per_subject=30)
    for row in rows:
        one.restore(*row)
    names = sorted({r[2] for r in rows})
    bulk.restore_stored(
        StoredIndex(
            np.array(seqs, np.int64),
            np.array([r[1] for r in rows], np.int64),
            np.array([r[3] for r in rows], np.int64),
            np.array([names.index(r[2]) for r in rows], np.int64),
            names,
            [],
        )
    )
    # the removal log's ranges: short ones replayed per sequence, long ones with arrays (one takes
    # the stream's first sequence); the reference removes one message at a time
    ranges = [(100, 120), (1, 80), (150, 330)]
    for first, last in ranges:
        bulk.restore_removed(first, last)
        for seq in range(first, last + 1):
            one.remove(seq)
    one.take_removals()
    for stream in (one, bulk):
        stream.enforce_limits(0)
    assert bulk.info_state(0, ">", True) == one.info_state(0, ">", True)
    for subject in names:
        assert bulk.last_seq_for(subject) == one.last_seq_for(subject)
        assert bulk.count_matching_after(50, [subject]) == one.count_matching_after(50, [subject])
        assert bulk.first_seq_at_or_after(200, [subject]) == one.first_seq_at_or_after(200, [subject])
    assert bulk.last_per_subject([]) == one.last_per_subject([])
    assert bulk.purge("s.a", keep=2) == one.purge("s.a", keep=2)
    assert bulk.accept("s.b", None, b"x", 0).seq == one.accept("s.b", None, b"x", 0).seq == seqs[-1] + 1
    assert bulk.info_state(0, ">", True) == one.info_state(0, ">", True)

    # the same sequences removed (limits go subject by subject, in another order)
    def removed(stream: Stream) -> set[int]:
        return {s for first, last in stream.take_removals() for s in range(first, last + 1)}

    assert removed(bulk) == removed(one)


@pytest.mark.parametrize(
    "cfg",
    [
        {},  # no limits: sequences and times only
        {"max_msgs": 7},  # the oldest goes as each new one arrives
        {"max_bytes": 400},  # by bytes, header blocks counted
        {"max_msgs_per_subject": 2},  # per subject
        {"max_msgs": 5, "max_msgs_per_subject": 1},  # both at once
    ],
)
def test_accept_run_is_one_accept_per_publish(cfg: dict[str, Any]) -> None:
    """The publish path accepts a read's publishes in one ``accept_run``: it must leave what one
    ``accept`` per publish leaves (messages, times, limits' removals in order, tail cache)."""
    items = [
        (f"s.{'abc'[i % 3]}", b"NATS/1.0\r\nA: b\r\n\r\n" if i % 4 == 0 else None, b"%d" % i)
        for i in range(20)
    ]
    one, run = make(**cfg), make(**cfg)
    removed: dict[str, list[tuple[int, str]]] = {"one": [], "run": []}
    one.msg_removed.connect(lambda seq, subj: removed["one"].append((seq, subj)))
    run.msg_removed.connect(lambda seq, subj: removed["run"].append((seq, subj)))
    for stream in (one, run):  # something before, so times must stay increasing
        stream.accept("s.a", None, b"first", 1_000)
    singles = [one.accept(subj, hdrs, data, 500) for subj, hdrs, data in items]
    assert run.takes_runs
    assert run.accept_run(items, 500) == singles
    assert [m.ts for m in singles] == list(range(1_001, 1_021))
    assert removed["run"] == removed["one"]
    assert run.state == one.state
    assert run.deleted() == one.deleted()
    assert run.take_removals() == one.take_removals()
    assert [run.tail.get(s) for s in range(1, 22)] == [one.tail.get(s) for s in range(1, 22)]


def test_streams_that_may_refuse_take_no_runs() -> None:
    """Sealed and discard-new streams refuse publishes one by one (``accept`` raises)."""
    assert not make(discard="new", max_msgs=1).takes_runs
    assert not make(sealed=True).takes_runs
    assert make(max_msgs=1).takes_runs


def test_runs_without_limits_match_runs_with_limits_that_never_bite() -> None:
    """Without limits a run is indexed in bulk (``_append_unlimited``); with a limit that never
    bites it goes message by message: the same messages, counts, index and tail cache."""
    items = [(f"s.{'abcd'[i % 4]}", None if i % 3 else b"NATS/1.0\r\n\r\n", b"p" * i) for i in range(50)]
    bulk, single = make(), make(max_msgs=10**9)
    for stream in (bulk, single):
        for _ in range(3):
            stream.accept("s.z", None, b"", 7)
        stream.remove(2)  # a hole before the run
    assert bulk.accept_run(items, 5) == single.accept_run(items, 5)
    assert bulk.state == single.state
    assert bulk.deleted() == single.deleted() == [2]
    assert bulk.subject_counts("s.*") == single.subject_counts("s.*")
    for subj in ("s.a", "s.d", "s.z"):
        assert bulk.last_seq_for(subj) == single.last_seq_for(subj)
    assert bulk.first_seq_at_or_after(0, ["s.b"]) == single.first_seq_at_or_after(0, ["s.b"])
    assert [bulk.tail.get(s) for s in range(1, 55)] == [single.tail.get(s) for s in range(1, 55)]


def test_a_wall_clock_stepping_back_reorders_nothing() -> None:
    """Stored times stay increasing per stream when the wall clock steps back (an NTP step), so
    MaxAge removes nothing early and the duplicate window is never shorter than configured."""
    second = 1_000_000_000
    window = 2 * second
    s = make(max_age=10 * second, duplicate_window=window)
    now = 10_000 * second
    first = s.accept("s.a", None, b"1", now)
    back = now - 3600 * second  # the clock steps back an hour
    second_msg = s.accept("s.a", None, b"2", back)
    assert second_msg.ts == first.ts + 1
    s.dedup.record("id", second_msg.seq, second_msg.ts, back, window)
    assert s.dedup.lookup("id", back + 5 * second, window) == second_msg.seq  # 5 s later on the new clock
    s.expire(back + 11 * second)
    assert s.state.messages == 2
    s.expire(now + 11 * second)  # once the clock has caught up, both are past MaxAge
    assert s.state.messages == 0
