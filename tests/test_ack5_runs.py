"""The ack log's rows queued as runs of columns (#23) against the rows one record each would give:
the table's rows are the same, value for value, and replaying them rebuilds the consumer."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gateway.adapters.ack_recorder import AckRecorder
from storage_delta.commit.store import StoreRoot
from storage_delta.format.schema import ACK_SCHEMA
from storage_delta.read.consumer_log import reduce
from storage_delta.tables import acklog as al
from tests.test_acklog import restored, same_state
from tests.test_consumer_model import NS, _consumer, _stream

#: Stands for a nak row's time, which the recorder takes from the clock.
NAK_TS = -1
NUMBERS = ("seq", "cseq", "deliveries", "ts", "delivered_seq", "delivered_cseq", "floor_seq", "floor_cseq")


def one_by_one(runs: list[al.AckRun], first_lsn: int) -> list[al.AckRecord]:
    """The records the runs stand for, a row each: a column's single value repeated, or its i-th."""
    out: list[al.AckRecord] = []
    for r in runs:
        for i in range(r.n):
            cols = {k: getattr(r, k) for k in NUMBERS}
            values = {k: v if isinstance(v, int) else v[i] for k, v in cols.items()}
            out.append(
                al.AckRecord(r.stream, r.consumer, r.kind, body=r.body, lsn=first_lsn + len(out), **values)
            )
    return out


def random_run(rng: random.Random) -> al.AckRun:
    n = rng.choice([1, 1, 2, 7, 300])
    cols: dict[str, Any] = {
        k: rng.randrange(1 << 40) if rng.random() < 0.4 else tuple(rng.randrange(1 << 40) for _ in range(n))
        for k in NUMBERS
    }
    body = rng.choice([None, None, '{"delay":5}'])
    return al.AckRun(
        rng.choice("ST"), rng.choice(["c1", "c2"]), rng.choice([al.DELIVER, al.ACK]), n, body=body, **cols
    )


# Each case a batch as the writer takes it: which kinds of runs, in what mix.
CASES = [
    # empty: a barrier's batch commits no rows, but still makes a table of the schema
    [],
    # one single row (an ack with a body, a lifecycle row) between runs with buffers
    [al.AckRun("S", "c", al.NAK, 1, 5, 0, 0, 9, 7, 7, 4, 4, '{"delay":1}')],
    # a run whose every column is one value, then one whose every column is per row
    [
        al.AckRun("S", "c", al.ACK, 3, 1, 0, 0, 9, 7, 7, 4, 4),
        al.AckRun("T", "d", al.DELIVER, 2, (1, 2), (3, 4), (1, 1), (5, 6), (1, 2), (3, 4), (0, 1), (0, 2)),
    ],
]


@pytest.mark.parametrize("runs", CASES)
def test_runs_become_the_rows_of_their_records(runs: list[al.AckRun]) -> None:
    assert al.runs_to_arrow(runs, 11).equals(al.to_arrow(one_by_one(runs, 11)))


def test_random_batches_become_the_rows_of_their_records() -> None:
    """Mixed streams, consumers, kinds, bodies and column shapes, at random."""
    rng = random.Random(23)
    for _ in range(40):
        runs = [random_run(rng) for _ in range(rng.randint(1, 12))]
        first = rng.randrange(1, 1 << 30)
        assert al.runs_to_arrow(runs, first).to_pylist() == al.to_arrow(one_by_one(runs, first)).to_pylist()


async def test_recorded_runs_land_as_the_state_machine_made_them(tmp_path: Path) -> None:
    """Runs of deliveries (first ones and redeliveries), runs of acks, single naks and the create
    row through the recorder and a real group-commit writer: each row in the table is the one the
    state machine's numbers give (as the recorder wrote them a tuple each before), and replaying
    the table rebuilds the consumer."""
    consumer = _consumer(_stream(600), max_deliver=3)
    table = al.AckLogTable(StoreRoot(str(tmp_path)))
    executor = ThreadPoolExecutor(2)
    writer = al.AckLogWriter(table, executor, 0, 0.01, 10_000, 0)
    await writer.start()
    recorder = AckRecorder(writer)
    recorder.created(consumer, 0, [])
    expected: list[tuple[Any, ...]] = []
    rng, now = random.Random(7), NS
    name, stream = consumer.name, consumer.stream.name
    for _ in range(60):
        now += NS
        run = consumer.deliver_run(rng.choice([1, 5, 40]), now, consumer.stream.tail.get)
        done = [d for _, d in run]
        recorder.delivered_run(consumer, done)
        ts = consumer.last_active_ns
        for d in done:
            expected.append((stream, name, al.DELIVER, d.seq, d.cseq, d.deliveries, ts, d.sseq, d.cseq))
            expected[-1] += (d.floor_sseq, d.floor_cseq, None)
        pending = sorted(consumer.pending)
        if pending and rng.random() < 0.3:  # a nak: its message comes again in a later run
            seq = rng.choice(pending)
            assert consumer.nak(seq, 0, now)
            recorder.acked(consumer, al.NAK, seq, True, False)
            positions = (consumer.sseq, consumer.dseq, consumer.ack_floor_sseq, consumer.ack_floor_cseq)
            expected.append((stream, name, al.NAK, seq, 0, 0, NAK_TS, *positions, None))
        acks = [s for s in pending if rng.random() < 0.6]
        _, settled = consumer.ack_run(acks, now, 10_000)
        recorder.acked_run(consumer, settled)
        sseq, dseq, ts = consumer.sseq, consumer.dseq, consumer.ack_floor_active_ns
        expected += [(stream, name, al.ACK, s, 0, 0, ts, sseq, dseq, f, fc, None) for s, f, fc in settled]
    await writer.close()
    executor.shutdown()
    assert any(r[2] == al.DELIVER and r[5] > 1 for r in expected)  # redeliveries among the runs
    rows = al.from_arrow(table.dt.to_pyarrow_table())
    rows.sort(key=lambda r: r.lsn)
    assert [r.lsn for r in rows] == list(range(1, len(rows) + 1))
    assert rows[0].kind == al.CREATE
    for r in rows:
        r.ts = NAK_TS if r.kind == al.NAK else r.ts  # a nak's time is the clock's
    assert [al.to_arrow([r]).drop_columns("lsn").to_pylist()[0] for r in rows[1:]] == [
        dict(zip(ACK_SCHEMA.names[1:], e, strict=True)) for e in expected
    ]
    assert writer.loop.rows_committed == len(rows)
    same_state(restored(consumer, reduce(rows, consumer.created_ns)), consumer)


async def test_the_queue_bound_counts_rows_not_runs(tmp_path: Path) -> None:
    """``acklog_max_pending`` bounds rows: one run of many rows fills the room as many rows do."""
    table = al.AckLogTable(StoreRoot(str(tmp_path)))
    executor = ThreadPoolExecutor(1)
    writer = al.AckLogWriter(table, executor, 0, 60.0, 100, 0)
    await writer.start()
    writer.add_run(al.AckRun("S", "c", al.ACK, 60, tuple(range(60)), 0, 0, 1, 60, 60, tuple(range(60)), 0))
    assert writer.room() == 40
    assert writer.has_room()
    writer.add_run(al.AckRun("S", "c", al.ACK, 40, tuple(range(40)), 0, 0, 1, 60, 60, 0, 0))
    assert writer.room() == 0
    assert not writer.has_room()
    await writer.flush()
    assert writer.room() == 100
    assert writer.committed_lsn == writer.last_lsn == 100
    await writer.close()
    executor.shutdown()
