"""The one way a part tells others of an event (gateway/runtime/signals.py)."""

from __future__ import annotations

from gateway.runtime.signals import Signal


def test_listeners_hear_in_order_until_they_disconnect() -> None:
    signal: Signal[[int]] = Signal()
    heard: list[tuple[str, int]] = []
    assert not signal
    stop_a = signal.connect(lambda n: heard.append(("a", n)))
    signal.connect(lambda n: heard.append(("b", n)))
    assert signal
    signal.emit(1)
    stop_a()
    signal.emit(2)
    assert heard == [("a", 1), ("b", 1), ("b", 2)]


def test_a_listener_that_disconnects_while_told_does_not_skip_the_others() -> None:
    signal: Signal[[]] = Signal()
    heard: list[str] = []

    def once() -> None:
        heard.append("once")
        stop()

    stop = signal.connect(once)
    signal.connect(lambda: heard.append("always"))
    signal.emit()
    signal.emit()
    assert heard == ["once", "always", "always"]
