"""What a publish must pass before its stream accepts it, in the order nats-server checks (its
``processJetStreamMsg``): sealed, counters, expected stream, TTL allowed, expected last subject
sequence, expected last sequence, schedules, duplicate id, expected last msg id, rollup, message
size, header size, TTL value. Pure: the stream's live state in, a verdict out.

The live state includes messages accepted but not yet committed, because the gateway gives
sequences at accept time: two publishes racing for ``Nats-Expected-Last-Sequence: 5`` get one
success and one ``wrong last sequence: 6``, as from JetStream. A message without headers (the common
case) costs two comparisons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.api import errors
from gateway.api.configs import StreamConfig
from gateway.engine.dedup import DedupWindow
from gateway.engine.msg_ttl import InvalidTTL, parse_ttl
from storage_delta.format.nats import is_valid_subject, parse_headers

MAX_HEADER_BYTES = 65535


class StreamView(Protocol):
    """What the checks read of a stream (``gateway.engine.stream.Stream`` provides it)."""

    @property
    def dedup(self) -> DedupWindow: ...

    @property
    def config(self) -> StreamConfig: ...

    @property
    def last_seq(self) -> int: ...

    def last_seq_for(self, subject: str) -> int: ...

    def last_seq_matching(self, subject: str) -> int: ...


@dataclass(frozen=True, slots=True)
class Accepted:
    """The publish may be stored, with these (possibly rewritten) headers."""

    hdrs: bytes | None
    msg_id: str = ""
    #: Seconds; 0 for none, -1 (``msg_ttl.NEVER``) for never.
    ttl: int = 0
    #: ``"sub"``, ``"all"`` or ``""``.
    rollup: str = ""
    #: A delete marker (``Nats-Marker-Reason``, or a KV purge): its expiry places no new marker.
    is_marker: bool = False


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A repeat of a message id inside the window: answered with the original sequence."""

    seq: int


@dataclass(frozen=True, slots=True)
class Batched:
    """A message of an atomic batch, on a stream that allows them: held with its batch
    (``gateway.engine.atomic_batch``), checked when the batch commits."""


PLAIN = Accepted(None)
BATCHED = Batched()

Verdict = Accepted | Duplicate | Batched | errors.ApiError


def check_publish(stream: StreamView, subject: str, hdrs: bytes | None, data: bytes, now_ns: int) -> Verdict:
    cfg = stream.config
    if cfg.sealed:
        return errors.STREAM_SEALED
    if not hdrs:
        return _check_size(cfg, 0, data) or PLAIN
    return _check_headers(stream, cfg, subject, hdrs, data, now_ns)


def check_in_batch(stream: StreamView, subject: str, hdrs: bytes | None, data: bytes, now_ns: int) -> Verdict:
    """``check_publish`` for a message of a batch that is checked on its own (atomic batches at
    their commit, fast batches as they come): its ``Nats-Batch-Id`` does not send it back to its
    batch, and it is stored with the headers it came with (a raised TTL rewritten there too)."""
    plain = without_header(hdrs, "Nats-Batch-Id")
    verdict = check_publish(stream, subject, plain, data, now_ns)
    if type(verdict) is not Accepted or plain is hdrs:  # refused, or no headers to put back
        return verdict
    kept = hdrs if verdict.hdrs is plain else set_header(hdrs, "Nats-TTL", str(verdict.ttl))
    return Accepted(kept, verdict.msg_id, verdict.ttl, verdict.rollup, verdict.is_marker)


def check_before_msg_id(cfg: StreamConfig, h: dict[str, str], hdrs: bytes | None) -> errors.ApiError | None:
    """What nats-server checks of an atomic batch message before its msg id, in its order
    (``checkMsgHeadersPreClusteredProposal``): the header size, a counter increment, the expected
    stream, and a TTL (allowed, then valid). A batch's expected sequences come after its msg id."""
    if hdrs and len(hdrs) > MAX_HEADER_BYTES:
        return errors.STREAM_HEADER_EXCEEDS_MAXIMUM
    refused, _, ttl_error = _check_first(cfg, h)
    if refused or not ttl_error:
        return refused
    return errors.MESSAGE_TTL_INVALID if cfg.allow_msg_ttl else errors.MESSAGE_TTL_DISABLED


def _check_first(cfg: StreamConfig, h: dict[str, str]) -> tuple[errors.ApiError | None, int, bool]:
    """The first header checks of any publish: a counter increment, the expected stream, a TTL
    where TTLs are off. The refusal, if any, the TTL, and whether it was invalid (refused later)."""
    incr = h.get("Nats-Incr")
    if incr:
        return _incr_error(incr), 0, False
    expected_stream = h.get("Nats-Expected-Stream")
    if expected_stream and expected_stream != cfg.name:
        return errors.STREAM_NOT_MATCH, 0, False
    ttl_text = h.get("Nats-TTL")
    ttl, ttl_error = _read_ttl(ttl_text) if ttl_text else (0, False)
    return (errors.MESSAGE_TTL_DISABLED if ttl and not cfg.allow_msg_ttl else None), ttl, ttl_error


def _check_size(cfg: StreamConfig, hdr_len: int, data: bytes) -> errors.ApiError | None:
    limit = size_limit(cfg)
    if limit >= 0 and (hdr_len > limit or len(data) > limit - hdr_len):
        return errors.STREAM_MESSAGE_EXCEEDS_MAXIMUM
    return None


def exceeds_size(cfg: StreamConfig, hdrs: bytes | None, data: bytes) -> bool:
    """Whether a message is over ``max_msg_size``, the first thing a fast batch message is held to."""
    return _check_size(cfg, len(hdrs) if hdrs else 0, data) is not None


def size_limit(cfg: StreamConfig) -> int:
    """``max_msg_size`` (headers and payload), -1 for none. A publish without headers on a stream
    that is not sealed passes every check but this one (``check_publish``), so the publish path
    checks runs of them against this number."""
    return cfg.max_msg_size


def _check_header_size(hdrs: bytes) -> errors.ApiError | None:
    return errors.STREAM_HEADER_EXCEEDS_MAXIMUM if len(hdrs) > MAX_HEADER_BYTES else None


def _publishable(subject: str) -> bool:
    return is_valid_subject(subject, allow_wildcards=False)


def _seq_header(value: str) -> int:
    """nats-server reads these as decimal and anything else as a sequence no stream has."""
    return int(value) if value.isdigit() and value.isascii() else -1


#: The headers any check reads; a block with none of them is checked for its size only.
CHECKED = frozenset(
    {
        "Nats-Incr",
        "Nats-Expected-Stream",
        "Nats-TTL",
        "Nats-Expected-Last-Subject-Sequence",
        "Nats-Expected-Last-Subject-Sequence-Subject",
        "Nats-Expected-Last-Sequence",
        "Nats-Schedule",
        "Nats-Schedule-Next",
        "Nats-Scheduler",
        "Nats-Stream-Source",
        "Nats-Msg-Id",
        "Nats-Expected-Last-Msg-Id",
        "Nats-Rollup",
        "Nats-Marker-Reason",
        "KV-Operation",
    }
)
_ID_ONLY = frozenset({"Nats-Msg-Id"})


def _check_headers(
    stream: StreamView, cfg: StreamConfig, subject: str, hdrs: bytes, data: bytes, now_ns: int
) -> Verdict:
    if b"Nats-" not in hdrs and b"KV-Operation" not in hdrs:  # application headers only
        return _check_size(cfg, len(hdrs), data) or _check_header_size(hdrs) or Accepted(hdrs)
    h = parse_headers(hdrs)
    if h.get("Nats-Batch-Id"):  # atomic batches go their own way before any other header check
        return _check_size(cfg, len(hdrs), data) or (
            BATCHED if cfg.allow_atomic else errors.ATOMIC_PUBLISH_DISABLED
        )
    special = CHECKED.intersection(h)
    if special <= _ID_ONLY:  # the common case of an idempotent producer: a msg id and nothing else
        msg_id = h.get("Nats-Msg-Id", "")
        seq = stream.dedup.lookup(msg_id, now_ns, cfg.duplicate_window) if msg_id else None
        if seq is not None:
            return Duplicate(seq)
        return _check_size(cfg, len(hdrs), data) or _check_header_size(hdrs) or Accepted(hdrs, msg_id)
    return _check_special(stream, cfg, subject, h, hdrs, data, now_ns)


def _check_special(
    stream: StreamView,
    cfg: StreamConfig,
    subject: str,
    h: dict[str, str],
    hdrs: bytes,
    data: bytes,
    now_ns: int,
) -> Verdict:
    """Headers that ask something of the stream, in the server's order: the first that fails is
    the answer, though an invalid TTL only counts once the message is known to fit."""
    refused, ttl, ttl_error = _check_first(cfg, h)
    refused = refused or _check_expected_seqs(stream, subject, h) or _check_schedules_and_sources(subject, h)
    if refused:
        return refused
    msg_id = h.get("Nats-Msg-Id", "")
    if msg_id:
        seq = stream.dedup.lookup(msg_id, now_ns, cfg.duplicate_window)
        if seq is not None:
            return Duplicate(seq)
    expected_id = h.get("Nats-Expected-Last-Msg-Id")
    if expected_id and expected_id != stream.dedup.last_msg_id:
        return errors.STREAM_WRONG_LAST_MSG_ID.format(id=stream.dedup.last_msg_id)
    rollup = (h.get("Nats-Rollup") or "").lower()
    refused = _rollup_error(cfg, rollup) if rollup else None
    refused = refused or _check_size(cfg, len(hdrs), data) or _check_header_size(hdrs)
    if refused:
        return refused
    if ttl_error:
        return errors.MESSAGE_TTL_INVALID
    ttl, hdrs = marker_raised_ttl(cfg, ttl, hdrs)
    return Accepted(hdrs, msg_id, ttl, rollup, is_delete_marker(h))


def marker_raised_ttl(cfg: StreamConfig, ttl: int, hdrs: bytes) -> tuple[int, bytes]:
    """A TTL shorter than the stream's subject delete marker TTL is raised to it, the header
    rewritten, as the server does for every stored message (sourced copies too)."""
    marker_ttl_s = cfg.subject_delete_marker_ttl // 1_000_000_000
    if ttl > 0 and marker_ttl_s and cfg.max_msgs_per_subject != 1 and ttl < marker_ttl_s:
        return marker_ttl_s, set_header(hdrs, "Nats-TTL", str(marker_ttl_s))
    return ttl, hdrs


def _incr_error(incr: str) -> errors.ApiError:
    """Counters are off on every jetlake stream; the server still tells a bad increment apart."""
    try:
        int(incr)
    except ValueError:
        return errors.MESSAGE_INCR_INVALID
    return errors.MESSAGE_INCR_DISABLED


def _read_ttl(text: str) -> tuple[int, bool]:
    """The TTL and whether it was invalid: an invalid one is refused only after the size checks."""
    try:
        return parse_ttl(text), False
    except InvalidTTL:
        return 0, True


def _check_expected_seqs(stream: StreamView, subject: str, h: dict[str, str]) -> errors.ApiError | None:
    subj_seq = h.get("Nats-Expected-Last-Subject-Sequence")
    subj_override = h.get("Nats-Expected-Last-Subject-Sequence-Subject")
    if subj_seq:
        last = stream.last_seq_matching(subj_override) if subj_override else stream.last_seq_for(subject)
        if _seq_header(subj_seq) != last:
            return errors.STREAM_WRONG_LAST_SEQUENCE.format(seq=last)
    elif subj_override:
        return errors.STREAM_EXPECTED_LAST_SEQ_PER_SUBJECT_INVALID
    last_seq = h.get("Nats-Expected-Last-Sequence")
    if last_seq and _seq_header(last_seq) != stream.last_seq:
        return errors.STREAM_WRONG_LAST_SEQUENCE.format(seq=stream.last_seq)
    return None


def _check_schedules_and_sources(subject: str, h: dict[str, str]) -> errors.ApiError | None:
    """Headers of features jetlake streams do not have, each refused in the server's words."""
    if h.get("Nats-Schedule"):
        return errors.MESSAGE_SCHEDULES_DISABLED
    schedule_next = h.get("Nats-Schedule-Next")
    if schedule_next:  # clients may only use it to purge a schedule, naming its scheduler subject
        scheduler = h.get("Nats-Scheduler", "")
        if schedule_next != "purge" or not scheduler or scheduler == subject or not _publishable(scheduler):
            return errors.MESSAGE_SCHEDULES_SCHEDULER_INVALID
        return errors.MESSAGE_SCHEDULES_DISABLED
    if h.get("Nats-Scheduler"):
        return errors.MESSAGE_SCHEDULES_SCHEDULER_INVALID
    if h.get("Nats-Stream-Source"):
        return errors.MESSAGE_SOURCE_HEADER_NOT_ALLOWED
    return None


def _rollup_error(cfg: StreamConfig, rollup: str) -> errors.ApiError | None:
    if not cfg.allow_rollup_hdrs or cfg.deny_purge:
        return errors.STREAM_ROLLUP_FAILED.format(err="rollup not permitted")
    if rollup not in ("sub", "all"):
        return errors.STREAM_ROLLUP_FAILED.format(err=f'rollup value invalid: "{rollup}"')
    return None


def is_delete_marker(h: dict[str, str]) -> bool:
    """nats-server's ``isSubjectDeleteMarker``: a server marker or a KV purge."""
    return bool(h.get("Nats-Marker-Reason")) or h.get("KV-Operation") == "PURGE"


def set_header(hdrs: bytes | None, key: str, value: str) -> bytes:
    """The header block with every ``key`` line removed and ``key: value`` appended, as
    nats-server rewrites a raised ``Nats-TTL``."""
    lines = (hdrs or b"NATS/1.0\r\n\r\n").split(b"\r\n")
    prefix = key.encode() + b":"
    kept = [line for line in lines[:-2] if not line.startswith(prefix)]
    return b"\r\n".join([*kept, prefix + b" " + value.encode(), b"", b""])


def without_header(hdrs: bytes | None, key: str) -> bytes | None:
    """The header block with every ``key`` line removed; ``None`` when nothing but the status line
    is left, as nats-server stores a message whose only header it removed. A batch's checks read
    the block without its batch id, which would otherwise send the message back to its batch."""
    if not hdrs:
        return hdrs
    prefix = key.encode() + b":"
    lines = [line for line in hdrs.split(b"\r\n") if not line.startswith(prefix)]
    return None if len(lines) <= 3 else b"\r\n".join(lines)
