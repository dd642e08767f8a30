"""What every API handler shares: the response type prefix, paging size and request decoding."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gateway import errors
from gateway.gojson import JsonSyntaxError, loads, stream_wording

T = "io.nats.jetstream.api.v1."
NAMES_PAGE = 1024

#: Sends an event (advisory subject, JSON body) to the server.
Publish = Callable[[tuple[str, bytes]], None]


def load_request(body: bytes, fields: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A request body as the real server's ``json.Unmarshal`` into the request struct reads it:
    empty and ``null`` leave it at its zero value (``{}``); anything else but an object is invalid
    JSON (10025). With ``fields`` (the request struct's JSON names and Go types) the body is
    decoded as the server's strict decoder does: an unknown key or a value of the wrong type is
    invalid JSON too."""
    if not body.strip():
        return {}
    try:
        value = loads(body)
    except JsonSyntaxError as exc:
        raise errors.INVALID_JSON.format(err=stream_wording(exc)) from exc
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise errors.INVALID_JSON.format(err="json: cannot unmarshal into Go value of type object")
    if fields is not None:
        check_fields(value, fields)
    return value


# Go types of request fields, as ``fields`` maps them, and what JSON each accepts (null: any).
INT, UINT, STRING, BOOL, TIME, STRINGS = "int", "uint64", "string", "bool", "time.Time", "[]string"
OBJECT = "struct"
_ACCEPTS: dict[str, Callable[[Any], bool]] = {
    INT: lambda v: type(v) is int and -(2**63) <= v < 2**63,
    UINT: lambda v: type(v) is int and 0 <= v < 2**64,
    STRING: lambda v: isinstance(v, str),
    BOOL: lambda v: isinstance(v, bool),
    TIME: lambda v: isinstance(v, str) and _is_rfc3339(v),
    STRINGS: lambda v: isinstance(v, list) and all(x is None or isinstance(x, str) for x in v),
    OBJECT: lambda v: isinstance(v, dict),
}


def check_fields(req: dict[str, Any], fields: Mapping[str, str]) -> None:
    """Refuse what Go's strict ``json`` decoding refuses: an unknown key (names match without
    regard to case, as in Go), or a value of the wrong type (``"1"`` for an int, ``1.5`` for a
    uint64, ``[]`` for a string)."""
    by_lower = {name.lower(): kind for name, kind in fields.items()}
    for key, value in req.items():
        kind = by_lower.get(key.lower())
        if kind is None:
            raise errors.INVALID_JSON.format(err=f'json: unknown field "{key}"')
        if value is not None and not _ACCEPTS[kind](value):
            raise errors.INVALID_JSON.format(
                err=f"json: cannot unmarshal {_json_type(value)} into Go struct field .{key} of type {kind}"
            )


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _is_rfc3339(text: str) -> bool:
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return "T" in text


def load_optional_request(body: bytes, fields: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A body the request may do without (STREAM.INFO, STREAM.NAMES/LIST): the real server decodes
    it only when it starts with ``{`` or ``[`` and ignores anything else (a number, a string,
    junk); what it decodes must still be an object."""
    if body.lstrip()[:1] not in (b"{", b"["):
        return {}
    return load_request(body, fields)


def is_empty_request(body: bytes) -> bool:
    """Nothing, or an empty JSON object (the real server's ``isEmptyRequest``; ``null`` and blanks
    are not empty)."""
    if not body or body == b"{}":
        return True
    try:
        return bool(json.loads(body) == {})
    except ValueError:
        return False


def require_empty_request(body: bytes) -> None:
    """Requests that take no body (STREAM.DELETE, CONSUMER.INFO): anything but nothing or an empty
    object is refused with 10038 before the stream is even looked up, as the real server does."""
    if not is_empty_request(body):
        raise errors.NOT_EMPTY_REQUEST


@dataclass(frozen=True, slots=True)
class RawReply:
    """An answer that is a header block (empty: none) and a payload rather than JSON (DIRECT.GET,
    statuses); a handler returns a list of them when one request gets several messages."""

    hdrs: bytes
    data: bytes = b""
