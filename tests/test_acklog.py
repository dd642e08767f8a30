"""The ack log against real Delta tables: group commits, the loader, the reducer, compaction, and
DuckDB reading the table (including the documented ack-floor SQL)."""

from __future__ import annotations

import asyncio
import random
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from itertools import zip_longest
from pathlib import Path
from typing import Any

import pytest

from gateway.adapters.ack_recorder import AckRecorder
from gateway.api import consumer_config
from gateway.api.configs import ConsumerConfig, StreamConfig, from_json, to_json
from gateway.api.timefmt import now_ns
from gateway.engine.consumer import Consumer
from gateway.engine.stream import Stream
from storage_delta.commit.store import StoreRoot
from storage_delta.read.consumer_log import ConsumerState, reduce
from storage_delta.tables import acklog as al
from storage_delta.tables.catalog import CatalogTable
from tests.harness import duckdb_connection

ROOT = Path(__file__).resolve().parent.parent
CREATED = 1_700_000_000_000_000_000


def make_consumer(name: str, ack_policy: str = "explicit", messages: int = 400, **extra: Any) -> Consumer:
    stream = Stream(StreamConfig("S", subjects=("s.>",)), CREATED, 1 << 20)
    for seq in range(1, messages + 1):
        stream.restore(seq, CREATED + seq, f"s.{seq % 3}", 40)
    raw = {"durable_name": name, "ack_policy": ack_policy, **extra}
    return Consumer(stream, consumer_config.normalize(raw, "2.15.1"), CREATED)


def drive(consumer: Consumer, rng: random.Random, steps: int, resets: bool = False) -> list[al.AckRecord]:
    """Drive the real consumer state machine at random and record each change as the gateway does."""
    row = AckRecorder._row
    rows = [row(consumer, al.CREATE, config=consumer.config, created=consumer.created_ns)]
    clock = now_ns()
    for _ in range(steps):
        clock += rng.randrange(1, 10**9)
        op = rng.random()
        if resets and op < 0.01:
            consumer.reset(rng.choice([0, rng.randrange(1, 300)]))
            rows.append(row(consumer, al.RESET, start_after=consumer.sseq, skip=[]))
            continue
        seq = consumer.next_seq()
        if op < 0.45 and seq is not None:
            d = consumer.deliver(seq, clock)
            assert d is not None
            rows.append(row(consumer, al.DELIVER, d.seq, d.cseq, d.deliveries, consumer.last_active_ns))
        elif op < 0.8 and consumer.pending:
            seq = rng.choice(sorted(consumer.pending))
            cseq = consumer.pending[seq].cseq
            kind = al.TERM if rng.random() < 0.1 else al.ACK
            if consumer.ack(seq, cseq, clock) is not None:  # ack-all: None below the floor
                rows.append(row(consumer, kind, seq, ts=consumer.ack_floor_active_ns))
        elif op < 0.9 and consumer.pending:
            seq = rng.choice(sorted(consumer.pending))
            assert consumer.nak(seq, 0, clock)
            rows.append(row(consumer, al.NAK, seq, ts=clock))
        elif consumer.pending:
            # the ack waits run out: redelivery is queued, or the deliveries are used up
            clock += 31 * 10**9
            for seq, _ in consumer.expire(clock):
                rows.append(row(consumer, al.DROP, seq, ts=clock))
    for i, r in enumerate(rows, start=1):
        r.lsn = i
    return rows


def restored(consumer: Consumer, state: ConsumerState) -> Consumer:
    fresh = Consumer(
        consumer.stream,
        from_json(ConsumerConfig, state.config) if state.config else consumer.config,
        state.created_ns,
        state.start_after,
        state.skip,
    )
    fresh.restore(state)
    return fresh


def same_state(a: Consumer, b: Consumer) -> None:
    """Two consumers answer consumer info identically and hold the same pending set."""
    now = now_ns()
    assert a.info("S", now) == b.info("S", now)
    assert {s: (p.cseq, p.deliveries) for s, p in a.pending.items()} == {
        s: (p.cseq, p.deliveries) for s, p in b.pending.items()
    }
    assert a.num_redelivered() == b.num_redelivered()


# Seeds and configs: each one a different mix of deliveries, acks, naks and redeliveries.
CASES = [
    *[(seed, "explicit", {}) for seed in range(4)],
    # CONSUMER.RESET now and then: pending, redelivered and sequences start again
    (11, "explicit", {"max_deliver": 2, "resets": True}),
    (12, "explicit", {"resets": True}),
    # deliveries run out: messages leave pending, the floor stays, they stay counted redelivered
    (4, "explicit", {"max_deliver": 2}),
    (5, "explicit", {"max_deliver": 3, "filter_subject": "s.1"}),
    # an ack acknowledges everything below it
    (6, "all", {}),
    (7, "none", {}),
]


@pytest.mark.parametrize(("seed", "policy", "extra"), CASES)
def test_reducer_rebuilds_the_state_machine(seed: int, policy: str, extra: dict[str, Any]) -> None:
    """Replaying a consumer's rows gives back its delivered sequences, floor, pending set with
    delivery counts and redelivered count."""
    resets = bool(extra.pop("resets", False))
    consumer = make_consumer("C", policy, **extra)
    rows = drive(consumer, random.Random(seed), 600, resets)
    assert consumer.ack_floor_sseq > 0
    state = reduce(rows, CREATED)
    assert state.num_redelivered == consumer.num_redelivered()
    same_state(restored(consumer, state), consumer)
    # and the same after folding everything at or below the floor
    folded = al.fold(rows)
    assert len(folded) < len(rows)
    same_state(restored(consumer, reduce(folded, CREATED)), consumer)
    # folding twice changes nothing
    assert [(r.kind, r.lsn) for r in al.fold(folded)] == [(r.kind, r.lsn) for r in folded]
    # the vectorised fold over a table (loader and compaction) gives exactly the same rows
    assert al.fold_table(al.to_arrow(rows)) == folded


def test_earlier_incarnations_do_not_leak() -> None:
    """A deleted consumer's rows, or a create the catalog does not know, give a fresh state."""
    consumer = make_consumer("C")
    rows = drive(consumer, random.Random(1), 200)
    assert reduce(rows, CREATED).delivered_cseq > 0
    # a create row from another creation than the catalog's: the log's rows are someone else's
    assert reduce(rows, CREATED + 1) == ConsumerState(created_ns=CREATED + 1)
    gone = [*rows, al.AckRecord("S", "C", al.DELETE, lsn=10_000)]
    assert al.fold(gone) == []
    assert reduce(gone, CREATED).delivered_cseq == 0
    again = make_consumer("C")
    again.created_ns = CREATED + 5
    newer = AckRecorder._row(again, al.CREATE, config=again.config, created=again.created_ns)
    newer.lsn = 10_001
    state = reduce([*gone, newer], CREATED + 5)
    assert (state.delivered_cseq, state.floor_sseq, state.pending) == (0, 0, {})


def floors_sql() -> str:
    """The ack-floor query exactly as docs/storage.md gives it."""
    doc = (ROOT / "docs" / "storage.md").read_text()
    block = re.search(r"<!-- ack-floor-sql -->\s*```sql\n(.*?)```", doc, re.S)
    assert block, "docs/storage.md lost its ack-floor SQL"
    return block.group(1)


def duck_floors(path: Path) -> dict[tuple[str, str], tuple[int, int]]:
    sql = floors_sql().replace("'./data/acks'", f"'{path}'")
    return {(s, c): (f, fc) for s, c, f, fc in duckdb_connection().execute(sql).fetchall()}


async def write_all(
    table: al.AckLogTable, rows: list[al.AckRecord], sync_every: int, compact_every: int = 0
) -> al.AckLogWriter:
    executor = ThreadPoolExecutor(2)
    writer = al.AckLogWriter(table, executor, 0, 0.02, 10_000, compact_every)
    await writer.start()
    futures: list[asyncio.Future[None]] = []
    for i, r in enumerate(rows):
        fut = writer.submit(
            al.AckRecord(**{k: getattr(r, k) for k in r.__slots__ if k != "lsn"}), sync=i % sync_every == 0
        )
        if fut is not None:
            futures.append(fut)
        if i % 50 == 0:
            await asyncio.sleep(0.01)
    await asyncio.gather(*futures)
    await writer.close()
    executor.shutdown()
    return writer


async def test_group_commits_load_compact_and_duckdb(tmp_path: Path) -> None:
    """Rows go in by group commit in order, load back per consumer, compact to fewer rows with the
    same state, and DuckDB reads the table and its floors before and after."""
    root = StoreRoot(str(tmp_path))
    consumers = {name: make_consumer(name) for name in ("A", "B", "C")}
    histories = {name: drive(c, random.Random(ord(name)), 500) for name, c in consumers.items()}
    interleaved = [r for rows in zip_longest(*histories.values()) for r in rows if r is not None]
    table = al.AckLogTable(root)
    writer = await write_all(table, interleaved, sync_every=37)
    assert 1 < writer.loop.commits < len(interleaved)
    assert writer.loop.rows_committed == len(interleaved)

    stored = al.group(al.from_arrow(al.AckLogTable(root).dt.to_pyarrow_table()))
    log = al.AckLogTable(root).load()
    assert log.rows == len(interleaved)
    assert log.max_lsn == len(interleaved)
    for name, consumer in consumers.items():
        rows = stored[("S", name)]
        assert [r.lsn for r in rows] == sorted(r.lsn for r in rows)
        assert [(r.kind, r.seq, r.cseq) for r in rows] == [
            (r.kind, r.seq, r.cseq) for r in histories[name][: len(rows)]
        ]
        same_state(restored(consumer, reduce(rows, CREATED)), consumer)
        # the loader hands out the folded rows, which replay to the same state
        same_state(restored(consumer, reduce(log.consumers[("S", name)], CREATED)), consumer)

    expected = {("S", n): (c.ack_floor_sseq, c.ack_floor_cseq) for n, c in consumers.items()}
    assert duck_floors(tmp_path / "acks") == expected

    # the catalog knows A and B; C was deleted with its stream, say: compaction drops its rows
    catalog = CatalogTable(root)
    for name in ("A", "B"):
        catalog.put("consumer", "S", name, {"config": to_json(consumers[name].config), "created": CREATED})
    result = al.compact_store(root)
    assert result.rows_before == len(interleaved)
    assert result.rows_after < result.rows_before
    compacted = al.AckLogTable(root).load()
    assert compacted.rows == result.rows_after
    assert set(compacted.consumers) == {("S", "A"), ("S", "B")}
    for name in ("A", "B"):
        same_state(
            restored(consumers[name], reduce(compacted.consumers[("S", name)], CREATED)), consumers[name]
        )
    del expected[("S", "C")]
    assert duck_floors(tmp_path / "acks") == expected
    count = duckdb_connection().execute(f"SELECT count(*) FROM delta_scan('{tmp_path / 'acks'}')").fetchone()
    assert count == (result.rows_after,)


def test_retried_append_lands_once(tmp_path: Path) -> None:
    """A commit retried under the same txn version (its first attempt landed) is not stored twice."""
    table = al.AckLogTable(StoreRoot(str(tmp_path)))
    rows = drive(make_consumer("C"), random.Random(3), 50)
    table.append(rows, 1)
    table.append(rows, 1)
    assert al.AckLogTable(StoreRoot(str(tmp_path))).load().rows == len(rows)


def test_compaction_keeps_rows_appended_meanwhile(tmp_path: Path) -> None:
    """Compaction removes only the files of the snapshot it read: a gateway's append that lands
    between its read and its commit survives, and does not stop the compaction from landing."""
    root = StoreRoot(str(tmp_path))
    consumer = make_consumer("C")
    rows = drive(consumer, random.Random(4), 300)
    early, late = rows[:200], rows[200:]
    gateway = al.AckLogTable(root)
    gateway.append(early, 1)

    def append_meanwhile() -> set[tuple[str, str]]:
        # ``live`` runs after the job's snapshot was read and before its commit; a gateway under
        # load lands many commits there (delta-rs gave up after 15 versions it had not seen)
        for version, start in enumerate(range(0, len(late), 5), start=2):
            gateway.append(late[start : start + 5], version)
        return {("S", "C")}

    result = al.AckLogTable(root).compact(append_meanwhile)
    assert result.rows_before == len(early)
    assert result.rows_after < len(early)
    after = al.AckLogTable(root).load()
    assert after.rows == result.rows_after + len(late)
    same_state(restored(consumer, reduce(after.consumers[("S", "C")], CREATED)), consumer)
    assert duck_floors(tmp_path / "acks") == {("S", "C"): (consumer.ack_floor_sseq, consumer.ack_floor_cseq)}


def test_config_rows_carry_pause(tmp_path: Path) -> None:
    """A config change (such as a pause) is part of the rebuilt state, also after compaction."""
    consumer = make_consumer("C")
    rows = drive(consumer, random.Random(5), 100)
    paused = to_json(replace(consumer.config, pause_until="2030-01-01T00:00:00Z"))
    change = AckRecorder._row(consumer, al.CONFIG, config=paused)
    change.lsn = len(rows) + 1
    for history in ([*rows, change], al.fold([*rows, change])):
        state = reduce(history, CREATED)
        assert state.paused_until == "2030-01-01T00:00:00Z"
        assert state.config == paused


async def test_gateway_checkpoint_compacts_beside_commits(tmp_path: Path) -> None:
    """The appender compacts after every ``compact_every`` rows while commits go on; the state read
    back afterwards is the consumer's, from far fewer rows."""
    root = StoreRoot(str(tmp_path))
    consumer = make_consumer("C", messages=1500)
    rows = drive(consumer, random.Random(9), 3000)
    CatalogTable(root).put("consumer", "S", "C", {"config": to_json(consumer.config), "created": CREATED})
    writer = await write_all(al.AckLogTable(root), rows, sync_every=11, compact_every=400)
    assert writer.compactions >= 1
    log = al.AckLogTable(root).load()
    assert log.rows < len(rows)
    same_state(restored(consumer, reduce(log.consumers[("S", "C")], CREATED)), consumer)


async def test_sync_row_is_durable_when_its_future_resolves(tmp_path: Path) -> None:
    """An ack_sync is answered when its future resolves: by then a fresh reader finds its row and
    every row submitted before it; a plain row alone is committed within the flush interval."""
    root = StoreRoot(str(tmp_path))
    executor = ThreadPoolExecutor(2)
    writer = al.AckLogWriter(al.AckLogTable(root), executor, 0, 0.2, 1000, 0)
    await writer.start()
    plain = al.AckRecord("S", "C", al.DELIVER, seq=1, cseq=1, deliveries=1)
    assert writer.submit(plain) is None
    synced = writer.submit(al.AckRecord("S", "C", al.ACK, seq=1, floor_seq=1, floor_cseq=1), sync=True)
    assert synced is not None
    assert not synced.done()
    await synced
    rows = al.from_arrow(al.AckLogTable(root).dt.to_pyarrow_table())
    assert sorted((r.lsn, r.kind) for r in rows) == [(1, al.DELIVER), (2, al.ACK)]
    # a plain row with nothing behind it waits at most the flush interval
    writer.submit(al.AckRecord("S", "C", al.DELIVER, seq=2, cseq=2, deliveries=1, floor_seq=1))
    await asyncio.sleep(1.5)
    assert al.AckLogTable(root).load().rows == 3
    # a duplicate ack with a reply writes nothing and resolves once what is queued is durable
    barrier = writer.submit(None, sync=True)
    assert barrier is not None
    await barrier
    await writer.close()
    executor.shutdown()
