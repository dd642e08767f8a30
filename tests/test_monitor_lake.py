"""The operations view's parts: the history's rates, percentiles and bounds (``gateway/monitor/history.py``),
the census of the messages table (``storage_delta/maintenance/census.py``), the lake's estimate and
warnings (``gateway/monitor/lake.py``); and a real gateway with its compaction off and its index
snapshots rare, whose ``/lake``, ``/metrics`` and dashboard say what to do about it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import nats
import pytest
from playwright.async_api import async_playwright, expect

from gateway.adapters.compactor import RoundRecord
from gateway.monitor.history import ConsumerReading, History, Reading, quantile
from gateway.monitor.lake import (
    PENDING_FILES_WARN,
    RECLAIM_WARN_MIN_BYTES,
    StreamLake,
    unreclaimed,
    warnings,
)
from gateway.runtime.settings import Settings
from storage_delta.maintenance.census import StreamFiles, count_files
from storage_delta.maintenance.files import LiveFile
from storage_delta.tables.jobruns import JobFigures, JobRun
from tests.harness import serving
from tests.monitor_fixtures import TOKEN, MonitoredJetlake, get_json, http_get, monitor_url, samples
from tests.test_monitor_dashboard import chromium

BOUNDS = (0.001, 0.01, 0.1)


def reading(
    t: float,
    stored: dict[str, int],
    consumers: list[ConsumerReading] = (),  # type: ignore[assignment]
    puback: list[int] | None = None,
) -> Reading:
    held = {name: 10 * n for name, n in stored.items()}
    return Reading(t, 1_000 + t, stored, held, list(consumers), puback or [0, 0, 0, 0], BOUNDS)


def points(history: History, metric: str) -> dict[str, list[float]]:
    return {
        "/".join(s["labels"].values()): [v for _, v in s["points"]]
        for s in history.render()["series"]
        if s["metric"] == metric
    }


def test_quantile_interpolates_within_the_bucket_as_prometheus_does() -> None:
    # 10 observations: 4 up to 1 ms, 6 in (1 ms, 10 ms]
    assert quantile(0.5, BOUNDS, [4, 6, 0, 0]) == pytest.approx(0.001 + 0.009 * (5 - 4) / 6)
    assert quantile(0.2, BOUNDS, [4, 6, 0, 0]) == pytest.approx(0.001 * 2 / 4)
    assert quantile(0.99, BOUNDS, [0, 0, 0, 3]) == 0.1  # beyond the last bound: the last bound
    assert quantile(0.5, BOUNDS, [0, 0, 0, 0]) is None


def test_rates_are_differences_over_the_elapsed_time() -> None:
    h = History()
    c0 = ConsumerReading("S", "c", 10, 2, 5)
    h.add(reading(0.0, {"S": 100}, [c0]))
    h.add(reading(2.0, {"S": 140}, [replace(c0, delivered=30, ack_pending=3, lag=7)]))
    assert points(h, "ingest") == {"S": [20.0]}  # 40 messages in 2 s; the first reading gives no rate
    assert points(h, "delivery") == {"S": [10.0]}
    assert points(h, "lag") == {"S/c": [5, 7]}
    assert points(h, "ack_pending") == {"S/c": [2, 3]}
    assert points(h, "bytes") == {"S": [1000, 1400]}


def test_a_counter_that_went_down_gives_no_rate_and_gone_series_go() -> None:
    h = History()
    h.add(reading(0.0, {"S": 100, "T": 5}, [ConsumerReading("S", "c", 10, 0, 0)]))
    # S was deleted and made anew (its count restarted); T and the consumer are gone
    h.add(reading(1.0, {"S": 3}, []))
    assert points(h, "ingest") == {}
    assert points(h, "lag") == {}
    h.add(reading(2.0, {"S": 8}, []))
    assert points(h, "ingest") == {"S": [5.0]}


def test_series_keep_at_most_capacity_points() -> None:
    h = History(capacity=3)
    for t in range(10):
        h.add(reading(float(t), {"S": 10 * t}))
    (series,) = [s for s in h.render()["series"] if s["metric"] == "ingest"]
    assert [p[0] for p in series["points"]] == [1007.0, 1008.0, 1009.0]  # the newest three


def test_a_later_series_has_only_its_own_points_and_top_keeps_the_highest() -> None:
    h = History(capacity=3)
    h.add(reading(0.0, {"A": 0}))
    h.add(reading(1.0, {"A": 1}))
    h.add(reading(2.0, {"A": 2, "B": 0}))  # B appears: no rate yet
    h.add(reading(3.0, {"A": 3, "B": 7}))
    h.add(reading(4.0, {"A": 4, "B": 9}))  # the ring has turned over: A's first rate fell out
    times = {
        s["labels"]["stream"]: [t for t, _ in s["points"]]
        for s in h.render()["series"]
        if s["metric"] == "ingest"
    }
    assert times == {"A": [1002.0, 1003.0, 1004.0], "B": [1003.0, 1004.0]}
    (top,) = [s for s in h.render(top=1)["series"] if s["metric"] == "ingest"]
    assert top["labels"] == {"stream": "B"}  # 2 msg/s now, against A's 1
    assert [v for _, v in top["points"]] == [7.0, 2.0]


def test_puback_percentiles_count_only_the_sample_window() -> None:
    h = History()
    h.add(reading(0.0, {"S": 0}, puback=[0, 0, 1000, 0]))  # a slow past
    h.add(reading(1.0, {"S": 10}, puback=[10, 0, 1000, 0]))  # this second: ten fast PubAcks
    h.add(reading(2.0, {"S": 10}, puback=[10, 0, 1000, 0]))  # none: no point
    got = points(h, "puback_seconds")
    assert got["0.5"] == [pytest.approx(0.0005)]
    assert got["0.99"] == [pytest.approx(0.00099)]


def test_series_at_rest_hold_their_values_through_the_ring() -> None:
    """Idle streams and consumers are passed over by the sampler (#23): their points are the same
    as if every sample had been written, across the ring turning over, a change after a long rest,
    a stream going and coming back, and ``top`` choosing by the latest value."""
    h = History(capacity=4)
    c = ConsumerReading("S", "c", 0, 0, 3)
    for t in range(6):  # S at rest from t=1 on, longer than the ring; T busy
        h.add(reading(float(t), {"S": 50, "T": 2 * t}, [c]))
    assert points(h, "ingest") == {"S": [0.0] * 4, "T": [2.0] * 4}
    assert points(h, "lag") == {"S/c": [3] * 4}
    assert points(h, "bytes")["S"] == [500] * 4
    moved = replace(c, delivered=2, ack_pending=2, lag=1)
    for t in range(6, 9):  # S moves once, then rests again
        h.add(reading(float(t), {"S": 54, "T": 2 * t}, [moved]))
    assert points(h, "ingest") == {"S": [0.0, 4.0, 0.0, 0.0], "T": [2.0] * 4}
    assert points(h, "delivery") == {"S": [0.0, 2.0, 0.0, 0.0], "T": [0.0] * 4}
    assert points(h, "lag") == {"S/c": [3, 1, 1, 1]}
    assert points(h, "ack_pending") == {"S/c": [0, 2, 2, 2]}
    assert points(h, "bytes") == {"S": [500, 540, 540, 540], "T": [100, 120, 140, 160]}
    (top,) = [s for s in h.render(top=1)["series"] if s["metric"] == "bytes"]
    assert top["labels"] == {"stream": "S"}  # at rest, and the most bytes
    # at rest but for one counter: a publish raises the lag alone; a removal lowers the bytes
    # alone; a publish and a removal of one size raise the count alone
    more = replace(moved, lag=4)
    h.add(Reading(9.0, 1009.0, {"S": 54, "T": 18}, {"S": 500, "T": 180}, [more], [0] * 4, BOUNDS))
    h.add(Reading(10.0, 1010.0, {"S": 55, "T": 20}, {"S": 500, "T": 200}, [more], [0] * 4, BOUNDS))
    assert points(h, "lag") == {"S/c": [1, 1, 4, 4]}
    assert points(h, "bytes")["S"] == [540, 540, 500, 500]
    assert points(h, "ingest")["S"] == [0.0, 0.0, 0.0, 1.0]
    h.add(reading(11.0, {"T": 22}, []))  # S and its consumer gone
    h.add(reading(12.0, {"S": 54, "T": 24}, [c]))  # and back, made anew
    assert points(h, "ingest") == {"T": [2.0] * 4}
    assert points(h, "bytes")["S"] == [540]
    assert points(h, "lag") == {"S/c": [3]}


def live(block: int, lo: int, hi: int, size: int = 100, ts: int = 10) -> LiveFile:
    return LiveFile("S", block, f"b{block}-{lo}", size, lo, hi, ts, ts, hi - lo + 1)


def test_the_census_counts_blocks_backlogs_and_an_earlier_incarnation() -> None:
    files = [
        *(live(0, s, s) for s in range(1, 4)),  # a full block of three files: unsealed
        live(1, 1000, 1999, size=5000),  # a sealed full block
        *(live(2, s, s) for s in range(2000, 2020)),  # twenty one-message files in the active block
        LiveFile("S", 0, "old", 700, 1, 50, 1, 2, 50),  # an earlier stream of the name
        LiveFile("OTHER", 0, "x", 1, 1, 1, 10, 10, 1),  # a stream not asked about
    ]
    (s,) = count_files(files, {"S": 10}, {"S": 2009}, 16, 1 << 20).values()
    assert (s.files, s.bytes, s.blocks) == (25, 3 * 100 + 5000 + 20 * 100 + 700, 3)
    assert s.rows == 3 + 1000 + 20
    assert s.rows_through == 3 + 1000 + 10  # files wholly at or below sequence 2009
    assert s.active_block_files == 20
    assert s.unsealed_full_blocks == 1
    # the compaction's own plan: the full block's three files, and the active block's run of twenty
    assert s.compaction_pending_files == 3 + 20
    assert (s.stale_files, s.stale_bytes) == (1, 700)


def test_unreclaimed_counts_rows_the_stream_no_longer_shows_and_stale_files() -> None:
    f = StreamFiles(files=2, bytes=1200, rows=100, rows_through=100, stale_files=1, stale_bytes=200)
    assert unreclaimed(f, visible=100) == 200
    assert unreclaimed(f, visible=25) == 200 + 75 * 10  # 1,000 bytes over 100 rows
    assert unreclaimed(f, visible=150) == 200  # more shown than stored (in flight): no negative


SETTINGS = Settings()
NOW = 2_000_000_000_000_000_000


def lake_stream(**files: int) -> StreamLake:
    return StreamLake("S", StreamFiles(**files), 0, NOW - 10**9, 0, None, None)


def test_a_healthy_stream_gets_no_warning() -> None:
    assert (
        warnings([lake_stream(files=40, bytes=1 << 20, compaction_pending_files=16)], {}, SETTINGS, NOW) == []
    )


def test_each_warning_says_what_to_do() -> None:
    backlog = lake_stream(files=1300, bytes=1 << 20, compaction_pending_files=1200, active_block_files=1250)
    (w,) = warnings([backlog], {}, SETTINGS, NOW)
    assert w.stream == "S"
    assert w.text.startswith("1,200 small files waiting for compaction in S (1,250 in the active block): ")
    assert "compaction is behind" in w.text
    (off,) = warnings([backlog], {}, replace(SETTINGS, compact_min_files=0), NOW)
    assert "compaction is off (compact_min_files = 0)" in off.text

    failed = replace(lake_stream(), compaction=RoundRecord(NOW - 120 * 10**9, 0.2, 0, "disk full"))
    (w,) = warnings([failed], {}, SETTINGS, NOW)
    assert w.text == "the last compaction round of S failed 2 min ago: disk full; it is tried again every 1 s"

    (w,) = warnings([lake_stream(unsealed_full_blocks=5)], {}, SETTINGS, NOW)
    assert "5 full blocks of S" in w.text
    assert "`jetlake jobs run seal`" in w.text

    mib = RECLAIM_WARN_MIN_BYTES
    removed = replace(lake_stream(bytes=3 * mib), unreclaimed_bytes=2 * mib)
    (w,) = warnings([removed], {}, SETTINGS, NOW)
    assert w.text == (
        "2.0 MiB of S's 3.0 MiB on storage are removed messages not yet reclaimed (it has never run): "
        "run `jetlake jobs run retention`"
    )
    ran = {"retention": JobFigures(1, 0, JobRun("retention", NOW - 3 * 3600 * 10**9, 1.0))}
    (w,) = warnings([removed], ran, SETTINGS, NOW)
    assert "(its last run was 3.0 h ago)" in w.text
    # under half of a small stream: no warning
    assert warnings([replace(removed, unreclaimed_bytes=mib)], {}, SETTINGS, NOW) == []

    behind = replace(lake_stream(), snapshot_behind=4 * SETTINGS.index_snapshot_min_new)
    (w,) = warnings([behind], {}, SETTINGS, NOW)
    assert w.text.startswith("40,000 messages of S are beyond its index snapshot (written 1 s ago): ")


@pytest.fixture(scope="module")
def neglected(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MonitoredJetlake]:
    """A gateway whose compaction is off and whose index snapshots are looked at once an hour (due
    from 50 new messages): its small files and its snapshots fall behind as a stream grows."""
    settings = {
        "JETLAKE_COMPACT_MIN_FILES": "0",
        "JETLAKE_INDEX_SNAPSHOT_INTERVAL_MS": "3600000",
        "JETLAKE_INDEX_SNAPSHOT_MIN_NEW": "50",
    }
    yield from serving(MonitoredJetlake(Path(tmp_path_factory.mktemp("neglected")), settings))


@pytest.mark.alone  # 300 synced one-file commits: beside another process, both slow
async def test_a_neglected_lake_is_reported_with_what_to_do(neglected: MonitoredJetlake) -> None:
    """300 publishes, each awaited (one commit and one file each), of 4 KiB that do not compress,
    into a stream that keeps 10: /lake counts the files and the removed bytes, warns about the
    compaction (off), the removed bytes (retention never ran) and the index snapshot (none yet),
    /metrics counts the warnings, and the dashboard shows them."""
    n = PENDING_FILES_WARN + 44
    nc = await nats.connect(neglected.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="PILE", subjects=["pile"], max_msgs=10)
        for _ in range(n):
            await js.publish("pile", os.urandom(4096))
    finally:
        await nc.close()
    lake = get_json(monitor_url(neglected) + "/lake")
    (s,) = [s for s in lake["streams"] if s["name"] == "PILE"]
    assert s["files"] == s["active_block_files"] == s["rows"] == n  # nothing merged, nothing reclaimed
    assert s["compaction_pending_files"] == n  # one run of n files of one tier
    assert s["bytes"] * (n - 10) // n - 4096 <= s["unreclaimed_bytes"] <= s["bytes"]
    assert s["index_snapshot"]["behind"] == n
    assert lake["compaction"]["on"] is False
    texts = {w["text"].split(":")[0] for w in lake["warnings"] if w["stream"] == "PILE"}
    assert texts == {
        f"{n} small files waiting for compaction in PILE ({n} in the active block)",
        f"{s['unreclaimed_bytes'] / 2**20:.1f} MiB of PILE's {s['bytes'] / 2**20:.1f} MiB on storage are "
        "removed messages not yet reclaimed (it has never run)",
        f"{n} messages of PILE are beyond its index snapshot (it has none)",
    }
    metrics = samples(http_get(monitor_url(neglected) + "/metrics")[1].decode())
    assert metrics[("jetlake_lake_warnings", frozenset())] == 3
    pile = frozenset({("stream", "PILE")})
    assert metrics[("jetlake_lake_stream_files", pile)] == n
    assert metrics[("jetlake_lake_stream_unreclaimed_bytes", pile)] == s["unreclaimed_bytes"]

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium(), headless=True)
        try:
            page = await browser.new_page()
            await page.goto(f"{monitor_url(neglected)}/#token={TOKEN}")
            items = page.locator('#warnings li[data-stream="PILE"]')
            await expect(items).to_have_count(3, timeout=15_000)
            await expect(items.first).to_contain_text("compaction is off")
            row = page.locator('#lake tr[data-stream="PILE"] td')
            await expect(row.nth(1)).to_have_text(str(n))
        finally:
            await browser.close()
