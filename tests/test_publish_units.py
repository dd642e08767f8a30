"""The pure parts of the publish path, tested directly: Go durations and TTL values, the duplicate
window's expiry and rollback, and header rewriting. The wire behaviour is pinned by the
differential tests in test_publish_semantics.py and test_publish_ttl.py."""

from __future__ import annotations

import pytest

from gateway.api.durations import BadDuration, parse_go_duration
from gateway.engine.dedup import DedupWindow
from gateway.engine.msg_ttl import NEVER, InvalidTTL, parse_ttl
from gateway.engine.publish_checks import set_header

S = 1_000_000_000


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("0", 0),
        ("1s", S),
        ("1.5s", 1_500_000_000),
        ("1h30m", 5400 * S),
        ("-2m", -120 * S),
        ("250ms", 250_000_000),
        ("1us", 1_000),
        (".5s", 500_000_000),
    ],
)
def test_go_durations(text: str, ns: int) -> None:
    assert parse_go_duration(text) == ns


@pytest.mark.parametrize("text", ["", "1", "s", "1x", "1s2", "--1s", "1.s.", " 1s"])
def test_bad_go_durations(text: str) -> None:
    with pytest.raises(BadDuration):
        parse_go_duration(text)


@pytest.mark.parametrize(
    ("value", "seconds"), [("never", NEVER), ("NEVER", NEVER), ("5", 5), ("1m", 60), ("1.9s", 1), ("00", 0)]
)
def test_ttl_values(value: str, seconds: int) -> None:
    assert parse_ttl(value) == seconds


@pytest.mark.parametrize("value", ["0", "0s", "500ms", "-1", "1.5", "soon", "-5s"])
def test_ttl_rejections(value: str) -> None:
    with pytest.raises(InvalidTTL):
        parse_ttl(value)


def test_dedup_window_expires_and_rolls_back() -> None:
    w = DedupWindow()
    w.record("a", 1, 100, 100, 50)
    w.record("", 2, 110, 110, 50)
    w.record("b", 3, 120, 120, 50)
    assert w.lookup("a", 140, 50) == 1
    assert w.lookup("a", 150, 50) is None  # the window has passed
    assert w.last_msg_id == "b"
    w.forget_after(2)  # seq 3 was never committed
    assert w.lookup("b", 121, 50) is None
    assert w.last_msg_id == ""
    w.forget_after(1)
    assert w.last_msg_id == "a"
    w.record("c", 4, 200, 200, 50)  # expiry on record drops "a"
    assert len(w) == 1


def test_set_header_replaces_every_line() -> None:
    block = b"NATS/1.0\r\nNats-TTL: 1\r\nX: y\r\nNats-TTL: 2\r\n\r\n"
    assert set_header(block, "Nats-TTL", "5") == b"NATS/1.0\r\nX: y\r\nNats-TTL: 5\r\n\r\n"
