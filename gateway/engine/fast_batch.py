"""Fast batch publish (ADR-50 "fast ingest", ``allow_batched``): a publisher streams messages whose
reply subject says which batch they belong to, ``<prefix>.<id>.<flow>.<gap>.<seq>.<op>.$FI``, and the
stream answers every ``flow``-th message with a flow ack instead of a PubAck per message. Unlike an
atomic batch nothing is held: each message is checked and stored as an ordinary publish, and the
batch only keeps counters. Pure: what to answer and whether to store is decided here; the publish
path stores, and sends what this decides only once the commit holding the messages before it is
durable (so a flow ack for batch sequence N always means "1..N are on stable storage").

The rules, answers and limits are nats-server's (``processJetStreamFastBatchMsg``, ``getFastBatch``,
``fastBatchRegisterSequences``, ``checkFlowControl`` in ``server/stream.go`` and
``jetstream_batching.go``), as a standalone server runs them, where every message is stored before
the next is looked at: the first message gets ``{"type":"ack","seq":0,"msgs":N}`` (N the client's
flow up to 500, or 1 when the stream has other fast batches), then an ack each time the stored
sequence passes the last ack by N (N doubling towards ``500 / batches`` and the client's flow, or
halving), ``{"type":"gap",…}`` for a missing sequence (``ok`` goes on, ``fail`` ends the batch),
``{"type":"err",…}`` for a message a check refused (``fail`` ends the batch), and the final PubAck
with ``batch`` and ``count``. Operation 2 commits with its message, 3 (end of batch) without, 4
pings: it reports a gap and resends the last flow ack. 1,000 batches in flight per stream and 50,000
in all (429/10211), dropped after 10 s without a message (then 10208 "batch publish ID unknown").
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

from gateway.api import errors
from gateway.api.requests import above_api_level
from gateway.engine.publish_checks import without_header

SUFFIX = ".$FI"
OP_START, OP_APPEND, OP_COMMIT, OP_COMMIT_EOB, OP_PING = range(5)
MAX_ID_LEN = 64
MAX_INFLIGHT_PER_STREAM = 1000
MAX_INFLIGHT_TOTAL = 50_000
IDLE_TIMEOUT_NS = 10_000_000_000
#: The most messages a flow ack may stand for, shared by a stream's fast batches.
FLOW_BUDGET = 500
DEFAULT_FLOW = 10
MAX_FLOW = 65535
_U64 = 2**64
_OPS = {str(op): op for op in range(5)}


class FastRef(NamedTuple):
    """What a fast batch message's reply subject says (a tuple: one is made per message)."""

    batch_id: str
    seq: int
    #: The most messages the client lets one flow ack stand for.
    flow: int
    gap_ok: bool
    op: int


def _go_int64(text: str) -> int:
    """nats-server's ``parseInt64``: -1 unless every character is a digit, wrapping past int64."""
    if not text or not (text.isascii() and text.isdigit()):
        return -1
    if len(text) < 19:
        return int(text)
    # 10**64 is a multiple of 2**64: the last 64 digits decide the wrapped value
    return (int(text[-64:]) + 2**63) % _U64 - 2**63


def parse_reply(reply: str) -> FastRef | errors.ApiError | None:
    """The batch a reply subject names; ``None`` when it does not end in ``.$FI`` (an ordinary
    publish), the server's 10206 when it does but does not follow the pattern. Read from the end
    as the server reads it: an operation 0-4, a sequence (start: 1, append: above 1, end of batch:
    not 1), ``ok`` or ``fail``, a flow (anything but a positive number reads as 10, capped at
    65535), then the id, which needs a token before it."""
    if not reply.endswith(SUFFIX) or len(reply) <= len(SUFFIX):
        return None
    tokens = reply[: -len(SUFFIX)].rsplit(".", 5)
    if len(tokens) < 6:
        return errors.BATCH_PUBLISH_INVALID_PATTERN
    _, batch_id, flow_text, gap, seq_text, op_text = tokens
    op = _OPS.get(op_text)
    if op is None:
        op = _go_int64(op_text)
    digits = seq_text.lstrip("0")
    seq = int(digits or "0") if seq_text.isascii() and seq_text.isdigit() and len(digits) <= 20 else 0
    if not OP_START <= op <= OP_PING or not 0 < seq < _U64 - 1:
        return errors.BATCH_PUBLISH_INVALID_PATTERN
    if (seq == 1 and op == OP_COMMIT_EOB) or (op in (OP_START, OP_APPEND) and (op == OP_START) != (seq == 1)):
        return errors.BATCH_PUBLISH_INVALID_PATTERN
    if gap not in ("ok", "fail"):
        return errors.BATCH_PUBLISH_INVALID_PATTERN
    flow = _go_int64(flow_text)
    flow = DEFAULT_FLOW if flow <= 0 else min(flow, MAX_FLOW)
    return FastRef(batch_id, seq, flow, gap == "ok", op)


@dataclass(frozen=True, slots=True)
class FlowAck:
    """``{"type":"ack"}``: batch sequences up to ``seq`` are stored (on stable storage once sent);
    the next ack comes ``msgs`` later."""

    seq: int
    msgs: int


@dataclass(frozen=True, slots=True)
class FlowGap:
    """``{"type":"gap"}``: the batch expected ``last_seq`` next and got ``seq``."""

    last_seq: int
    seq: int


@dataclass(frozen=True, slots=True)
class FlowErr:
    """``{"type":"err"}``: batch message ``seq`` was refused."""

    seq: int
    error: errors.ApiError


@dataclass(frozen=True, slots=True)
class BatchDone:
    """The batch's PubAck: the stream sequence of its last stored message (0 for none) and the
    batch sequence it ended at; ``duplicate`` when its only message was a duplicate."""

    stream_seq: int
    count: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class Refused:
    """An error PubAck, as for an ordinary publish (the batch, if any, is gone)."""

    error: errors.ApiError


Answer = FlowAck | FlowGap | FlowErr | BatchDone | Refused


@dataclass(slots=True)
class Begun:
    """What a message's arrival decided: answers first, then, when ``store``, the message is
    checked and stored and its outcome given to :meth:`FastBatches.settle`."""

    answers: list[Answer] = field(default_factory=list)
    store: bool = False
    #: The headers to check and store (``Nats-Required-Api-Level`` is taken out).
    hdrs: bytes | None = None


@dataclass(slots=True)
class _Batch:
    gap_ok: bool
    max_flow: int
    flow: int = 0
    lseq: int = 0  # highest batch sequence taken
    pseq: int = 0  # highest batch sequence stored
    fseq: int = 0  # batch sequence of the last flow ack
    sseq: int = 0  # stream sequence of the last stored message
    commit: bool = False
    touched_ns: int = 0


class FastBatches:
    """Every stream's fast batches (the in-flight limits count them all)."""

    def __init__(self) -> None:
        self._streams: dict[str, dict[str, _Batch]] = {}
        #: Every batch by the time of its last message, oldest first: idle ones expire from the front.
        self._by_age: OrderedDict[tuple[str, str], _Batch] = OrderedDict()

    def begin(self, stream: str, ref: FastRef, hdrs: bytes | None, no_ack: bool, now_ns: int) -> Begun:
        """A message of a batch on a stream that allows them, whose size and seal were checked."""
        b = self._batch_for(stream, ref, now_ns)
        if isinstance(b, errors.ApiError):
            return Begun([Refused(b)])
        if hdrs and b"Nats-Required-Api-Level:" in hdrs:
            if above_api_level(hdrs):
                self.drop(stream, ref.batch_id)
                return Begun([Refused(errors.REQUIRED_API_LEVEL)])
            hdrs = without_header(hdrs, "Nats-Required-Api-Level")
        b.touched_ns = now_ns
        self._by_age[(stream, ref.batch_id)] = b
        self._by_age.move_to_end((stream, ref.batch_id))
        if ref.op == OP_PING:
            return Begun(self._ping(stream, ref, b))
        b.lseq += 1
        if b.lseq != ref.seq:
            gap = FlowGap(b.lseq, ref.seq)
            if b.gap_ok and ref.seq > b.lseq:
                b.lseq = ref.seq
            else:  # a sequence seen before, or a gap the batch does not allow: it ends here
                b.lseq -= 1
                return Begun([gap, *self._commit(stream, ref.batch_id, b)])
            answers: list[Answer] = [gap]
        else:
            answers = []
        if ref.op == OP_COMMIT_EOB:
            b.lseq -= 1
            b.pseq = b.lseq
            return Begun([*answers, *self._commit(stream, ref.batch_id, b)])
        if ref.op == OP_COMMIT:
            b.commit = True
        elif ref.seq == 1 and not no_ack:
            answers.append(FlowAck(0, b.flow))
        return Begun(answers, True, hdrs)

    def _batch_for(self, stream: str, ref: FastRef, now_ns: int) -> _Batch | errors.ApiError:
        """The message's batch, started by a first message if there is room for one."""
        if len(ref.batch_id) > MAX_ID_LEN:
            return errors.BATCH_PUBLISH_INVALID_ID
        self._expire(now_ns)
        batches = self._streams.setdefault(stream, {})
        b = batches.get(ref.batch_id)
        if b is not None:
            return b
        if ref.seq != 1 or ref.op == OP_PING:
            return errors.BATCH_PUBLISH_UNKNOWN_ID
        if len(batches) >= MAX_INFLIGHT_PER_STREAM or len(self._by_age) >= MAX_INFLIGHT_TOTAL:
            return errors.BATCH_PUBLISH_TOO_MANY_INFLIGHT
        b = batches[ref.batch_id] = _Batch(ref.gap_ok, ref.flow)
        b.flow = min(FLOW_BUDGET, ref.flow) if len(batches) == 1 else 1
        return b

    def stored(self, stream: str, ref: FastRef, stream_seq: int) -> list[Answer]:
        """The message was stored under ``stream_seq``."""
        b = self._streams[stream][ref.batch_id]
        b.sseq, b.pseq = stream_seq, b.lseq
        if b.commit:
            return self._commit(stream, ref.batch_id, b)
        return self._flow(stream, b)

    def refused(
        self, stream: str, ref: FastRef, error: errors.ApiError | None, duplicate_of: int = 0
    ) -> list[Answer]:
        """A check refused the message (``error``), or it duplicates stream message
        ``duplicate_of`` (``error`` None): a duplicate counts as stored, a refusal is reported and,
        without gaps allowed or on a commit, ends the batch."""
        b = self._streams[stream][ref.batch_id]
        answers: list[Answer] = []
        if error is None:
            b.pseq = ref.seq
            answers += self._flow(stream, b)
            if not b.commit:
                return answers
        if not b.gap_ok and b.lseq == 1:  # the batch's first message: answered as a plain publish
            self.drop(stream, ref.batch_id)
            if error is None:
                return [*answers, BatchDone(duplicate_of, ref.seq, duplicate=True)]
            return [*answers, Refused(error)]
        if error is not None:
            answers.append(FlowErr(ref.seq, error))
            if b.gap_ok and not b.commit:
                return answers
            b.lseq -= 1
            b.pseq = b.lseq
        return [*answers, *self._commit(stream, ref.batch_id, b)]

    def forget_stream(self, stream: str) -> None:
        """The stream is gone, or no longer allows fast batches: its batches go with it."""
        for batch_id in list(self._streams.pop(stream, {})):
            del self._by_age[(stream, batch_id)]

    def _ping(self, stream: str, ref: FastRef, b: _Batch) -> list[Answer]:
        if ref.seq <= b.lseq:
            return [FlowAck(b.fseq, b.flow)]
        answers: list[Answer] = [FlowGap(b.lseq + 1, ref.seq + 1)]
        if not b.gap_ok:
            return [*answers, *self._commit(stream, ref.batch_id, b)]
        b.lseq = b.pseq = ref.seq
        return [*answers, *(self._flow(stream, b) or [FlowAck(b.fseq, b.flow)])]

    def _flow(self, stream: str, b: _Batch) -> list[Answer]:
        """A flow ack once the stored sequence is a whole step past the last one, the step moved
        towards the stream's share of the budget (doubling up, halving down)."""
        if b.pseq < b.fseq + b.flow:
            return []
        b.fseq += (b.pseq - b.fseq) // b.flow * b.flow
        share = min(max(1, FLOW_BUDGET // len(self._streams[stream])), b.max_flow)
        if b.flow < share:
            b.flow = min(b.flow * 2, share)
        elif b.flow > share:
            b.flow = max(b.flow // 2, share)
        return [FlowAck(b.fseq, b.flow)]

    def _commit(self, stream: str, batch_id: str, b: _Batch) -> list[Answer]:
        """The batch ends: its PubAck names what it stored."""
        self.drop(stream, batch_id)
        return [BatchDone(b.sseq, b.lseq)]

    def drop(self, stream: str, batch_id: str) -> None:
        """The batch ends, or is abandoned (its commit failed)."""
        if self._streams.get(stream, {}).pop(batch_id, None) is not None:
            del self._by_age[(stream, batch_id)]

    def _expire(self, now_ns: int) -> None:
        """Batches idle for longer than the timeout are gone (the server's cleanup timer), looked
        at before any message could tell."""
        while self._by_age:
            (stream, batch_id), b = next(iter(self._by_age.items()))
            if now_ns - b.touched_ns <= IDLE_TIMEOUT_NS:
                return
            self.drop(stream, batch_id)
