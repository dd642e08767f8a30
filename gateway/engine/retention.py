"""Retention by consumers, as pure rules over a stream and its consumers (no I/O).

Work-queue streams drop a message once its (only) consumer acked it; interest streams drop it once
every consumer whose filter matches its subject has acked it, and keep nothing no consumer wants.
Removal goes through ``Stream.remove``: invisible at once, in the removal log soon after, and
physically removed by the Spark jobs later (docs/storage.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.api import errors
from gateway.api.configs import ConsumerConfig
from gateway.engine.consumer import Consumer
from gateway.engine.stream import Stream
from storage_delta.format.nats import subjects_overlap


def policy(stream: Stream) -> str:
    return stream.config.retention


def settle(stream: Stream, consumers: Iterable[Consumer], seqs: Iterable[int]) -> int:
    """After acks of ``seqs``: remove those retention no longer keeps; the number removed."""
    kind = policy(stream)
    if kind == "limits":
        return 0
    everyone = list(consumers)
    removed = 0
    for seq in seqs:
        subject = stream.subject_of(seq)
        if subject is None:
            continue
        wanted = [c for c in everyone if c.matches(subject)]
        if all(c.has_acked(seq) for c in wanted) and stream.remove(seq):
            removed += 1
    return removed


def sweep_unwanted(stream: Stream, consumers: Iterable[Consumer], first: int, last: int) -> int:
    """Interest streams keep nothing no consumer's filter matches (JetStream acks the publish
    with a sequence and keeps nothing); applied to newly stored ``first..last``."""
    if policy(stream) != "interest":
        return 0
    everyone = list(consumers)
    removed = 0
    for seq in range(first, last + 1):
        subject = stream.subject_of(seq)
        if subject is not None and not any(c.matches(subject) for c in everyone) and stream.remove(seq):
            removed += 1
    return removed


def check_new_consumer(stream: Stream, others: Iterable[Consumer], cfg: ConsumerConfig) -> None:
    """A work-queue stream's rules for a new consumer, in the real server's order and words."""
    if policy(stream) != "workqueue":
        return
    if cfg.ack_policy == "none" and not cfg.is_push:
        raise errors.CONSUMER_WQ_PULL_EXPLICIT
    if cfg.ack_policy != "explicit":
        raise errors.CONSUMER_WQ_EXPLICIT
    if cfg.deliver_policy != "all":
        raise errors.CONSUMER_WQ_DELIVER_ALL
    filters = cfg.filters
    for other in others:
        theirs = other.filters
        if not filters:
            raise errors.CONSUMER_WQ_MULTIPLE_UNFILTERED
        if not theirs or any(subjects_overlap(a, b) for a in filters for b in theirs):
            raise errors.CONSUMER_WQ_NOT_UNIQUE
