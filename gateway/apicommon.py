"""What every API handler shares: the response type prefix, paging size and request decoding."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway import errors

T = "io.nats.jetstream.api.v1."
NAMES_PAGE = 1024

#: Sends an event (advisory subject, JSON body) to the server.
Publish = Callable[[tuple[str, bytes]], None]


def load_request(body: bytes) -> dict[str, Any]:
    """A request body as the real server reads it: empty is ``{}``, anything but an object is bad."""
    if not body.strip():
        return {}
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        raise errors.INVALID_JSON.format(err=exc.msg) from exc
    if not isinstance(value, dict):
        raise errors.INVALID_JSON.format(err="json: cannot unmarshal into Go value of type object")
    return value


@dataclass(frozen=True, slots=True)
class RawReply:
    """An answer that is a header block (empty: none) and a payload rather than JSON (DIRECT.GET,
    statuses); a handler returns a list of them when one request gets several messages."""

    hdrs: bytes
    data: bytes = b""
