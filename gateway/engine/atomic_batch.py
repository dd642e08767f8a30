"""Atomic batch publish (ADR-50, ``allow_atomic``): messages that carry ``Nats-Batch-Id`` and
``Nats-Batch-Sequence`` are held aside until the one with ``Nats-Batch-Commit``, then checked as one
and accepted together, so they reach the store in one commit or not at all. Pure: what to hold,
refuse or commit is decided here; the publish path carries it out.

The rules, limits and errors are nats-server's (``processJetStreamAtomicBatchMsg``,
``checkMsgHeadersPreClusteredProposal``): a batch starts at sequence 1, a gap or an unknown batch
is incomplete (the batch is dropped), at most 1,000 messages, 50 batches in flight per stream and
1,000 in all, dropped after 10 s without a message; ``Nats-Batch-Commit: eob`` commits without
storing the message that carries it. Held batches live in the gateway's memory (the server keeps
them in a store of their own): a restart drops them, and their publisher sees an incomplete batch.

A batch the server abandons (``sendStreamBatchAbandonedAdvisory``) comes back as :class:`Abandoned`
for the publish path to announce: ``timeout`` (idle, found by the path's timer through
:meth:`AtomicBatches.expire`), ``incomplete`` (a gap, a sequence seen before, ``eob`` on the first
message), ``large`` (past 1,000 messages) and ``unsupported`` (``Nats-Required-Api-Level`` above
the gateway's). A batch refused for anything else (an unknown batch, a bad commit value, its checks
at commit) is dropped without one, as by the server, and so are the batches of a stream deleted or
no longer allowing atomic publish.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.api import errors
from gateway.api.configs import StreamConfig
from gateway.api.requests import above_api_level
from gateway.engine.dedup import DedupWindow
from gateway.engine.publish_checks import (
    Accepted,
    Duplicate,
    StreamView,
    Verdict,
    check_before_msg_id,
    check_in_batch,
    without_header,
)
from gateway.engine.stream import Publish
from storage_delta.format.nats import parse_headers

MAX_BATCH_SIZE = 1000
MAX_INFLIGHT_PER_STREAM = 50
MAX_INFLIGHT_TOTAL = 1000
IDLE_TIMEOUT_NS = 10_000_000_000
MAX_ID_LEN = 64

TOO_LARGE = errors.ATOMIC_PUBLISH_TOO_LARGE.format(size=MAX_BATCH_SIZE)


@dataclass(slots=True)
class HeldBatch:
    msgs: list[Publish] = field(default_factory=list)
    touched_ns: int = 0


@dataclass(frozen=True, slots=True)
class Held:
    """Held until its commit: the publisher gets an empty reply. Without another message by
    ``idle_until_ns`` the batch times out (:meth:`AtomicBatches.expire`)."""

    batch_id: str
    idle_until_ns: int


@dataclass(frozen=True, slots=True)
class Abandoned:
    """The server's BATCH_ABANDONED advisory: ``reason`` is ``timeout``, ``large``,
    ``incomplete`` or ``unsupported``."""

    stream: str
    batch_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Dropped:
    """The message abandons its batch: its publisher gets ``error``, and ``abandoned`` is
    announced."""

    error: errors.ApiError
    abandoned: Abandoned


@dataclass(frozen=True, slots=True)
class Commit:
    """The batch is complete: check and store ``msgs`` together; the last one's PubAck carries
    ``batch`` and ``count``."""

    batch_id: str
    msgs: list[Publish]


BatchVerdict = Held | Commit | Dropped | errors.ApiError


def _batch_seq(text: str | None) -> int | None:
    return int(text) if text is not None and text.isascii() and text.isdigit() else None


class AtomicBatches:
    """The batches held for every stream of the gateway (the in-flight limits count them all)."""

    def __init__(self) -> None:
        self._held: dict[str, dict[str, HeldBatch]] = {}
        self._total = 0

    def hold(self, stream: str, subject: str, hdrs: bytes, data: bytes, now_ns: int) -> BatchVerdict:
        """One message of a batch, on a stream that allows atomic publish, judged in the server's
        order (``processJetStreamAtomicBatchMsg``)."""
        h = parse_headers(hdrs)
        batch_id = h.get("Nats-Batch-Id", "")
        if len(batch_id) > MAX_ID_LEN:
            return errors.ATOMIC_PUBLISH_INVALID_ID
        seq = _batch_seq(h.get("Nats-Batch-Sequence"))
        if seq is None:
            return errors.ATOMIC_PUBLISH_MISSING_SEQ
        commit_word = h.get("Nats-Batch-Commit")
        eob = commit_word == "eob"
        size = seq - 1 if eob else seq  # the end-of-batch marker is not part of the batch
        batch = self._batch_for(stream, batch_id, seq, size, now_ns)
        if isinstance(batch, errors.ApiError):
            return batch
        if commit_word is not None and not eob and commit_word != "1":
            self._drop(stream, batch_id)
            return errors.ATOMIC_PUBLISH_INVALID_COMMIT
        kept: bytes | None = hdrs
        if h.get("Nats-Required-Api-Level"):  # refuses the batch, or is taken out of the message
            if above_api_level(hdrs):
                return self._abandon(stream, batch_id, errors.REQUIRED_API_LEVEL, "unsupported")
            kept = without_header(hdrs, "Nats-Required-Api-Level")
        timed_out = now_ns - batch.touched_ns > IDLE_TIMEOUT_NS  # before the timer could say so
        if seq != len(batch.msgs) + 1 or timed_out or (seq == 1 and eob):
            return self._abandon(stream, batch_id, errors.ATOMIC_PUBLISH_INCOMPLETE, "incomplete")
        if size > MAX_BATCH_SIZE:
            return self._abandon(stream, batch_id, TOO_LARGE, "large")
        batch.touched_ns = now_ns
        if commit_word is None:
            batch.msgs.append((subject, kept, data))
            return Held(batch_id, now_ns + IDLE_TIMEOUT_NS)
        self._drop(stream, batch_id)
        if eob:
            last_subject, last_hdrs, last_data = batch.msgs[-1]
            batch.msgs[-1] = (last_subject, _with_commit(last_hdrs), last_data)
        else:
            batch.msgs.append((subject, kept, data))
        return Commit(batch_id, batch.msgs)

    def _batch_for(
        self, stream: str, batch_id: str, seq: int, size: int, now_ns: int
    ) -> HeldBatch | errors.ApiError:
        """The message's batch, started by a first message if there is room for one."""
        batches = self._held.setdefault(stream, {})
        batch = batches.get(batch_id)
        if batch is not None:
            return batch
        if seq != 1:
            return TOO_LARGE if size > MAX_BATCH_SIZE else errors.ATOMIC_PUBLISH_INCOMPLETE
        if len(batches) + 1 > MAX_INFLIGHT_PER_STREAM or self._total + 1 > MAX_INFLIGHT_TOTAL:
            return errors.ATOMIC_PUBLISH_TOO_MANY_INFLIGHT
        batch = batches[batch_id] = HeldBatch(touched_ns=now_ns)
        self._total += 1
        return batch

    def expire(self, stream: str, batch_id: str, now_ns: int) -> Abandoned | None:
        """The batch's idle time may be up (the server's cleanup timer): if it is, it goes and
        its ``timeout`` is announced."""
        batch = self._held.get(stream, {}).get(batch_id)
        if batch is None or now_ns - batch.touched_ns <= IDLE_TIMEOUT_NS:
            return None
        self._drop(stream, batch_id)
        return Abandoned(stream, batch_id, "timeout")

    def forget_stream(self, stream: str) -> None:
        """The stream is gone, or no longer allows atomic publish: what it held goes, without
        an advisory (the server's ``deleteAtomicBatches``)."""
        self._total -= len(self._held.pop(stream, {}))

    def _abandon(self, stream: str, batch_id: str, error: errors.ApiError, reason: str) -> Dropped:
        self._drop(stream, batch_id)
        return Dropped(error, Abandoned(stream, batch_id, reason))

    def _drop(self, stream: str, batch_id: str) -> None:
        if self._held[stream].pop(batch_id, None) is not None:
            self._total -= 1


def _with_commit(hdrs: bytes | None) -> bytes:
    """The last stored message of a batch committed by ``eob`` carries the ordinary commit header."""
    head = hdrs[:-2] if hdrs else b"NATS/1.0\r\n"
    return head + b"Nats-Batch-Commit: 1\r\n\r\n"


@dataclass(slots=True)
class _StagedView:
    """The stream as the batch's next message sees it: its messages before it counted as stored."""

    stream: StreamView
    staged: int = 0
    subjects: set[str] = field(default_factory=set)

    @property
    def config(self) -> StreamConfig:
        return self.stream.config

    @property
    def dedup(self) -> DedupWindow:
        return self.stream.dedup

    @property
    def last_seq(self) -> int:
        return self.stream.last_seq + self.staged

    def last_seq_for(self, subject: str) -> int:
        return self.stream.last_seq_for(subject)

    def last_seq_matching(self, subject: str) -> int:
        return self.stream.last_seq_matching(subject)


def check_batch(
    stream: StreamView, msgs: list[Publish], now_ns: int, full: tuple[int, errors.ApiError] | None
) -> list[Accepted] | errors.ApiError:
    """Every message of a complete batch, checked in order as the server checks a batch: a
    ``Nats-Expected-Last-Msg-Id`` is refused, a message id seen before (in the window or earlier in
    the batch) refuses the batch, an expected last sequence only holds on the first message, an
    expected subject sequence not for a subject the batch already wrote, a subject rollup only on
    a subject's first message and a stream rollup only on the first; then whether it still fits
    (``full``: the first message a ``discard: new`` stream has no room for, and the error). The
    first refusal is the answer for the whole batch."""
    view = _StagedView(stream)
    ids: set[str] = set()
    out: list[Accepted] = []
    for i, (subject, hdrs, data) in enumerate(msgs):
        verdict = _check_one(view, ids, subject, hdrs, data, now_ns)
        if isinstance(verdict, errors.ApiError):
            return verdict
        if full is not None and full[0] == i:
            return full[1]
        out.append(verdict)
        view.staged += 1
        view.subjects.add(subject)
    return out


def _check_one(
    view: _StagedView, ids: set[str], subject: str, hdrs: bytes | None, data: bytes, now_ns: int
) -> Accepted | errors.ApiError:
    """One message of a batch, in the server's order for one (``checkMsgHeadersPreClusteredProposal``):
    the headers a batch refuses, those checked before the msg id, the msg id, then the rest."""
    h = parse_headers(hdrs)
    if h.get("Nats-Expected-Last-Msg-Id"):
        return errors.ATOMIC_PUBLISH_UNSUPPORTED_HEADER.format(header="Nats-Expected-Last-Msg-Id")
    refused = check_before_msg_id(view.config, h, hdrs)
    if refused is not None:
        return refused
    msg_id = h.get("Nats-Msg-Id", "")
    cfg = view.config
    if msg_id and (msg_id in ids or view.dedup.lookup(msg_id, now_ns, cfg.duplicate_window) is not None):
        return errors.ATOMIC_PUBLISH_DUPLICATE_ID
    if view.staged and "Nats-Expected-Last-Sequence" in h:
        last = view.last_seq
        expected = h["Nats-Expected-Last-Sequence"]
        return (
            errors.STREAM_WRONG_LAST_SEQUENCE.format(seq=last)
            if expected != str(last)
            else errors.STREAM_WRONG_LAST_SEQUENCE_CONSTANT
        )
    if "Nats-Expected-Last-Subject-Sequence" in h:
        target = h.get("Nats-Expected-Last-Subject-Sequence-Subject") or subject
        if target in view.subjects:
            return errors.STREAM_WRONG_LAST_SEQUENCE_CONSTANT
    ids.add(msg_id)
    verdict: Verdict = check_in_batch(view, subject, hdrs, data, now_ns)
    if type(verdict) is Duplicate:
        return errors.ATOMIC_PUBLISH_DUPLICATE_ID
    if isinstance(verdict, errors.ApiError):
        return verdict
    assert type(verdict) is Accepted
    if verdict.rollup == "sub" and subject in view.subjects:
        return errors.STREAM_ROLLUP_FAILED.format(err="batch rollup sub invalid")
    if verdict.rollup == "all" and view.staged:
        return errors.STREAM_ROLLUP_FAILED.format(err="batch rollup all invalid")
    return verdict
