"""The dashboard page in headless Chromium (Debian's ``chromium``, driven by Playwright): it renders
the API's stream and consumer numbers, refreshes by itself, and shows an error on a wrong token."""

from __future__ import annotations

import shutil
from pathlib import Path

import nats
import numpy as np
import pytest
from PIL import Image
from playwright.async_api import Browser, async_playwright, expect

from tests.monitor_fixtures import TOKEN, MonitoredJetlake, ack_floor_scenario, api, monitor_url

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
                    assert [t.strip() for t in await crow.locator("td").all_inner_texts()] == [
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
