"""The CLI's text layout (``gateway/tables_fmt.py``): pure functions, checked with values."""

from __future__ import annotations

import pytest

from gateway.cli import tables as fmt


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),  # nothing stored
        (1023, "1,023 B"),  # bytes below a KiB stay bytes
        (1536, "1.5 KiB"),
        (5 * 1024**3, "5.0 GiB"),
    ],
)
def test_size(n: int, text: str) -> None:
    assert fmt.size(n) == text


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "unlimited"),  # a zero max_age means no limit
        (30_000_000_000, "30s"),  # the default ack_wait
        (120_000_000_000, "2m0s"),  # the default duplicate_window
        (3_600_000_000_000, "1h0m0s"),
        (1_500_000_000, "1.5s"),
    ],
)
def test_duration(ns: int, text: str) -> None:
    assert fmt.duration(ns) == text


@pytest.mark.parametrize(
    ("rfc3339", "text"),
    [
        ("2026-11-22T03:10:17.953234361Z", "2026-11-22 03:10:17 UTC"),  # nanoseconds, as the API writes
        ("2026-11-22T03:10:17Z", "2026-11-22 03:10:17 UTC"),
        ("0001-01-01T00:00:00Z", "never"),  # Go's zero time: never happened
        (None, "never"),
    ],
)
def test_timestamp(rfc3339: str | None, text: str) -> None:
    assert fmt.timestamp(rfc3339) == text


def test_table_aligns_numbers_right_and_text_left() -> None:
    out = fmt.table("Streams", ["Name", "Messages"], [["A", "5"], ["LONGER", "1,000"]], right=(1,))
    assert out.splitlines() == [
        "╭───────────────────╮",
        "│      Streams      │",
        "├────────┬──────────┤",
        "│ Name   │ Messages │",
        "├────────┼──────────┤",
        "│ A      │        5 │",
        "│ LONGER │    1,000 │",
        "╰────────┴──────────╯",
    ]


def test_sections_right_align_keys() -> None:
    out = fmt.sections("Heading", [("", [("A", "1")]), ("State", [("Longer key", "2")])])
    assert out.splitlines() == ["Heading", "", "           A: 1", "", "State:", "", "  Longer key: 2"]
