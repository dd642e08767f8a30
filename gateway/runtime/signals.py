"""Events one part tells of and other parts listen to.

A part that has something to tell (a consumer went, a stream's durable sequence moved) owns a
:class:`Signal` from its constructor on and does not know who listens; a listener connects when it
starts and disconnects, with the handle ``connect`` gave it, when it stops. So no part is built with
a hole that another fills in later (an Optional callback attribute, a do-nothing lambda), and the
order the service builds its parts in is the order they depend on each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, ParamSpec

P = ParamSpec("P")


class Signal(Generic[P]):
    """Listeners are called in the order they connected, on the emitter's stack (the event loop's
    thread): a listener must be quick and must not raise."""

    __slots__ = ("_listeners",)

    def __init__(self) -> None:
        self._listeners: tuple[Callable[P, None], ...] = ()

    def connect(self, listener: Callable[P, None]) -> Callable[[], None]:
        """Listen from now on; call what this returns to stop."""
        self._listeners = (*self._listeners, listener)

        def disconnect() -> None:
            self._listeners = tuple(x for x in self._listeners if x is not listener)

        return disconnect

    def emit(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for listener in self._listeners:
            listener(*args, **kwargs)

    def __bool__(self) -> bool:
        """Whether anyone listens (an emitter skips building what nobody reads)."""
        return bool(self._listeners)
