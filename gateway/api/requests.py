"""What every API handler shares: the response type prefix, paging size and request decoding."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, overload

from gateway.api import errors
from gateway.api.gojson import GoJsonError, JsonSyntaxError, Pairs, parse, stream_wording, syntax_error
from gateway.api.structs import M, RequestType, Struct, decode, json_type

T = "io.nats.jetstream.api.v1."
NAMES_PAGE = 1024

#: Sends an event (advisory subject, JSON body) to the server.
Publish = Callable[[tuple[str, bytes]], None]

#: The JetStream API level jetlake implements (``$JS.API.INFO``, the ``_nats.level`` metadata):
#: nats-server 2.15's, as far as the compatibility table says.
API_LEVEL = 5
_LEVEL_HEADER = b"\r\nNats-Required-Api-Level:"
_GO_INT = re.compile(rb"[+-]?[0-9]+")


def above_api_level(hdrs: bytes | None) -> bool:
    """Whether a request's ``Nats-Required-Api-Level`` asks for more than :data:`API_LEVEL`, read
    as the server reads it: the first header of exactly that name, its leading spaces dropped, an
    empty value asking nothing, and a value that is not a whole number in Go's ``strconv.Atoi``
    form (trailing space, a fraction, out of int64) refused as too high."""
    at = hdrs.find(_LEVEL_HEADER) if hdrs else -1
    if hdrs is None or at < 0:
        return False
    start = at + len(_LEVEL_HEADER)
    value = hdrs[start : hdrs.find(b"\r\n", start)].lstrip(b" ")
    if not value:
        return False
    if not _GO_INT.fullmatch(value):
        return True
    level = int(value)
    return not -(2**63) <= level < 2**63 or level > API_LEVEL


@overload
def load_request(body: bytes, spec: Struct) -> dict[str, Any]: ...
@overload
def load_request(body: bytes, spec: RequestType[M]) -> M: ...
def load_request(body: bytes, spec: Struct | RequestType[M]) -> dict[str, Any] | M:
    """A request body as the real server's ``json.Unmarshal`` into the request struct reads it:
    empty and ``null`` leave it at its zero value; anything else but an object is invalid JSON
    (10025). The fields are checked as Go's strict decoding checks them: the first unknown key
    (names match without regard to case, as in Go) or value of the wrong type, in the order sent,
    is invalid JSON too, worded as the server words it (:mod:`gateway.api.structs`). A typed
    request comes back as its model, a config's struct as the fields sent (its validation needs
    to know which were)."""
    return _typed(_decoded(body, spec.struct if isinstance(spec, RequestType) else spec), spec)


@overload
def unmarshal_request(body: bytes, spec: Struct) -> dict[str, Any]: ...
@overload
def unmarshal_request(body: bytes, spec: RequestType[M]) -> M: ...
def unmarshal_request(body: bytes, spec: Struct | RequestType[M]) -> dict[str, Any] | M:
    """A body the server reads with ``json.Unmarshal`` rather than its streaming decoder
    (CONSUMER.UNPIN): a syntax error, an empty body included, in that function's words."""
    trouble = syntax_error(body)
    if trouble is not None:
        raise _invalid(trouble)
    return load_request(body, spec)


@overload
def load_optional_request(body: bytes, spec: Struct) -> dict[str, Any]: ...
@overload
def load_optional_request(body: bytes, spec: RequestType[M]) -> M: ...
def load_optional_request(body: bytes, spec: Struct | RequestType[M]) -> dict[str, Any] | M:
    """A body the request may do without (STREAM.INFO, STREAM.NAMES/LIST): the real server decodes
    it only when it starts with ``{`` or ``[`` and ignores anything else (a number, a string,
    junk); what it decodes must still be an object."""
    if body.lstrip()[:1] not in (b"{", b"["):
        return _typed({}, spec)
    return load_request(body, spec)


def _typed(decoded: dict[str, Any], spec: Struct | RequestType[M]) -> dict[str, Any] | M:
    return spec.build(decoded) if isinstance(spec, RequestType) else decoded


def _decoded(body: bytes, struct: Struct) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        value = parse(body)
    except JsonSyntaxError as exc:
        raise errors.INVALID_JSON.format(err=stream_wording(exc)) from exc
    if value is None:
        return {}
    if not isinstance(value, Pairs):
        raise _invalid(f"json: cannot unmarshal {json_type(value)} into Go value of type {struct.gotype}")
    try:
        return decode(value, struct)
    except GoJsonError as exc:
        raise _invalid(str(exc)) from exc


def _invalid(text: str) -> errors.ApiError:
    return errors.INVALID_JSON.format(err=text)


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
