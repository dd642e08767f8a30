"""Priority groups on pull consumers (ADR-42): which waiting pull request a message goes to.

Pure rules over a consumer's waiting queue and its pin, as the server has them
(``processNextMsgRequest`` and ``nextWaiting`` in ``server/consumer.go``):

* ``overflow``: a request with ``min_pending`` or ``min_ack_pending`` is served only while the
  consumer has at least that many messages pending, or that many awaiting their ack; others wait.
* ``pinned_client``: the first request of a group, with no ``id``, is given the consumer's one pin
  (a PINNED advisory); while the pin holds, only requests naming it are served (requests without an
  id wait, a request naming another id is refused: ``423 Nats-Pin-Id mismatch`` when it arrives,
  ``423 Nats-Wrong-Pin-Id`` when a message is to be delivered). Every delivery carries
  ``Nats-Pin-Id``. The pin lapses ``priority_timeout`` after it was given or after its holder's
  last pull (an UNPINNED advisory, reason ``timeout``), or goes with CONSUMER.UNPIN (``admin``).
* ``prioritized``: requests queue by ``priority``, 0 first (see ``PullRequestQueue``); requests of
  one priority take a message each in turn.

Requests whose body is not JSON have no priority group: the server checks nothing of them and, on
a ``pinned_client`` consumer without a pin, serves them without giving a pin (``Nats-Pin-Id`` empty).
"""

from __future__ import annotations

from typing import NamedTuple

from gateway.api import advisories
from gateway.api.pull import (
    NO_MESSAGES,
    PIN_ID_MISMATCH,
    PullRequest,
    Status,
    priority_status,
    timeout_status,
    wrong_pin_status,
)
from gateway.engine.consumer import Consumer, Pin


class Choice(NamedTuple):
    """What choosing a request for the next message found: the request (None: none may take it
    now), requests it refused on the way (each removed from the queue), and advisories."""

    request: PullRequest | None
    refused: list[Status]
    events: list[tuple[str, bytes]]


def admit(consumer: Consumer, req: PullRequest, now: int) -> Status | None:
    """The refusal of an arriving request by its priority group, if any; a pull by the pin's holder
    keeps the pin for another ``priority_timeout``."""
    cfg = consumer.config
    refused = priority_status(req, cfg)
    if refused is not None:
        return refused
    pg, pin = req.priority_group, consumer.pin
    if pg is not None and cfg.priority_policy and pin is not None:
        if pg.id == pin.id:
            pin.expires_ns = now + cfg.priority_timeout
        elif pg.id:
            return Status(req.reply, *PIN_ID_MISMATCH)
    return None


def enqueue(consumer: Consumer, req: PullRequest) -> None:
    if consumer.config.priority_policy == "prioritized":
        consumer.waiting.push_prioritized(req)
    else:
        consumer.waiting.push(req)


def selective(consumer: Consumer) -> bool:
    """Whether the next message may skip the oldest waiting request (a pin, or overflow limits)."""
    return consumer.pin is not None or consumer.config.priority_policy in ("pinned_client", "overflow")


def take_turns(consumer: Consumer) -> bool:
    """``prioritized``: while several requests wait, those of one priority get a message each in
    turn (the server's ``popAndRequeue``), so each message is given on its own."""
    return consumer.config.priority_policy == "prioritized" and len(consumer.waiting) > 1


def gated(req: PullRequest) -> bool:
    """Whether the request is served only while the consumer has enough pending (overflow): it is
    looked at again before each message."""
    pg = req.priority_group
    return pg is not None and (pg.min_pending > 0 or pg.min_ack_pending > 0)


def choose(consumer: Consumer, now: int) -> Choice:
    """The request the next message goes to, when the consumer has one to deliver. Expired
    requests on the way get their 408, requests naming a pin that is not the consumer's their 423;
    the first request that may take a pin when there is none gets one. When none may take it,
    ``no_wait`` requests end with 404."""
    refused: list[Status] = []
    events: list[tuple[str, bytes]] = []
    waiting = consumer.waiting
    for req in list(waiting):
        if req.expires_at_ns and req.expires_at_ns <= now:
            waiting.finish(req)
            refused.append(timeout_status(req))
            continue
        verdict = _pinned(consumer, req, now, events)
        if verdict is False:
            waiting.finish(req)
            refused.append(wrong_pin_status(req))
            continue
        if verdict is None or not _overflows(consumer, req):
            continue
        return Choice(req, refused, events)
    # none may take it: a no_wait request is done, unless it still has time to wait (as when the
    # stream has nothing more for it)
    for req in [r for r in waiting if r.no_wait and (r.delivered or not r.expires_at_ns)]:
        waiting.finish(req)
        refused.append(Status(req.reply, *NO_MESSAGES))
    return Choice(None, refused, events)


def _pinned(consumer: Consumer, req: PullRequest, now: int, events: list[tuple[str, bytes]]) -> bool | None:
    """Whether the pin lets ``req`` be served (True), makes it wait (None) or refuses it (False);
    a request that may take a pin when there is none takes it."""
    pg, pin = req.priority_group, consumer.pin
    cfg = consumer.config
    if pin is None:
        if cfg.priority_policy != "pinned_client":
            return True
        if pg is not None and pg.id:
            return False  # the id of a pin that lapsed or was taken away
        if pg is not None and pg.group:
            pin = consumer.pin = Pin(advisories.new_id(), pg.group, now, now + cfg.priority_timeout, req)
            pg.id = pin.id
            events.append(advisories.pinned(consumer.stream.name, consumer.name, pg.group, pin.id, now))
        return True
    if pg is not None and pg.id == pin.id:
        return True
    return None if pg is None or not pg.id else False


def _overflows(consumer: Consumer, req: PullRequest) -> bool:
    """``overflow``: whether the consumer has the pending messages (counting the one about to go;
    a redelivery the server counts once more) or the acks pending that the request waits for."""
    pg = req.priority_group
    if consumer.config.priority_policy != "overflow" or pg is None or not gated(req):
        return True
    seq = consumer.next_seq()
    pending = consumer.num_pending() + (1 if seq is not None and seq in consumer.pending else 0)
    return (0 < pg.min_pending <= pending) or (0 < pg.min_ack_pending <= len(consumer.pending))


def too_big(consumer: Consumer, req: PullRequest) -> None:
    """The message is too big for the request's ``max_bytes`` (it ends with a 409): a request that
    was given the pin for this very message gives it back, without an advisory, as on the server."""
    pin = consumer.pin
    if pin is not None and pin.taker is req and not req.delivered:
        consumer.pin = None


def lapse(consumer: Consumer, now: int) -> tuple[str, bytes] | None:
    """The pin's time ran out: it goes (the UNPINNED advisory names the group it was given in)."""
    pin = consumer.pin
    if pin is None or pin.expires_ns > now:
        return None
    consumer.pin = None
    return advisories.unpinned(consumer.stream.name, consumer.name, pin.group, "timeout", now)


def unpin(consumer: Consumer, group: str, now: int) -> tuple[str, bytes]:
    """CONSUMER.UNPIN of one of the consumer's groups: the pin goes, if there was one; the
    advisory is sent either way, as the server sends it."""
    consumer.pin = None
    return advisories.unpinned(consumer.stream.name, consumer.name, group, "admin", now)


def pin_header(consumer: Consumer) -> str | None:
    """The ``Nats-Pin-Id`` a pull delivery carries: a ``pinned_client`` consumer's pin, empty when
    it has none (a request without a priority group was served); None on other policies."""
    if consumer.config.priority_policy != "pinned_client":
        return None
    return consumer.pin.id if consumer.pin is not None else ""
