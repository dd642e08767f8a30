"""Pull request parsing and the status messages of the pull protocol, as pure functions.

What the real server does with odd bodies was asked of it: a body that does not start with ``{``
and is not a number, or a batch below 1, is served as batch 1; a body that starts with ``{`` but
does not decode into the request struct gets ``400 Bad Request - <the decoder's error>``, and so does
one whose ``idle_heartbeat`` is more than half its ``expires`` (or that has none); one with
a negative ``expires`` has expired on arrival (408 at once); requests above the consumer's ``max_batch``,
``max_expires`` or ``max_bytes`` get a 409 naming the limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.api.configs import ConsumerConfig
from gateway.api.durations import go_duration
from gateway.api.gojson import GoJsonError, Pairs, parse
from gateway.api.structs import BOOL, DURATION, INT, INT64, STRING, decode, go, request_type
from storage_delta.format.nats import no_responders


@dataclass(slots=True)
class PriorityGroup:
    """A JSON pull request's priority group fields (ADR-42); ``id`` becomes the pin's once the
    request is given the pin, so the rest of its batch is served as the pinned client's."""

    group: str
    min_pending: int
    min_ack_pending: int
    id: str
    priority: int


@dataclass(slots=True)
class PullRequest:
    """One ``CONSUMER.MSG.NEXT`` request waiting to be served; a JSON body's priority group with
    it (None for an empty or bare-number body, as the server has none for them)."""

    reply: str
    batch: int
    max_bytes: int
    expires_at_ns: int  # 0: never
    no_wait: bool
    heartbeat_ns: int
    delivered: int = 0
    bytes_sent: int = 0
    next_heartbeat_ns: int = 0
    priority_group: PriorityGroup | None = None


@dataclass(slots=True)
class Status:
    """A status message (header-only) for a pull request's or a push consumer's inbox."""

    inbox: str
    code: int
    text: str
    headers: dict[str, str] = field(default_factory=dict)


NO_MESSAGES = (404, "No Messages")
REQUEST_TIMEOUT = (408, "Request Timeout")
IDLE_HEARTBEAT = (100, "Idle Heartbeat")
EXCEEDED_MAX_WAITING = (409, "Exceeded MaxWaiting")
PUSH_BASED = (409, "Consumer is push based")
CONSUMER_DELETED = (409, "Consumer Deleted")
SIZE_EXCEEDS_MAX_BYTES = (409, "Message Size Exceeds MaxBytes")
NO_RESPONDERS = (503, "")
REQUIRED_API_LEVEL = (412, "Required Api Level")
NOT_OVERFLOW = (400, "Bad Request - Not a Overflow Priority consumer")
NOT_PINNED_CLIENT = (400, "Bad Request - Not a Pinned Client Priority consumer")
PRIORITY_OUT_OF_RANGE = (400, "Bad Request - Priority must be between 0 and 9")
PRIORITY_GROUP_MISSING = (400, "Bad Request - Priority Group missing")
INVALID_PRIORITY_GROUP = (400, "Bad Request - Invalid Priority Group")
#: a request naming another pin than the consumer's (when it arrives)
PIN_ID_MISMATCH = (423, "Nats-Pin-Id mismatch")
#: the same, found when a message is to be delivered: it counts what the request had left
WRONG_PIN_ID = (423, "Nats-Wrong-Pin-Id")


def no_consumer(reply: str, stream: str, consumer: str) -> Status:
    """What a pull request for a consumer (or stream) that does not exist hears: on the real
    server nobody subscribes to its subject."""
    return Status(reply, *NO_RESPONDERS, no_responders(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"))


@dataclass(frozen=True, slots=True)
class NextRequest:
    """The server's pull request body (``JSApiConsumerGetNextRequest`` with its priority group)."""

    expires: int = go(DURATION, 0)
    batch: int = go(INT, 0)
    max_bytes: int = go(INT, 0)
    no_wait: bool = go(BOOL, False)
    idle_heartbeat: int = go(DURATION, 0)
    group: str = go(STRING, "")
    min_pending: int = go(INT64, 0)
    min_ack_pending: int = go(INT64, 0)
    id: str = go(STRING, "")
    priority: int = go(INT, 0)


#: Decoded with plain ``json.Unmarshal``: unknown fields are ignored, and the struct is anonymous
#: in its errors ("Go struct field .batch").
NEXT_REQUEST = request_type(NextRequest, "", strict=False)


def decode_pull_request(body: bytes) -> NextRequest:
    """A JSON pull request body as the server decodes it; :class:`GoJsonError` in its words."""
    value = parse(body)
    if not isinstance(value, Pairs):
        raise GoJsonError("json: cannot unmarshal into Go value of type object")
    return NEXT_REQUEST.build(decode(value, NEXT_REQUEST.struct))


def parse_pull_request(reply: str, body: bytes, now_ns: int) -> PullRequest | Status:
    """A ``CONSUMER.MSG.NEXT`` body (empty, a bare batch number, or JSON) as a request, or the
    ``400`` that refuses it."""
    text = body.strip()
    req = NextRequest()
    group = None
    if text.startswith(b"{"):
        try:
            req = decode_pull_request(text)
        except GoJsonError as exc:
            return Status(reply, 400, f"Bad Request - {exc}")
        group = PriorityGroup(req.group, req.min_pending, req.min_ack_pending, req.id, req.priority)
    elif text.isdigit():
        req = NextRequest(batch=int(text))
    expires = req.expires
    heartbeat = max(req.idle_heartbeat, 0)  # none below zero, as on the server
    if heartbeat * 2 > expires and heartbeat:
        # the server's decoding refuses a heartbeat more than half the request's time (none:
        # no expires, a bare no_wait, or expired on arrival) before it looks at anything else
        return Status(reply, 400, "Bad Request - heartbeat value too large")
    if expires < 0:  # expired on arrival: the server's own 408, which counts nothing pending
        return Status(reply, *REQUEST_TIMEOUT, {"Nats-Pending-Messages": "0", "Nats-Pending-Bytes": "0"})
    return PullRequest(
        reply=reply,
        batch=max(req.batch, 1),
        max_bytes=max(req.max_bytes, 0),
        expires_at_ns=now_ns + expires if expires else 0,
        no_wait=req.no_wait,
        heartbeat_ns=heartbeat,
        next_heartbeat_ns=now_ns + heartbeat if heartbeat else 0,
        priority_group=group,
    )


def limit_status(req: PullRequest, cfg: ConsumerConfig, now_ns: int) -> Status | None:
    """The 409 for a request beyond the consumer's per-request limits, if it is."""
    max_batch = cfg.max_batch
    if max_batch and req.batch > max_batch:
        return Status(req.reply, 409, f"Exceeded MaxRequestBatch of {max_batch}")
    max_expires = cfg.max_expires
    if max_expires and req.expires_at_ns and req.expires_at_ns - now_ns > max_expires:
        return Status(req.reply, 409, f"Exceeded MaxRequestExpires of {go_duration(max_expires)}")
    max_bytes = cfg.max_bytes
    if max_bytes and req.max_bytes > max_bytes:
        return Status(req.reply, 409, f"Exceeded MaxRequestMaxBytes of {max_bytes}")
    return None


def priority_status(req: PullRequest, cfg: ConsumerConfig) -> Status | None:
    """The 400 for a JSON request whose priority group fields do not fit the consumer's policy
    (the server's checks, in its order, after the 409s of :func:`limit_status`)."""
    pg = req.priority_group
    if pg is None:
        return None
    policy = cfg.priority_policy
    refusal = None
    if (pg.min_pending or pg.min_ack_pending) and policy != "overflow":
        refusal = NOT_OVERFLOW
    elif pg.id and policy != "pinned_client":
        refusal = NOT_PINNED_CLIENT
    elif not 0 <= pg.priority <= 9:
        refusal = PRIORITY_OUT_OF_RANGE
    elif policy and not pg.group:
        refusal = PRIORITY_GROUP_MISSING
    elif policy and pg.group not in cfg.priority_groups:
        refusal = INVALID_PRIORITY_GROUP
    return Status(req.reply, *refusal) if refusal else None


def wrong_pin_status(req: PullRequest) -> Status:
    return Status(req.reply, *WRONG_PIN_ID, _pending_headers(req))


def _pending_headers(req: PullRequest) -> dict[str, str]:
    return {
        "Nats-Pending-Messages": str(req.batch - req.delivered),
        "Nats-Pending-Bytes": str(max(req.max_bytes - req.bytes_sent, 0) if req.max_bytes else 0),
    }


def timeout_status(req: PullRequest) -> Status:
    return Status(req.reply, *REQUEST_TIMEOUT, _pending_headers(req))


def too_big_status(req: PullRequest) -> Status:
    return Status(req.reply, *SIZE_EXCEEDS_MAX_BYTES, _pending_headers(req))
