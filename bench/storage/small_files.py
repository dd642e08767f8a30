"""Small files (#22): one stream written one message per commit (sync publishing, each PubAck
awaited), then what its files cost: the restart after ``kill -9``, a new consumer's first batch and
drain rate, and an independent Delta reader's (deltalake, DuckDB) read of the whole stream.

jetlake runs three times, each in a store of its own: with the gateway's continuous compaction off
(``compact_min_files = 0``: before), with it on (the default: after), and with the same messages
written in large commits (pipelined publishes, compaction on), which is what the cold reads are
compared with. The real JetStream gets the same sync publishes, ``kill -9`` and new consumer. Each
figure is the median of ``trials`` runs; ``files_during_publish`` is the largest file count of
the stream seen (every ``SAMPLE_S``) while it was published: whether the compaction kept up.

With ``--kept DIR`` the jetlake stream is not written but taken from a store kept by an earlier run
(``--keep``; e.g. ``python -m bench.storage.recovery --keep DIR``, hours of one commit per message),
compared with the same count in large commits and on JetStream.

    python -m bench.storage.small_files [--messages 20000] [--trials 3] [--keep DIR]
        [--kept DIR [--large-kept DIR] [--jetstream-window N]]
    (or python -m bench.run --only small_files)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig

from bench.targets import stream_state, wait_stream_messages
from storage_delta.commit.store import StoreRoot, open_existing
from storage_delta.format import schema as sch
from storage_delta.maintenance.files import live_files
from tests.harness import Jetlake, ReferenceJetStream, duckdb_connection, stop

Result = dict[str, Any]
STREAM, SUBJECT = "SMALL", "small.x"
BATCH = 1000
#: Seconds between two looks at the stream's file count while it is published.
SAMPLE_S = 2.0


async def _publish(url: str, count: int, window: int) -> float:
    """``count`` publishes with ``window`` PubAcks awaited at a time (1: sync); seconds taken."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=STREAM, subjects=["small.>"])
        payload = b'{"order": %d, "customer": "c-%d", "amount": 12.5}'
        t0 = time.monotonic()
        for start in range(0, count, window):
            batch = range(start, min(start + window, count))
            await asyncio.gather(*(js.publish(SUBJECT, payload % (i, i % 97), timeout=60) for i in batch))
        return time.monotonic() - t0
    finally:
        await nc.close()


async def _drain(url: str, count: int) -> tuple[float, float]:
    """A new pull consumer from the stream's start: seconds to its first batch of ``BATCH``, and
    messages per second until it had them all."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        name = f"cold{time.time_ns()}"
        t0 = time.monotonic()
        await js.add_consumer(STREAM, ConsumerConfig(durable_name=name, ack_policy=AckPolicy.NONE))
        sub = await js.pull_subscribe_bind(name, stream=STREAM)
        got = len(await sub.fetch(BATCH, timeout=120))
        first = time.monotonic() - t0
        while got < count:
            got += len(await sub.fetch(BATCH, timeout=120))
        rate = count / (time.monotonic() - t0)
        await js.delete_consumer(STREAM, name)
        return first, rate
    finally:
        await nc.close()


def _median(runs: list[float], digits: int = 3) -> float:
    return round(statistics.median(runs), digits)


def _cold_reads(runs: list[tuple[float, float]]) -> Result:
    firsts, rates = zip(*runs, strict=True)
    return {"first_batch_s": _median(list(firsts)), "drain_per_s": round(statistics.median(rates))}


def _timed(read: Callable[[], int], count: int, trials: int) -> float:
    runs = []
    for _ in range(trials):
        t0 = time.monotonic()
        assert read() == count
        runs.append(time.monotonic() - t0)
    return _median(runs)


def _readers(lake: Jetlake, count: int, trials: int) -> Result:
    """An independent reader's time for every row of the stream: deltalake and DuckDB."""
    table = str(lake.data_root / "messages")

    def delta_rs() -> int:  # a fresh handle each time, as an independent reader opens the table
        dt = open_existing(StoreRoot(str(lake.data_root)), sch.MESSAGES)
        assert dt is not None
        rows: int = dt.to_pyarrow_table(filters=[("stream", "=", STREAM)]).num_rows
        return rows

    def duckdb() -> int:
        sql = "SELECT * FROM delta_scan(?) WHERE stream = ?"
        rows: int = duckdb_connection().execute(sql, [table, STREAM]).to_arrow_table().num_rows
        return rows

    return {
        "deltalake_read_s": _timed(delta_rs, count, trials),
        "duckdb_read_s": _timed(duckdb, count, trials),
    }


def _restarts_and_drains(
    kill: Callable[[], None], start: Callable[[], None], url: str, count: int, trials: int
) -> tuple[list[float], list[tuple[float, float]]]:
    """``trials`` times: ``kill -9``, then seconds from starting again to a stream that answers
    with every message, and a new consumer's first batch and drain rate right after, while nothing
    of the stream is in the server's memory (a second consumer would find the first one's reads)."""
    restarts, drains = [], []
    for _ in range(trials):
        kill()
        t0 = time.monotonic()
        start()
        asyncio.run(wait_stream_messages(url, STREAM, count))
        restarts.append(time.monotonic() - t0)
        drains.append(asyncio.run(_drain(url, count)))
    return restarts, drains


def _settled(root: StoreRoot) -> int:
    """The stream's file count once it stopped changing (the restarted gateway's compaction rounds
    have run): what the independent readers read."""
    files = len(live_files(root, STREAM))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        time.sleep(2)  # longer than a round's interval: no change means no round is under way
        now = len(live_files(root, STREAM))
        if now == files:
            break
        files = now
    return files


def _publish_sampled(url: str, root: StoreRoot, count: int, window: int) -> tuple[float, list[int]]:
    """:func:`_publish`, and the stream's file count every ``SAMPLE_S`` meanwhile: whether the
    compaction keeps up with the publisher."""
    counts: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_S):
            counts.append(len(live_files(root, STREAM)))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        return asyncio.run(_publish(url, count, window)), counts
    finally:
        done.set()
        sampler.join()


def _jetlake(workdir: Path, env: dict[str, str], count: int, window: int, trials: int) -> Result:
    lake = Jetlake(workdir)
    lake.gateway_env = env
    lake.start()
    try:
        root = StoreRoot(str(lake.data_root))
        publish_s, during = _publish_sampled(lake.url, root, count, window)
        out: Result = {
            "publish_per_s": round(count / publish_s),
            "files_during_publish": {"max": max(during, default=0), "samples": len(during)},
        }
        out.update(_after_publish(lake, count, trials))
        return out
    finally:
        lake.stop()


def _after_publish(lake: Jetlake, count: int, trials: int) -> Result:
    """Restarts after ``kill -9``, a new consumer's reads and the independent readers' of a
    stream of ``count`` messages that ``lake`` (running) holds."""
    root = StoreRoot(str(lake.data_root))
    files = len(live_files(root, STREAM))
    restarts, drains = _restarts_and_drains(
        lake.kill_gateway, lambda: lake.start_gateway(ready_s=3600), lake.url, count, trials
    )
    out: Result = {
        "files_at_kill": files,
        "restart_after_kill9_s": _median(restarts, 2),
        **_cold_reads(drains),
        "files_at_read": _settled(root),
    }
    out.update(_readers(lake, count, trials))
    return out


def _kept(kept: Path, trials: int) -> tuple[int, Result]:
    """The figures of the stream of a kept store, and its message count."""
    lake = Jetlake(kept)
    lake.start_server()
    try:
        lake.start_gateway(ready_s=3600)  # its first start may compact what the writer left
        count: int = asyncio.run(stream_state(lake.url, STREAM))["messages"]
        return count, _after_publish(lake, count, trials)
    finally:
        lake.stop()


def measure_kept(
    ref: ReferenceJetStream, workdir: Path, kept: Path, trials: int, large_kept: Path | None, js_window: int
) -> Result:
    """The same figures for the stream of a store written before (``--keep`` of an earlier run,
    e.g. one message per commit for an hour), against the same messages in large commits and on
    JetStream (sync publishes, as the kept stream's were). ``large_kept``: the large commits' store
    kept too (``bench.storage.one_per_commit --per-commit 256``), not published here; ``js_window``:
    PubAcks in flight on JetStream (its file store holds the same blocks however they came)."""
    count, kept_out = _kept(kept, trials)
    if large_kept is None:
        large = _jetlake(workdir / "large", {}, count, 256, trials)
    else:
        large_count, large = _kept(large_kept, trials)
        assert large_count == count, f"{large_kept} holds {large_count} messages, {kept} {count}"
    js = _jetstream(ref, count, trials, js_window)
    return {
        "workload": "small_files_kept",
        "messages": count,
        "trials": trials,
        "jetlake_kept": kept_out,
        "jetlake_large_commits": large,
        "jetstream": js,
        **_ratios("kept", kept_out, large, js),
    }


def _jetstream(ref: ReferenceJetStream, count: int, trials: int, window: int = 1) -> Result:
    publish_s = asyncio.run(_publish(ref.url, count, window))
    restarts, drains = _restarts_and_drains(
        lambda: stop(ref.proc, signal.SIGKILL), ref.start, ref.url, count, trials
    )
    return {
        "publish_per_s": round(count / publish_s),
        "restart_after_kill9_s": _median(restarts, 2),
        **_cold_reads(drains),
    }


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3)


def _ratios(name: str, lake: Result, large: Result, js: Result) -> Result:
    """How the jetlake run ``name`` compares with the same messages in large commits (cold reads)
    and on JetStream (restart, drain)."""
    return {
        f"restart_{name}_vs_jetstream": _ratio(lake["restart_after_kill9_s"], js["restart_after_kill9_s"]),
        f"drain_{name}_vs_large": _ratio(lake["drain_per_s"], large["drain_per_s"]),
        f"drain_{name}_vs_jetstream": _ratio(lake["drain_per_s"], js["drain_per_s"]),
        f"first_batch_{name}_vs_large": _ratio(lake["first_batch_s"], large["first_batch_s"]),
        f"deltalake_{name}_vs_large": _ratio(lake["deltalake_read_s"], large["deltalake_read_s"]),
        f"duckdb_{name}_vs_large": _ratio(lake["duckdb_read_s"], large["duckdb_read_s"]),
    }


def measure(ref: ReferenceJetStream, workdir: Path, count: int, trials: int = 3) -> Result:
    """The whole comparison; ``ref`` is a running JetStream without a stream named ``SMALL``."""
    off = _jetlake(workdir / "off", {"JETLAKE_COMPACT_MIN_FILES": "0"}, count, 1, trials)
    on = _jetlake(workdir / "on", {}, count, 1, trials)
    large = _jetlake(workdir / "large", {}, count, 256, trials)
    js = _jetstream(ref, count, trials)
    return {
        "workload": "small_files",
        "messages": count,
        "trials": trials,
        "jetlake_compaction_off": off,
        "jetlake_compaction_on": on,
        "jetlake_large_commits": large,
        "jetstream": js,
        "restart_on_vs_off": _ratio(on["restart_after_kill9_s"], off["restart_after_kill9_s"]),
        "drain_off_vs_large": _ratio(off["drain_per_s"], large["drain_per_s"]),
        "publish_on_vs_off": _ratio(on["publish_per_s"], off["publish_per_s"]),
        **_ratios("on", on, large, js),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--keep", default="", help="work in this directory and keep it (the servers' logs)")
    ap.add_argument("--kept", default="", help="measure the stream of this kept store instead of writing one")
    ap.add_argument("--large-kept", default="", help="with --kept: the same messages in large commits, kept")
    ap.add_argument(
        "--jetstream-window", type=int, default=1, help="with --kept: PubAcks in flight on JetStream"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="jetlake-smallfiles-") as tmp:
        work = Path(args.keep or tmp)
        ref = ReferenceJetStream(work / "jetstream")
        ref.start()
        try:
            if args.kept:
                large = Path(args.large_kept) if args.large_kept else None
                out = measure_kept(ref, work, Path(args.kept), args.trials, large, args.jetstream_window)
                print(json.dumps(out), flush=True)
            else:
                print(json.dumps(measure(ref, work, args.messages, args.trials)), flush=True)
        finally:
            ref.stop()


if __name__ == "__main__":
    main()
