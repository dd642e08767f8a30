"""Pull request parsing and the status messages of the pull protocol, as pure functions."""

from __future__ import annotations

import json

from gateway.consumer import PullRequest, Status

NO_MESSAGES = (404, "No Messages")
REQUEST_TIMEOUT = (408, "Request Timeout")
IDLE_HEARTBEAT = (100, "Idle Heartbeat")


def parse_pull_request(reply: str, body: bytes, now_ns: int) -> PullRequest | Status:
    """A ``CONSUMER.MSG.NEXT`` body (empty, a bare batch number, or JSON) as a request."""
    text = body.strip()
    batch, expires, no_wait, max_bytes, heartbeat = 1, 0, False, 0, 0
    if text:
        if text.isdigit():
            batch = int(text)
        else:
            try:
                req = json.loads(text)
                batch = int(req.get("batch") or 1)
                expires = int(req.get("expires") or 0)
                no_wait = bool(req.get("no_wait"))
                max_bytes = int(req.get("max_bytes") or 0)
                heartbeat = int(req.get("idle_heartbeat") or 0)
            except (ValueError, AttributeError, TypeError):
                return Status(reply, 400, "Bad Request")
    return PullRequest(
        reply=reply,
        batch=max(batch, 1),
        max_bytes=max_bytes,
        expires_at_ns=now_ns + expires if expires > 0 else 0,
        no_wait=no_wait,
        heartbeat_ns=heartbeat,
        next_heartbeat_ns=now_ns + heartbeat if heartbeat else 0,
    )


def timeout_status(req: PullRequest) -> Status:
    return Status(
        req.reply,
        *REQUEST_TIMEOUT,
        {
            "Nats-Pending-Messages": str(req.batch - req.delivered),
            "Nats-Pending-Bytes": str(max(req.max_bytes - req.bytes_sent, 0) if req.max_bytes else 0),
        },
    )
