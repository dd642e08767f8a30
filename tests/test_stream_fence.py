"""The per-stream fence in the commit itself (#19, docs/perstream-status.md): two writers on one
store root, each holding streams under a lease of their own; when one takes a stream over, the
other can never commit that stream's rows again, whatever the timing (paused mid-commit too),
while its other streams' rows in the very same group commits still land. Locally (the log
appender's put-if-absent) and on S3 through moto (delta-rs's commit)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from storage_delta.commit.append import WriterTable
from storage_delta.commit.lease import KEEP_EPOCHS, LEASE_DIR, Lease, LocalLease, ObjectStoreLease, open_lease
from storage_delta.commit.owner import (
    StreamEpochs,
    StreamFenced,
    stream_count_base,
    stream_of_owner_app,
    stream_owner_app,
)
from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import GroupCommitWriter, MessageTable, StoredMessage
from storage_delta.tables.acklog import AckLogTable, AckLogWriter, AckRecord
from storage_delta.tables.catalog import CatalogChange, CatalogTable
from storage_delta.tables.removals import Removal, RemovalLog
from tests.harness import moto_s3, s3_options
from tests.stream_writer_proc import message

W = TypeVar("W", bound=WriterTable)


def writer(root: StoreRoot, name: str, epochs: dict[str, int]) -> tuple[MessageTable, StreamEpochs]:
    """A writer of ``root`` named ``name`` that claims ``epochs`` of the streams' leases, holds
    and fences them, as a new owner does first (before it reads the streams to recover)."""
    lease = open_lease(root)
    for stream, epoch in epochs.items():
        assert lease.stream_current(stream) == epoch - 1
        assert lease.claim_stream(stream, epoch, name)
    held = StreamEpochs()
    return fenced(MessageTable, root, epochs, held), held


def fenced(kind: type[W], root: StoreRoot, epochs: dict[str, int], held: StreamEpochs | None = None) -> W:
    """A table of ``kind`` holding ``epochs`` of the streams' leases (claimed already) in
    ``held``, each stream fenced by it, as a new owner's tables are before it writes."""
    held = StreamEpochs() if held is None else held
    table = kind(root, streams=held)
    for stream, epoch in epochs.items():
        held.hold(stream, epoch)
        table.fence_stream(stream)
    return table


def take_over(root: StoreRoot, name: str, stream: str, lease_epoch: int) -> tuple[MessageTable, StreamEpochs]:
    return writer(root, name, {stream: lease_epoch})


def rows(root: StoreRoot, stream: str) -> list[bytes]:
    """The data of ``stream``'s rows, in sequence order (duplicated sequences show twice)."""
    table = DeltaTable(root.table_uri("messages"), storage_options=dict(root.storage_options or {}))
    got = table.to_pyarrow_table(columns=["stream", "seq", "data"]).to_pylist()
    return [r["data"] for r in sorted((r for r in got if r["stream"] == stream), key=lambda r: r["seq"])]


def check_epochs_in_log(root: StoreRoot, table: str, partitioned: bool = True) -> None:
    """Every version that adds new rows of a stream carries that stream's owner epoch, and no epoch of
    a stream is below one committed earlier: a stale owner's rows never follow a newer fence.
    (Which streams an unpartitioned table's file holds is not in its log: there only the order
    of the epochs is checked.)"""
    newest: dict[str, int] = {}
    fs, base = root.filesystem()
    listing = fs.get_file_info(pafs.FileSelector(f"{base}/{table}/_delta_log"))
    for entry in sorted(i.path for i in listing if i.path.endswith(".json")):
        with fs.open_input_stream(entry) as fh:
            actions = [json.loads(line) for line in bytes(fh.read()).splitlines() if line]
        carried = {}
        for action in actions:
            txn = action.get("txn")
            if txn is not None and (stream := stream_of_owner_app(txn["appId"])) is not None:
                carried[stream] = int(txn["version"])
        for stream, epoch in carried.items():
            assert epoch >= newest.get(stream, 0), f"{entry}: epoch {epoch} of {stream} after a newer one"
            newest[stream] = epoch
        for action in actions:
            add = action.get("add")
            # a merge's file (dataChange false) holds rows committed before: no fence (decision 8)
            if add is not None and partitioned and add.get("dataChange", True):
                stream = add["partitionValues"]["stream"]
                assert carried.get(stream) == newest[stream], f"{entry}: rows of {stream} without its epoch"


def test_a_stale_writer_loses_only_the_fenced_stream(tmp_path: Path) -> None:
    root = StoreRoot(str(tmp_path))
    a, a_held = writer(root, "a", {"S": 1, "T": 1})
    assert a.commit([message("S", 1, "a"), message("T", 1, "a")], 1) == frozenset()
    b, _ = take_over(root, "b", "S", 2)
    # a's next group commit meets b's fence on its way to a free version: S is left out, T lands
    assert a.commit([message("S", 2, "a"), message("T", 2, "a")], 2) == {"S"}
    b.commit([message("S", 2, "b")], 1)
    # the fence is remembered: a commit of S alone is refused before anything is linked
    assert a.commit([message("S", 3, "a")], 3) == {"S"}
    # a stream never held is never written
    a_held.drop("T")
    assert a.commit([message("T", 3, "a")], 3) == {"T"}
    assert rows(root, "S") == [b"a1", b"b2"]
    assert rows(root, "T") == [b"a1", b"a2"]
    check_epochs_in_log(root, "messages")


def test_a_fence_found_while_passing_a_version_is_remembered(tmp_path: Path) -> None:
    """The writer passes b's fence while committing T only; its later commit of S finds the next
    version free, and must not link there: it remembers what it passed."""
    root = StoreRoot(str(tmp_path))
    a, _ = writer(root, "a", {"S": 1, "T": 1})
    take_over(root, "b", "S", 2)
    assert a.commit([message("T", 1, "a")], 1) == frozenset()
    assert a.commit([message("S", 1, "a")], 2) == {"S"}
    assert rows(root, "S") == []
    check_epochs_in_log(root, "messages")


def test_a_new_owner_is_fenced_by_a_newer_one_still(tmp_path: Path) -> None:
    root = StoreRoot(str(tmp_path))
    b, b_held = take_over(root, "b", "S", 1)
    take_over(root, "c", "S", 2)
    with pytest.raises(StreamFenced):
        b.fence_stream("S")  # b's fence came late: the lease moved on again
    assert b.commit([message("S", 1, "b")], 1) == {"S"}
    assert b_held.epoch("S") == 1


def dedup_versions(root: StoreRoot, table: str = "messages") -> dict[str, list[int]]:
    """Per app id other than the owner epochs', the txn versions of the table's log in order."""
    out: dict[str, list[int]] = {}
    log_dir = os.path.join(root.local_path() or "", table, "_delta_log")
    for entry in sorted(n for n in os.listdir(log_dir) if n.endswith(".json")):
        with open(os.path.join(log_dir, entry), "rb") as fh:
            for action in map(json.loads, fh):
                txn = action.get("txn")
                if txn is not None and not txn["appId"].startswith("jetlake-owner"):
                    out.setdefault(txn["appId"], []).append(int(txn["version"]))
    return out


def test_each_stream_is_counted_under_one_app_id_across_owners(tmp_path: Path) -> None:
    """The dedup txn is the stream's (``jetlake-gateway/<S>``), not the writer's: the table's app
    ids stay one per stream however many gateways wrote it, its versions keep growing across
    owners though each writer counts its own commits from 1, and each writer's landed check
    (``last_txn_version``) reads its own count back, never the other owner's."""
    root = StoreRoot(str(tmp_path))
    a, _ = writer(root, "a", {"S": 1, "T": 1})
    for v in range(1, 4):
        assert a.commit([message("S", v, "a"), message("T", v, "a")], v) == frozenset()
    assert a.last_txn_version() == 3
    b, _ = take_over(root, "b", "S", 2)
    assert b.last_txn_version() == 0  # b has committed nothing of its own yet
    assert b.commit([message("S", 4, "b")], 1) == frozenset()
    assert b.commit([message("S", 5, "b")], 2) == frozenset()
    assert b.last_txn_version() == 2
    # a's count is read from T only: S's goes on under b and is none of a's
    assert a.last_txn_version() == 3
    assert a.commit([message("T", 4, "a")], 4) == frozenset()
    assert a.last_txn_version() == 4
    versions = dedup_versions(root)
    assert set(versions) == {"jetlake-gateway/S", "jetlake-gateway/T"}
    # each owner counts from its epoch's base, above every version of an older epoch
    one, two = stream_count_base(1), stream_count_base(2)
    assert versions["jetlake-gateway/S"] == [one + 1, one + 2, one + 3, two + 1, two + 2]
    assert versions["jetlake-gateway/T"] == [one + 1, one + 2, one + 3, one + 4]
    assert rows(root, "S") == [b"a1", b"a2", b"a3", b"b4", b"b5"]


def test_a_stale_owner_behind_a_trim_is_still_fenced(tmp_path: Path) -> None:
    """A writer whose next version was trimmed below a checkpoint cannot pass the versions in
    between one by one: it catches up from the checkpoint, whose snapshot holds the stream epochs
    it would have met there, so the stale owner of S is refused all the same, and T's rows land
    under T's count."""
    root = StoreRoot(str(tmp_path), log_retention_s=0.0)
    a, _ = writer(root, "a", {"S": 1, "T": 1})
    assert a.commit([message("S", 1, "a"), message("T", 1, "a")], 1) == frozenset()
    b, _ = take_over(root, "b", "S", 2)
    for v in range(1, 41):
        assert b.commit([message("S", v + 1, "b")], v) == frozenset()
        if v % 10 == 0:
            b._appender.hygiene()  # a checkpoint, and the trim below it
    b.close()
    local = a._appender._log
    assert local is not None
    assert not os.path.exists(
        os.path.join(str(tmp_path), "messages", "_delta_log", f"{local.next_version:020d}.json")
    )
    assert a.commit([message("S", 42, "a"), message("T", 2, "a")], 2) == {"S"}
    assert rows(root, "T") == [b"a1", b"a2"]
    assert rows(root, "S") == [b"a1"] + [b"b%d" % seq for seq in range(2, 42)]
    table = DeltaTable(root.table_uri("messages"))
    assert (
        table.transaction_version("jetlake-gateway/S"),
        table.transaction_version("jetlake-gateway/T"),
    ) == (stream_count_base(2) + 40, stream_count_base(1) + 2)
    newest = os.path.join(str(tmp_path), "messages", "_delta_log", f"{table.version():020d}.json")
    with open(newest, "rb") as fh:
        txns = {(t["appId"], t["version"]) for line in fh if (t := json.loads(line).get("txn"))}
    # T's epoch, past the trim
    assert txns == {(stream_owner_app("T"), 1), ("jetlake-gateway/T", stream_count_base(1) + 2)}


def test_a_stream_not_fenced_by_the_appender_is_not_written(tmp_path: Path) -> None:
    """Holding a stream's lease is not enough to write it through a table: the appender's fence
    of it comes first (that is where the base of the stream's count is set, from the epoch). A
    stream's epoch is written through one appender per table (a claim is one gateway's), so the
    next appender to write it claims the next epoch."""
    root = StoreRoot(str(tmp_path))
    a, held = writer(root, "a", {"S": 1})
    assert a.commit([message("S", 1, "a")], 1) == frozenset()
    other = MessageTable(root, streams=held)
    assert other.commit([message("S", 2, "a")], 1) == {"S"}
    assert open_lease(root).claim_stream("S", 2, "a")
    held.hold("S", 2)
    other.fence_stream("S")
    assert other.commit([message("S", 2, "a")], 1) == frozenset()
    assert a.commit([message("S", 3, "a")], 2) == {"S"}  # fenced under epoch 1 only
    assert dedup_versions(root)["jetlake-gateway/S"] == [stream_count_base(1) + 1, stream_count_base(2) + 1]
    assert rows(root, "S") == [b"a1", b"a2"]


def test_a_streams_catalog_rows_are_written_by_its_owner_and_ordered_across_owners(tmp_path: Path) -> None:
    """A stream's definitions (the stream, its consumers) are fenced like its messages: a stale
    owner's consumer change is left out while another stream's in the same commit lands, and the
    next owner's change of an entity wins over the old owner's though the new owner's own count
    is lower (``rev`` is the stream's count, not the writer's)."""
    root = StoreRoot(str(tmp_path))
    writer(root, "a", {"S": 1, "T": 1})  # the leases
    a = fenced(CatalogTable, root, {"S": 1, "T": 1})
    body = {"stream_name": "S", "config": {"durable_name": "C", "ack_policy": "explicit"}}
    for v in range(1, 6):
        changes = [CatalogChange("consumer", s, "C", {**body, "n": v}) for s in ("S", "T")]
        assert a.commit(changes, v) == frozenset()
    writer(root, "b", {"S": 2})
    b = fenced(CatalogTable, root, {"S": 2})
    assert b.commit([CatalogChange("consumer", "S", "C", {**body, "n": "b1"})], 1) == frozenset()
    stale = [CatalogChange("consumer", s, "C", {**body, "n": "a6"}) for s in ("S", "T")]
    assert a.commit(stale, 6) == {"S"}
    got = {(e.stream, e.name): e.body["n"] for e in CatalogTable(root).load()}
    assert got == {("S", "C"): "b1", ("T", "C"): "a6"}
    check_epochs_in_log(root, "catalog", partitioned=False)


async def test_the_commit_loop_fails_only_the_fenced_streams_waiters(tmp_path: Path) -> None:
    root = StoreRoot(str(tmp_path))
    a, _ = writer(root, "a", {"S": 1, "T": 1})
    executor = ThreadPoolExecutor(2)
    heard: list[str] = []
    front = GroupCommitWriter(a, executor, 1 << 20, lambda s: heard.append(f"rollback {sorted(s)}"))
    front.loop.on_stream_fenced = lambda streams: heard.append(f"fenced {sorted(streams)}")
    await front.start()
    await front.submit([message("S", 1, "a")])
    await asyncio.get_running_loop().run_in_executor(executor, take_over, root, "b", "S", 2)
    s_fut = front.submit([message("S", 2, "a")])
    t_fut = front.submit([message("T", 1, "a")])  # in the same group commit as S's
    with pytest.raises(StreamFenced):
        await s_fut
    await t_fut
    assert heard == ["fenced ['S']", "rollback ['S']"]
    assert front.running  # the writer goes on with its other streams
    assert front.loop.rows_committed == 2  # S1, T1: not the S row left out
    await front.submit([message("T", 2, "a")])
    await front.close()
    executor.shutdown()
    assert rows(root, "S") == [b"a1"]
    assert rows(root, "T") == [b"a1", b"a2"]
    check_epochs_in_log(root, "messages")


class LandsThenFails(MessageTable):
    """A table whose next commit that lands reports an error all the same (delta-rs #2509)."""

    fail_next = False

    def _append(self, batch: list[StoredMessage], version: int) -> None:
        super()._append(batch, version)
        if self.fail_next:
            self.fail_next = False
            raise OSError("connection reset after the commit landed")


async def test_a_commit_that_left_a_stream_out_and_failed_after_landing_fails_that_streams_waiters(
    tmp_path: Path,
) -> None:
    """The loop's landed check after an error must not take the rows left out for committed: the
    fenced stream's publisher gets no PubAck for a row that was never stored."""
    root = StoreRoot(str(tmp_path))
    writer(root, "a", {"S": 1, "T": 1})
    a = fenced(LandsThenFails, root, {"S": 1, "T": 1})  # each appender fences before it writes
    executor = ThreadPoolExecutor(2)
    front = GroupCommitWriter(a, executor, 1 << 20, lambda s: None)
    await front.start()
    await asyncio.get_running_loop().run_in_executor(executor, take_over, root, "b", "S", 2)
    a.fail_next = True
    s_fut = front.submit([message("S", 1, "a")])
    t_fut = front.submit([message("T", 1, "a")])
    with pytest.raises(StreamFenced):
        await s_fut
    await t_fut
    await front.close()
    executor.shutdown()
    assert rows(root, "S") == []
    assert rows(root, "T") == [b"a1"]


def ack(stream: str, seq: int) -> AckRecord:
    return AckRecord(stream, "C", "ack", seq)


def acked(root: StoreRoot) -> list[tuple[str, int]]:
    return sorted(
        (r["stream"], r["seq"]) for r in DeltaTable(root.table_uri("acks")).to_pyarrow_table().to_pylist()
    )


async def test_the_ack_log_leaves_out_only_the_fenced_streams_rows(tmp_path: Path) -> None:
    """The ack log is one unpartitioned table of every stream's consumers: a commit holding acks
    of S and T after another gateway took S over lands T's rows alone, and the waiter of an
    ``AckSync`` on S fails while T's is answered."""
    root = StoreRoot(str(tmp_path))
    writer(root, "a", {"S": 1, "T": 1})  # the leases, and the messages table's fences
    a = fenced(AckLogTable, root, {"S": 1, "T": 1})
    assert a.append([ack("S", 1), ack("T", 1)], 1) == frozenset()
    writer(root, "b", {"S": 2})
    fenced(AckLogTable, root, {"S": 2})
    assert a.append([ack("S", 2), ack("T", 2)], 2) == {"S"}
    executor = ThreadPoolExecutor(2)
    front = AckLogWriter(a, executor, 2, flush_interval_s=5.0, max_pending=100, compact_every=0)
    await front.start()
    s_fut = front.submit(ack("S", 3), sync=False)
    t_fut = front.add("T", "C", "ack", 3, 0, 0, 0, (0, 0, 0, 0), sync=True)
    assert s_fut is None
    assert t_fut is not None
    await t_fut  # T's rows land although S's in the same commit are refused
    s_sync = front.submit(ack("S", 4), sync=True)
    assert s_sync is not None
    with pytest.raises(StreamFenced):
        await s_sync
    assert front.loop.running
    await front.close()
    executor.shutdown()
    assert acked(root) == [("S", 1), ("T", 1), ("T", 2), ("T", 3)]
    check_epochs_in_log(root, "acks", partitioned=False)


def test_the_removal_log_leaves_out_only_the_fenced_streams_rows(tmp_path: Path) -> None:
    root = StoreRoot(str(tmp_path))
    writer(root, "a", {"S": 1, "T": 1})
    a = fenced(RemovalLog, root, {"S": 1, "T": 1})
    assert a.append([Removal("S", 1, 1, 1), Removal("T", 1, 1, 1)]) == frozenset()
    writer(root, "b", {"S": 2})
    fenced(RemovalLog, root, {"S": 2})
    assert a.append([Removal("S", 1, 2, 2), Removal("T", 1, 2, 2)]) == {"S"}
    rows = DeltaTable(root.table_uri("removals")).to_pyarrow_table().to_pylist()
    assert sorted((r["stream"], r["first"]) for r in rows) == [("S", 1), ("T", 1), ("T", 2)]
    check_epochs_in_log(root, "removals", partitioned=False)


def test_the_stream_lease_gives_each_epoch_to_one_claimant(tmp_path: Path) -> None:
    a, b = LocalLease(str(tmp_path)), LocalLease(str(tmp_path))
    assert a.stream_current("S") == 0
    assert a.claim_stream("S", 1, "a")
    assert not b.claim_stream("S", 1, "b")
    assert b.claim_stream("T", 1, "b")  # each stream's lease is its own
    assert (b.stream_current("S"), b.stream_holder("S", 1)) == (1, "a")
    assert b.claim_stream("S", 2, "b")
    assert (a.stream_current("S"), a.stream_holder("S", 2)) == (2, "b")
    assert a.current() == 0  # the store lease is untouched
    check_claims_pruned(a, lambda: os.listdir(os.path.join(a.dir, "streams", "S")))


def check_claims_pruned(lease: Lease, names: Callable[[], list[str]]) -> None:
    """A stream taken over again and again keeps the newest claims only (the highest always)."""
    for epoch in range(lease.stream_current("S") + 1, 31):
        assert lease.claim_stream("S", epoch, f"g{epoch}")
    kept = sorted(int(n.removesuffix(".json")[6:]) for n in names())
    assert kept == list(range(30 - KEEP_EPOCHS, 31))
    assert (lease.stream_current("S"), lease.stream_holder("S", 30)) == (30, "g30")


@pytest.mark.parametrize("store", ["local", "s3"])
def test_a_writer_paused_mid_stream_is_refused_after_a_takeover(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """SIGSTOP a writer of S and T (in another process, between or inside commits), take S over,
    write S, SIGCONT: its S rows are refused (it hears so), its T rows go on landing; nothing it
    acknowledged is lost, no sequence of S is stored twice. On a local root and on S3 (moto)."""
    if store == "s3":
        root = StoreRoot("s3://lake/paused", s3_options(request.getfixturevalue("s3_endpoint")))
    else:
        root = StoreRoot(str(tmp_path))
    lease = open_lease(root)
    assert lease.claim_stream("S", 1, "a")
    assert lease.claim_stream("T", 1, "a")
    rounds = 200 if store == "local" else 60
    recovered: list[bytes] = []

    def take_s_over() -> None:
        b, _ = take_over(root, "b", "S", 2)
        recovered.extend(rows(root, "S"))  # read after the fence: everything a committed before it
        for i, seq in enumerate(range(len(recovered) + 1, len(recovered) + 6), start=1):
            b.commit([message("S", seq, "b")], i)

    lines = paused_while(
        ["tests.stream_writer_proc", root.uri, "1", str(rounds)],
        {"JETLAKE_TEST_STORAGE_OPTIONS": json.dumps(root.storage_options)},
        take_s_over,
    )
    first = len(recovered) + 1
    assert lines[-1] == "done"
    assert "fenced S" in lines
    acked = {s: [int(x.split()[2]) for x in lines if x.startswith(f"acked {s} ")] for s in ("S", "T")}
    assert acked["T"] == list(range(1, rounds + 1))
    assert rows(root, "T") == [b"a%d" % i for i in acked["T"]]
    # S: what a acknowledged, then b's, each sequence once
    assert acked["S"] == list(range(1, len(acked["S"]) + 1))
    assert len(recovered) == len(acked["S"]) >= 20
    assert rows(root, "S") == [b"a%d" % i for i in acked["S"]] + [b"b%d" % i for i in range(first, first + 5)]
    check_epochs_in_log(root, "messages")


def paused_while(args: list[str], env: dict[str, str], take_over: Callable[[], None]) -> list[str]:
    """Run the writer module ``args`` in a process of its own, SIGSTOP it once it printed
    ``acked S 20``, run ``take_over``, SIGCONT it; its lines once it exited with 0."""
    proc = subprocess.Popen(
        [sys.executable, "-m", *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd(), **env},
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line.strip())
            if line.strip() == "acked S 20":
                break
        os.kill(proc.pid, signal.SIGSTOP)
        take_over()
        os.kill(proc.pid, signal.SIGCONT)
        lines += [line.strip() for line in proc.stdout]
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait(timeout=120)
        proc.stdout.close()
    assert proc.returncode == 0
    return lines


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_s3() as endpoint:
        yield endpoint


def test_the_stream_fence_holds_on_s3(s3_endpoint: str) -> None:
    """delta-rs commits: a's handle still predates b's fence when it commits S and T, so its
    commit loses the version to the fence and the conflict is judged by S's epoch; after a
    fresh load (no conflict left to meet) the epoch in the snapshot refuses S just the same."""
    root = StoreRoot("s3://lake/perstream", s3_options(s3_endpoint))
    a, _ = writer(root, "a", {"S": 1, "T": 1})
    assert a.commit([message("S", 1, "a"), message("T", 1, "a")], 1) == frozenset()
    b, _ = take_over(root, "b", "S", 2)
    assert a.commit([message("S", 2, "a"), message("T", 2, "a")], 2) == {"S"}
    b.commit([message("S", 2, "b")], 1)
    a._appender.hygiene()  # a fresh handle, loaded after the fence
    assert a.commit([message("S", 3, "a"), message("T", 3, "a")], 3) == {"S"}
    assert rows(root, "S") == [b"a1", b"b2"]
    assert rows(root, "T") == [b"a1", b"a2", b"a3"]
    table = DeltaTable(root.table_uri("messages"), storage_options=dict(root.storage_options or {}))
    assert table.transaction_version(stream_owner_app("S")) == 2
    check_epochs_in_log(root, "messages")


def test_the_stream_lease_gives_each_epoch_to_one_claimant_on_s3(s3_endpoint: str) -> None:
    root = StoreRoot("s3://lake/perstream-lease", s3_options(s3_endpoint))
    a, b = ObjectStoreLease(root), ObjectStoreLease(root)
    assert b.stream_current("S") == 0
    assert a.claim_stream("S", 1, "a")
    assert not b.claim_stream("S", 1, "b")
    assert not a.claim_stream("S", 1, "a")  # a claim again, not a retried PUT: not this call's
    assert (b.stream_current("S"), b.stream_holder("S", 1)) == (1, "a")
    assert b.claim_stream("S", 2, "b")
    assert a.stream_holder("S", 2) == "b"
    assert a.current() == 0
    fs, base = root.filesystem()
    folder = f"{base}/{LEASE_DIR}/streams/S"
    check_claims_pruned(a, lambda: [i.base_name for i in fs.get_file_info(pafs.FileSelector(folder))])


@pytest.mark.parametrize("store", ["local", "s3"])
def test_streams_claimed_together_get_each_epoch_once(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A takeover claims its streams together: those another gateway claimed first are left
    out, also when its claim lands between the read of the epochs and the claims; every epoch
    goes to one claimant and names it."""
    a: Lease
    b: Lease
    if store == "s3":
        root = StoreRoot("s3://lake/perstream-lease-many", s3_options(request.getfixturevalue("s3_endpoint")))
        a, b = ObjectStoreLease(root), ObjectStoreLease(root)
    else:
        a, b = LocalLease(str(tmp_path)), LocalLease(str(tmp_path))
    assert b.claim_stream("T", 1, "b")
    assert a.streams_current("STU") == {"S": 0, "T": 1, "U": 0}
    assert a.claim_streams({"S": 1, "T": 1, "U": 1}, "a") == {"S", "U"}
    assert [b.stream_holder(s, 1) for s in "STU"] == ["a", "b", "a"]

    # b claims V right after a read the epochs: V is left to b
    assert a.streams_current("SVW") == {"S": 1, "V": 0, "W": 0}
    assert b.claim_stream("V", 1, "b")
    assert a.claim_streams({"S": 2, "V": 1, "W": 1}, "a") == {"S", "W"}
    assert [(b.stream_current(s), b.stream_holder(s, b.stream_current(s))) for s in "SVW"] == [
        (2, "a"),
        (1, "b"),
        (1, "a"),
    ]
