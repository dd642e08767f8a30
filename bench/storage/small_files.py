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
from functools import partial
from pathlib import Path
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig

from bench.spark_read import spark_read
from bench.targets import stream_state, wait_stream_messages
from gateway.runtime.settings import Settings
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


def _readers(roots: dict[str, Path], count: int, trials: int, with_spark: bool = False) -> dict[str, Result]:
    """An independent reader's time for every row of the stream in each store (``roots``: name ->
    store root), interleaved trial by trial so that every store meets the same load and the same
    warm caches: deltalake and DuckDB, and with ``with_spark`` a Spark batch read on the jetlake source
    (every row's payload summed, in one running session after a first read of each store, as
    :func:`bench.spark_read.spark_read` reads)."""
    runs: dict[str, dict[str, list[float]]] = {name: {} for name in roots}

    def timed(read: Callable[[Path], int]) -> Callable[[Path], float]:
        def run(root: Path) -> float:
            t0 = time.monotonic()
            assert read(root) == count
            return time.monotonic() - t0

        return run

    def delta_rs(root: Path) -> int:  # a fresh handle each time, as an independent reader opens the table
        dt = open_existing(StoreRoot(str(root)), sch.MESSAGES)
        assert dt is not None
        rows: int = dt.to_pyarrow_table(filters=[("stream", "=", STREAM)]).num_rows
        return rows

    def duckdb(root: Path) -> int:
        sql = "SELECT * FROM delta_scan(?) WHERE stream = ?"
        table = duckdb_connection().execute(sql, [str(root / "messages"), STREAM]).to_arrow_table()
        return int(table.num_rows)

    def spark(root: Path) -> float:  # the read's own clock: the session is started outside it
        seconds: float = spark_read(str(root), count, STREAM, warm_reads=0)["seconds"]
        return seconds

    readers = {"deltalake_read_s": timed(delta_rs), "duckdb_read_s": timed(duckdb)}
    if with_spark:
        for root in roots.values():
            spark(root)  # the session's and each store's first read, not counted
        readers["spark_read_s"] = spark
    for trial in range(trials):
        order = list(roots.items())
        for name, root in order[::-1] if trial % 2 else order:  # neither store always read first
            for key, read in readers.items():
                runs[name].setdefault(key, []).append(read(root))
    return {name: {key: _median(times) for key, times in got.items()} for name, got in runs.items()}


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


def _after_publish(lake: Jetlake, count: int, trials: int, readers: bool = True) -> Result:
    """Restarts after ``kill -9``, a new consumer's reads and the independent readers' of a
    stream of ``count`` messages that ``lake`` (running) holds."""
    files = len(live_files(StoreRoot(str(lake.data_root)), STREAM))
    restarts, drains = _restarts_and_drains(
        lake.kill_gateway, partial(lake.start_gateway, ready_s=3600), lake.url, count, trials
    )
    out = _figures(lake, files, restarts, drains)
    if readers:
        out.update(_readers({"it": lake.data_root}, count, trials)["it"])
    return out


def _figures(lake: Jetlake, files: int, restarts: list[float], drains: list[tuple[float, float]]) -> Result:
    return {
        "files_at_kill": files,
        "restart_after_kill9_s": _median(restarts, 2),
        **_cold_reads(drains),
        "files_at_read": _settled(StoreRoot(str(lake.data_root))),
    }


def _serving_kept(kept: Path) -> tuple[Jetlake, int]:
    """A gateway on a kept store, and the stream's message count, once the gateway's compaction
    is done with what the writer left: its rounds at start and, ``compact_idle_ms`` later, its idle
    rounds, as a gateway that served the writer's publishes would have left the stream."""
    lake = Jetlake(kept)
    lake.start_server()
    try:
        lake.start_gateway(ready_s=3600)
        time.sleep(Settings().compact_idle_ms / 1000)
        _settled(StoreRoot(str(lake.data_root)))
        return lake, int(asyncio.run(stream_state(lake.url, STREAM))["messages"])
    except BaseException:
        lake.stop()
        raise


def measure_kept(
    ref: ReferenceJetStream,
    workdir: Path,
    kept: Path,
    trials: int,
    large_kept: Path | None,
    js_window: int,
    spark: bool = False,
) -> Result:
    """The same figures for the stream of a store written before (``--keep`` of an earlier run,
    e.g. one message per commit for an hour), against the same messages in large commits and on
    JetStream (sync publishes, as the kept stream's were). ``large_kept``: the large commits' store
    kept too (``bench.storage.one_per_commit --per-commit 256``), not published here; ``js_window``:
    PubAcks in flight on JetStream (its file store holds the same blocks however they came);
    ``spark``: a Spark batch read of both stores too. Both stores are served side by side and
    measured in turn, trial by trial (restart, drain; then each reader), so that both meet the same
    load."""
    lakes: dict[str, Jetlake] = {}
    try:
        lakes["kept"], count = _serving_kept(kept)
        if large_kept is None:
            lakes["large"] = Jetlake(workdir / "large")
            lakes["large"].start()
            asyncio.run(_publish(lakes["large"].url, count, 256))
        else:
            lakes["large"], large_count = _serving_kept(large_kept)
            assert large_count == count, f"{large_kept} holds {large_count} messages, {kept} {count}"
        files = {
            name: len(live_files(StoreRoot(str(lake.data_root)), STREAM)) for name, lake in lakes.items()
        }
        restarts: dict[str, list[float]] = {name: [] for name in lakes}
        drains: dict[str, list[tuple[float, float]]] = {name: [] for name in lakes}
        for _ in range(trials):
            for name, lake in lakes.items():
                start = partial(lake.start_gateway, ready_s=3600)
                restarted, drained = _restarts_and_drains(lake.kill_gateway, start, lake.url, count, 1)
                restarts[name] += restarted
                drains[name] += drained
        out = {
            name: _figures(lake, files[name], restarts[name], drains[name]) for name, lake in lakes.items()
        }
    finally:
        for lake in lakes.values():
            lake.stop()
    for name, read in _readers(
        {n: lake.data_root for n, lake in lakes.items()}, count, trials, spark
    ).items():
        out[name].update(read)
    kept_out, large = out["kept"], out["large"]
    js = _jetstream(ref, count, trials, js_window)
    ratios = _ratios("kept", kept_out, large, js)
    if spark:
        ratios["spark_kept_vs_large"] = _ratio(kept_out["spark_read_s"], large["spark_read_s"])
    return {
        "workload": "small_files_kept",
        "messages": count,
        "trials": trials,
        "jetlake_kept": kept_out,
        "jetlake_large_commits": large,
        "jetstream": js,
        **ratios,
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
    ap.add_argument("--spark", action="store_true", help="with --kept: a Spark batch read of both stores too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="jetlake-smallfiles-") as tmp:
        work = Path(args.keep or tmp)
        ref = ReferenceJetStream(work / "jetstream")
        ref.start()
        try:
            if args.kept:
                large = Path(args.large_kept) if args.large_kept else None
                out = measure_kept(
                    ref, work, Path(args.kept), args.trials, large, args.jetstream_window, args.spark
                )
                print(json.dumps(out), flush=True)
            else:
                print(json.dumps(measure(ref, work, args.messages, args.trials)), flush=True)
        finally:
            ref.stop()


if __name__ == "__main__":
    main()
