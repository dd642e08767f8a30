"""The dashboard page in headless Chromium (Debian's ``chromium``, driven by Playwright): it renders
the API's stream and consumer numbers, refreshes by itself, and shows an error on a wrong token;
under publish and consume load it draws the charts of the last minutes with one line per stream,
consumer or percentile, and the lake's table. ``JETLAKE_DASHBOARD_PNG=<path>`` keeps the loaded
page's screenshot (docs/dashboard.png is made so)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import nats
import numpy as np
import pytest
from PIL import Image
from playwright.async_api import Browser, async_playwright, expect

from tests.monitor_fixtures import (
    TOKEN,
    MonitoredJetlake,
    ack_floor_scenario,
    api,
    get_json,
    load,
    monitor_url,
)

LAG_BAR_RGB = (0xE0, 0x7A, 0x1F)  # .bar in gateway/static/dashboard.html
VIEWPORT = {"width": 1200, "height": 640}


def chromium() -> str:
    """Playwright cannot download its browser here; `make test` installs Debian's chromium."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium is not installed: apt-get install -y chromium (make test does it)")
    return path


async def open_page(browser: Browser, url: str):  # type: ignore[no-untyped-def]
    page = await browser.new_page(viewport=VIEWPORT)  # type: ignore[arg-type]
    await page.goto(url)
    return page


def count_pixels(png: Path, rgb: tuple[int, int, int], tolerance: int = 12) -> int:
    pixels = np.asarray(Image.open(png).convert("RGB"), dtype=np.int16)
    return int((np.abs(pixels - np.array(rgb, dtype=np.int16)) <= tolerance).all(axis=2).sum())


async def test_dashboard_renders_streams_and_consumers(monitored: MonitoredJetlake, tmp_path: Path) -> None:
    unique = "ORDERS"  # this module's jetlake is its own: a short name keeps the screenshot readable
    nc = await nats.connect(monitored.url)
    try:
        await ack_floor_scenario(nc, unique)
        info = await api(nc, f"STREAM.INFO.{unique}")
        cinfo = {c: await api(nc, f"CONSUMER.INFO.{unique}.{c}") for c in ("fast", "slow")}
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=chromium(), headless=True)
            try:
                page = await open_page(browser, f"{monitor_url(monitored)}/#token={TOKEN}")
                row = page.locator(f'#streams tr[data-stream="{unique}"]')
                await expect(row).to_have_count(1, timeout=15_000)
                st = info["state"]
                assert await row.locator("td").all_inner_texts() == [
                    unique,
                    f"{unique.lower()}.>",
                    *(str(st[k]) for k in ("messages", "bytes", "first_seq", "last_seq", "consumer_count")),
                ]
                for cname, ci in cinfo.items():
                    crow = page.locator(f'#consumers tr[data-stream="{unique}"][data-consumer="{cname}"]')
                    lag = st["last_seq"] - ci["ack_floor"]["stream_seq"]
                    cells = [t.strip() for t in await crow.locator("td").all_inner_texts()]
                    # the last: how long the lag has not fallen, from /history (timing: its form only)
                    assert re.fullmatch(r"(\d+ (s|min) \(\+\d+\))?", cells[-1]), cells[-1]
                    assert cells[:-1] == [
                        unique,
                        cname,
                        str(ci["delivered"]["stream_seq"]),
                        str(ci["ack_floor"]["stream_seq"]),
                        str(ci["num_ack_pending"]),
                        str(ci["num_redelivered"]),
                        str(ci["num_waiting"]),
                        str(ci["num_pending"]),
                        str(lag),
                    ]
                shot = tmp_path / "dashboard.png"
                await page.screenshot(path=str(shot))

                # it refreshes by itself: three more messages show up without a reload
                js = nc.jetstream()
                for i in range(3):
                    await js.publish(f"{unique.lower()}.a", f"late{i}".encode())
                await expect(row.locator("td").nth(2)).to_have_text(str(st["messages"] + 3), timeout=10_000)

                # a wrong token is reported on the page, not silently shown as an empty store
                bad = await open_page(browser, f"{monitor_url(monitored)}/#token=wrong")
                await expect(bad.locator("#status.error")).to_contain_text("401", timeout=10_000)
            finally:
                await browser.close()
    finally:
        await nc.close()

    # the screenshot shows a page, with the consumers' lag bars drawn
    img = Image.open(shot)
    assert img.size == (VIEWPORT["width"], VIEWPORT["height"])
    assert len(np.unique(np.asarray(img.convert("L")))) > 10  # not a blank page
    assert count_pixels(shot, LAG_BAR_RGB) > 100


def series_name(metric: str, labels: dict[str, str]) -> str:
    """The name the page gives a ``/history`` series: percentile, stream/consumer or stream."""
    if metric == "puback_seconds":
        return f"p{round(float(labels['quantile']) * 100)}"
    return f"{labels['stream']}/{labels['consumer']}" if "consumer" in labels else labels["stream"]


def history_points(history: dict[str, Any], metric: str) -> dict[str, list[float]]:
    """The values of each series of ``metric`` that has points, by the page's name for it."""
    return {
        series_name(metric, s["labels"]): [v for _, v in s["points"]]
        for s in history["series"]
        if s["metric"] == metric and s["points"]
    }


@pytest.mark.waits  # five of the history's one-a-second samples
async def test_dashboard_draws_the_last_minutes_under_load(
    monitored: MonitoredJetlake, tmp_path: Path
) -> None:
    """Under a publisher and two consumers (one acking, one not) the six charts are drawn with a
    line per series, each with the points /history holds, named by stream, stream/consumer or
    percentile; the slow consumer's lag line climbs; the lake table shows the stream's files."""
    name = "LOAD"
    nc = await nats.connect(monitored.url)
    shot = tmp_path / "loaded.png"
    try:
        async with load(nc, name), async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=chromium(), headless=True)
            try:
                page = await browser.new_page(viewport={"width": 1280, "height": 900})
                await page.goto(f"{monitor_url(monitored)}/#token={TOKEN}")
                # the charts fill as samples arrive (one a second): wait for five points of each line
                for metric, series in (
                    ("ingest", name),
                    ("delivery", name),
                    ("lag", f"{name}/slow"),
                    ("lag", f"{name}/fast"),
                    ("ack_pending", f"{name}/slow"),
                    ("puback_seconds", "p99"),
                    ("bytes", name),
                ):
                    path = page.locator(f'figure[data-metric="{metric}"] path.series[data-series="{series}"]')
                    await expect(path).to_have_count(1, timeout=20_000)
                    five_or_more = re.compile(r"^([5-9]|\d\d+)$")
                    await expect(path).to_have_attribute("data-points", five_or_more, timeout=20_000)
                # the consumer that never acks: its lag has not fallen for some seconds, and rose
                rising = page.locator(f'#consumers tr[data-stream="{name}"][data-consumer="slow"] td').last
                await expect(rising).to_have_text(re.compile(r"^\d+ s \(\+[1-9]\d*\)$"))
                lake_row = page.locator(f'#lake tr[data-stream="{name}"]')
                await expect(lake_row).to_have_count(1, timeout=10_000)
                await page.screenshot(path=str(shot), full_page=True)
                drawn = await page.evaluate(
                    """() => [...document.querySelectorAll("figure.chart")].map(f => [
                        f.dataset.metric,
                        [...f.querySelectorAll("path.series")].map(p => [
                            p.dataset.series, Number(p.dataset.points), p.getAttribute("d")]),
                        [...f.querySelectorAll("ul.legend li")].map(li => li.dataset.series)])"""
                )
            finally:
                await browser.close()
        history = get_json(monitor_url(monitored) + "/history")
        lake = get_json(monitor_url(monitored) + "/lake")
    finally:
        await nc.close()

    assert [m for m, _, _ in drawn] == ["ingest", "delivery", "lag", "ack_pending", "puback_seconds", "bytes"]
    for metric, paths, legend in drawn:
        names = [n for n, _, _ in paths]
        assert names == legend  # every line has its legend entry
        # the lines are the series /history has (all of them: fewer than the page's cap of 8)
        assert set(names) == set(history_points(history, metric)), metric
        for series, points, d in paths:
            # one move and a line to each further point: as many vertices as the series has points
            assert d.count("M") == 1, (metric, series)
            assert d.count("L") == points - 1, (metric, series)
    by_metric = {m: {n: d for n, _, d in paths} for m, paths, _ in drawn}
    assert {f"{name}/fast", f"{name}/slow"} <= set(by_metric["lag"])
    assert {"p50", "p90", "p99"} == set(by_metric["puback_seconds"])

    # the numbers behind the lines: ingest and delivery moved, the slow consumer's lag only grew
    assert max(history_points(history, "ingest")[name]) > 0
    assert max(history_points(history, "delivery")[name]) > 0
    slow_lag = history_points(history, "lag")[f"{name}/slow"]
    assert slow_lag == sorted(slow_lag)
    assert slow_lag[-1] > slow_lag[0]
    assert max(history_points(history, "ack_pending")[f"{name}/slow"]) > 0
    held = history_points(history, "bytes")[name]  # nothing removes messages: it only grows
    assert held == sorted(held)
    assert held[-1] > held[0]
    (row,) = [s for s in lake["streams"] if s["name"] == name]
    assert row["files"] >= 1
    assert row["bytes"] > 0
    assert row["rows"] > 0

    img = Image.open(shot)
    assert len(np.unique(np.asarray(img.convert("L")))) > 10  # not a blank page
    assert count_pixels(shot, (0x1F, 0x6F, 0xB2), tolerance=30) > 50  # the first series' colour
    keep = os.environ.get("JETLAKE_DASHBOARD_PNG")
    if keep:  # a small copy for the docs: 64 colours are plenty for a page of lines and tables
        img.convert("RGB").quantize(64).save(keep, optimize=True)
