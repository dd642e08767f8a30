"""Account-wide answers across gateways (per-stream ownership, #19, protocol item 4).

Each gateway serves only its streams, but ``$JS.API.INFO``, ``STREAM.NAMES`` and ``STREAM.LIST``
speak of the whole account; the meta owner answers them. It asks every gateway at once on an
internal subject of the hub, ``$JLK.<domain>.STREAMS`` (every gateway subscribes it, so one
publish reaches all), and each answers with its streams as STREAM.LIST renders them and its usage
(``StreamApi.summary``). The meta owner waits until every live gateway answered or
:data:`TIMEOUT_S` passed: a stream placed on a gateway that did not answer is listed as
``missing``, as a cluster lists a stream whose leader did not answer. The requests are few (one per
account-wide API request), so nothing is cached.

The same subjects carry **forwarded creates**: the meta owner answers a create of a new stream only
when the placement puts the stream on itself; otherwise it forwards the request, as the client sent
it, to the gateway placed (``$JLK.<domain>.F.<digest of its name>.<the API subject>``, the client's
reply subject kept), which creates and answers it. A real cluster places a stream when it creates
it; a stream created on the meta owner and moved afterwards would leave its first requests
unanswered while it moves.

The forwarding subscription doubles as each gateway's **presence** on the hub: the hub tells every
leaf of every other leaf's subscriptions (``LS+``/``LS-``), and it withdraws a gateway's within
milliseconds of its connection closing (``kill -9``, a crash, a cut link), where the store learns
of it only when a lease of announcements has gone by (:attr:`Gathering.presence`). And the meta
owner says on ``$JLK.<domain>.PLACED`` that it recorded a new placement, so that the others follow
it at once rather than at their next read of the record (:attr:`Gathering.placed`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable, Collection
from typing import Any

from gateway.runtime.signals import Signal
from gateway.wire.leaf import LeafConnection
from gateway.wire.protocol import Msg

log = logging.getLogger(__name__)

#: How long the meta owner waits for the other gateways' answers.
TIMEOUT_S = 0.5
#: The internal subjects' prefix (not under ``$JS.``: the hub maps and denies those on leaf links).
PREFIX = "$JLK."


class Gathering:
    """One gateway's side of the gathering: it answers every request with its summary, and, as
    the meta owner, asks (:meth:`gather`)."""

    def __init__(
        self, domain: str, name: str, leaf: LeafConnection, summary: Callable[[], dict[str, Any]]
    ) -> None:
        self.name = name
        self._leaf = leaf
        self._summary = summary
        self.request_subject = f"{PREFIX}{domain}.STREAMS"
        self._domain = domain
        # a gateway's name holds its host's dots: the subjects carry a digest of it
        token = digest(name)
        self._reply_prefix = f"{PREFIX}{domain}.R.{token}."
        self._forwarded_prefix = self.forward_prefix(name)
        #: Told of a request another gateway forwarded here (its subject the client's again).
        self.on_forwarded: Callable[[Msg], None] | None = None
        self._placed_subject = f"{PREFIX}{domain}.PLACED"
        #: Told when the meta owner says it recorded a placement.
        self.placed: Signal[[]] = Signal()
        #: Told when another gateway's presence on the hub comes (True) or goes (False), by the
        #: digest of its name (:func:`digest`).
        self.presence: Signal[[str, bool]] = Signal()
        self._presence_prefix = f"{PREFIX}{domain}.F."
        self._stop_watching = leaf.interest.moved.connect(self._moved)
        self._asked = 0
        #: The gatherings under way: request number → the answers so far, and who to wake.
        self._open: dict[str, tuple[dict[str, dict[str, Any]], asyncio.Event, frozenset[str]]] = {}

    def subscribe(self) -> None:
        self._leaf.subscribe(self.request_subject)
        self._leaf.subscribe(self._reply_prefix + ">")
        self._leaf.subscribe(self._forwarded_prefix + ">")
        self._leaf.subscribe(self._placed_subject)

    def close(self) -> None:
        self._stop_watching()

    def say_placed(self) -> None:
        """Meta owner: a new placement is recorded; the others read it now."""
        self._leaf.publish(self._placed_subject, b"")

    def _moved(self, subject: str, here: bool) -> None:
        """``Interest.moved``: another gateway's forwarding subscription came or went."""
        if subject.startswith(self._presence_prefix) and subject.endswith(".>"):
            token = subject[len(self._presence_prefix) : -2]
            if "." not in token and subject != self._forwarded_prefix + ">":
                self.presence.emit(token, here)

    def forward_prefix(self, gateway: str) -> str:
        return f"{PREFIX}{self._domain}.F.{digest(gateway)}."

    def forward(self, gateway: str, msg: Msg) -> None:
        """Hand the API request ``msg`` to ``gateway``, which answers the client."""
        self._leaf.publish(self.forward_prefix(gateway) + msg.subject, msg.data, msg.reply, msg.hdrs)

    def on_msg(self, msg: Msg) -> None:
        """A request (answered with this gateway's summary) or an answer to one of its own."""
        if msg.subject == self._placed_subject:
            self.placed.emit()
            return
        if msg.subject == self.request_subject:
            if msg.reply:
                body = {"gateway": self.name, **self._summary()}
                self._leaf.publish(msg.reply, json.dumps(body, separators=(",", ":")).encode())
            return
        if msg.subject.startswith(self._forwarded_prefix):
            if self.on_forwarded is not None:
                msg.subject = msg.subject[len(self._forwarded_prefix) :]
                self.on_forwarded(msg)
            return
        if not msg.subject.startswith(self._reply_prefix):
            return
        gathering = self._open.get(msg.subject[len(self._reply_prefix) :])
        if gathering is None:
            return  # late: that gathering ended
        answers, done, expected = gathering
        try:
            answer = json.loads(msg.data)
            answers[str(answer["gateway"])] = answer
        except (ValueError, KeyError, TypeError):
            log.warning("an unreadable answer to a gathering: %r", msg.data[:200])
            return
        if expected <= answers.keys():
            done.set()

    async def gather(self, expected: Collection[str]) -> dict[str, dict[str, Any]]:
        """Each gateway's answer by name: every one of ``expected`` (the other live gateways),
        or those that answered within :data:`TIMEOUT_S`."""
        names = frozenset(expected) - {self.name}
        if not names:
            return {}
        self._asked += 1
        key = str(self._asked)
        answers: dict[str, dict[str, Any]] = {}
        done = asyncio.Event()
        self._open[key] = (answers, done, names)
        try:
            self._leaf.publish(self.request_subject, b"", reply=self._reply_prefix + key)
            try:
                await asyncio.wait_for(done.wait(), TIMEOUT_S)
            except TimeoutError:
                log.warning("no answer from %s within %.1f s", sorted(names - answers.keys()), TIMEOUT_S)
        finally:
            del self._open[key]
        answers.pop(self.name, None)  # the hub may hand a leaf its own request
        return answers


def digest(name: str) -> str:
    """What a gateway's subjects carry for its name (which holds its host's dots)."""
    return hashlib.blake2b(name.encode(), digest_size=8).hexdigest()
