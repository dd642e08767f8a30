"""JetStream stream and consumer advisories and ack samples as pure builders: (subject, JSON body).

Subjects and fields as the real server publishes them (observed from nats-server 2.15.1 -js).
"""

from __future__ import annotations

import json
import secrets
import string
from typing import Any

from gateway.api.timefmt import rfc3339

ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER"
ACCOUNT = "$G"  # the only account jetlake serves: the leaf link's
_T = "io.nats.jetstream.advisory.v1."
_ALPHABET = string.ascii_letters + string.digits


def new_id() -> str:
    """A random id of the length and alphabet of the server's nuids (advisory ids, pins)."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(22))


def _event(
    subject: str, kind: str, stream: str, consumer: str | None, now_ns: int, **fields: Any
) -> tuple[str, bytes]:
    body = {"type": kind, "id": new_id(), "timestamp": rfc3339(now_ns), "stream": stream}
    if consumer is not None:
        body["consumer"] = consumer
    body.update(fields)
    return subject, json.dumps(body, separators=(",", ":")).encode()


def in_domain(payload: bytes, domain: str) -> bytes:
    """An advisory as a server in JetStream domain ``domain`` publishes it: every advisory and
    metric event ends with ``"domain"`` (omitempty: none without a domain)."""
    return payload[:-1] + b',"domain":' + json.dumps(domain).encode() + b"}" if domain else payload


def stream_action(stream: str, action: str, now_ns: int) -> tuple[str, bytes]:
    """A stream was created, updated (``modify``) or deleted."""
    verb = {"create": "CREATED", "modify": "UPDATED", "delete": "DELETED"}[action]
    return _event(
        f"$JS.EVENT.ADVISORY.STREAM.{verb}.{stream}",
        _T + "stream_action",
        stream,
        None,
        now_ns,
        action=action,
    )


def archive_event(what: str, stream: str, now_ns: int, **fields: Any) -> tuple[str, bytes]:
    """A snapshot or restore advisory (``what``: ``snapshot_create``, ``snapshot_complete``,
    ``restore_create``, ``restore_complete``) on ``$JS.EVENT.ADVISORY.STREAM.<WHAT>.<stream>``.
    The server adds the client that asked (``client``); the gateway does not know it, so it has
    none. Times given as ``start``/``end`` (Unix ns) are rendered as the server renders them."""
    for key in ("start", "end"):
        if key in fields:
            fields[key] = rfc3339(fields[key])
    return _event(
        f"$JS.EVENT.ADVISORY.STREAM.{what.upper()}.{stream}", _T + what, stream, None, now_ns, **fields
    )


def batch_abandoned(stream: str, batch_id: str, reason: str, domain: str, now_ns: int) -> tuple[str, bytes]:
    """An atomic batch was abandoned (``reason``: ``timeout``, ``large``, ``incomplete`` or
    ``unsupported``). Unlike the other advisories its struct names the domain (omitempty) between
    the stream and the batch, so it comes complete, not through :func:`in_domain`."""
    named = {"domain": domain} if domain else {}
    return _event(
        f"$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED.{stream}",
        _T + "stream_batch_abandoned",
        stream,
        None,
        now_ns,
        **named,
        batch=batch_id,
        reason=reason,
    )


def _consumer_event(
    what: str, kind: str, stream: str, consumer: str, now_ns: int, **fields: Any
) -> tuple[str, bytes]:
    """A consumer advisory: ``$JS.EVENT.ADVISORY.CONSUMER.<what>.<stream>.<consumer>``."""
    return _event(f"{ADVISORY}.{what}.{stream}.{consumer}", _T + kind, stream, consumer, now_ns, **fields)


def consumer_action(stream: str, consumer: str, action: str, now_ns: int) -> tuple[str, bytes]:
    verb = {"create": "CREATED", "delete": "DELETED"}[action]
    return _consumer_event(verb, "consumer_action", stream, consumer, now_ns, action=action)


def max_deliveries(stream: str, consumer: str, seq: int, deliveries: int, now_ns: int) -> tuple[str, bytes]:
    return _consumer_event(
        "MAX_DELIVERIES", "max_deliver", stream, consumer, now_ns, stream_seq=seq, deliveries=deliveries
    )


def nak(stream: str, consumer: str, cseq: int, seq: int, deliveries: int, now_ns: int) -> tuple[str, bytes]:
    return _consumer_event(
        "MSG_NAKED", "nak", stream, consumer, now_ns, consumer_seq=cseq, stream_seq=seq, deliveries=deliveries
    )


def terminated(
    stream: str, consumer: str, cseq: int, seq: int, deliveries: int, reason: str, now_ns: int
) -> tuple[str, bytes]:
    extra = {"reason": reason} if reason else {}
    return _consumer_event(
        "MSG_TERMINATED",
        "terminated",
        stream,
        consumer,
        now_ns,
        consumer_seq=cseq,
        stream_seq=seq,
        deliveries=deliveries,
        **extra,
    )


def pause(stream: str, consumer: str, paused: bool, until: str, now_ns: int) -> tuple[str, bytes]:
    return _consumer_event(
        "PAUSE", "consumer_pause", stream, consumer, now_ns, paused=paused, pause_until=until
    )


def pinned(stream: str, consumer: str, group: str, pin_id: str, now_ns: int) -> tuple[str, bytes]:
    """A ``pinned_client`` consumer gave its pin to a puller of ``group``."""
    return _group_event("PINNED", "consumer_group_pinned", stream, consumer, now_ns, group, pinned_id=pin_id)


def unpinned(stream: str, consumer: str, group: str, reason: str, now_ns: int) -> tuple[str, bytes]:
    """The pin went: ``reason`` is ``timeout`` (no pull from its holder within
    ``priority_timeout``) or ``admin`` (CONSUMER.UNPIN, whether or not there was a pin)."""
    return _group_event("UNPINNED", "consumer_group_unpinned", stream, consumer, now_ns, group, reason=reason)


def _group_event(
    what: str, kind: str, stream: str, consumer: str, now_ns: int, group: str, **fields: Any
) -> tuple[str, bytes]:
    """The priority group advisories name the account (jetlake serves the leaf link's one, as
    ``$JS.API.INFO`` does) before the stream."""
    body = {
        "type": _T + kind,
        "id": new_id(),
        "timestamp": rfc3339(now_ns),
        "account": ACCOUNT,
        "stream": stream,
        "consumer": consumer,
        "group": group,
        **fields,
    }
    return f"{ADVISORY}.{what}.{stream}.{consumer}", json.dumps(body, separators=(",", ":")).encode()


def ack_sample(
    stream: str, consumer: str, cseq: int, seq: int, ack_time_ns: int, deliveries: int, now_ns: int
) -> tuple[str, bytes]:
    return _event(
        f"$JS.EVENT.METRIC.CONSUMER.ACK.{stream}.{consumer}",
        "io.nats.jetstream.metric.v1.consumer_ack",
        stream,
        consumer,
        now_ns,
        consumer_seq=cseq,
        stream_seq=seq,
        ack_time=ack_time_ns,
        deliveries=deliveries,
    )


def sample_rate(sample_freq: object) -> int:
    """``sample_freq`` ("50%", "50", or empty) as a percentage, 0 when sampling is off."""
    text = str(sample_freq or "").strip().rstrip("%")
    try:
        return max(0, min(100, int(text)))
    except ValueError:
        return 0
