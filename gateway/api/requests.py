"""What every API handler shares: the response type prefix, paging size and request decoding."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.api import errors
from gateway.api.gojson import JsonSyntaxError, loads, stream_wording, syntax_error

T = "io.nats.jetstream.api.v1."
NAMES_PAGE = 1024

#: Sends an event (advisory subject, JSON body) to the server.
Publish = Callable[[tuple[str, bytes]], None]


# Go types of request fields, as a Struct maps them (the names appear in the server's errors).
INT, INT32, INT64, UINT = "int", "int32", "int64", "uint64"
STRING, BOOL, TIME, STRINGS = "string", "bool", "time.Time", "[]string"
DURATION, DURATIONS, STRING_MAP = "time.Duration", "[]time.Duration", "map[string]string"
#: A list of structs the server keeps as they are (stream sources): only its JSON type is checked.
SOURCES = "[]*server.StreamSource"
_INTS = {
    INT: (-(2**63), 2**63),
    INT64: (-(2**63), 2**63),
    DURATION: (-(2**63), 2**63),
    INT32: (-(2**31), 2**31),
    UINT: (0, 2**64),
}
#: The member type of each list type, and the value Go leaves in a member sent as ``null``.
_ELEMENTS = {STRINGS: (STRING, ""), DURATIONS: (DURATION, 0)}


@dataclass(frozen=True, slots=True)
class Enum:
    """A field the server reads with its own ``UnmarshalJSON``: any other value, ``null`` included,
    is refused with ``wording`` ({text}: the JSON as sent, {quoted}: that text quoted).
    ``aliases`` maps other accepted spellings to the value they stand for; ``fold_case`` accepts
    any case (DiscardPolicy); ``type_wording`` is the refusal of a value that is not a string
    ({kind}: its JSON type) where the server has other words for it (StoreCompression)."""

    values: tuple[str, ...]
    wording: str = "can not unmarshal {quoted}"
    aliases: Mapping[str, str] = field(default_factory=dict)
    fold_case: bool = False
    type_wording: str | None = None

    def parse(self, value: Any) -> str:
        if self.type_wording is not None and value is not None and not isinstance(value, str):
            raise _invalid(self.type_wording.format(kind=_json_type(value)))
        text = value.lower() if self.fold_case and isinstance(value, str) else value
        if isinstance(text, str) and text in self.aliases:
            return self.aliases[text]
        if text not in self.values:
            sent = json.dumps(value, separators=(",", ":"))
            raise _invalid(self.wording.format(text=sent, quoted=json.dumps(sent)))
        return str(text)


@dataclass(frozen=True, slots=True)
class Struct:
    """A request struct as the server's strict decoder reads it: its Go type and its fields (JSON
    name: Go type, Enum or nested Struct); ``fields`` None leaves the members unread (a struct the
    server keeps as it is). Not ``strict``: unknown fields are ignored, as where the server uses
    plain ``json.Unmarshal``."""

    gotype: str
    fields: Mapping[str, str | Enum | Struct] | None = None
    strict: bool = True


def load_request(body: bytes, struct: Struct | None = None) -> dict[str, Any]:
    """A request body as the real server's ``json.Unmarshal`` into the request struct reads it:
    empty and ``null`` leave it at its zero value (``{}``); anything else but an object is invalid
    JSON (10025). The fields are checked as Go's strict decoding checks them: the first unknown key
    (names match without regard to case, as in Go) or value of the wrong type, in the order sent,
    is invalid JSON too, worded as the server words it. What it returns is what Go would hold: a
    field sent as ``null`` is left out (at its zero value), a ``null`` member of a list or map is
    that member type's zero value, an enum is the value it stands for."""
    if not body.strip():
        return {}
    try:
        value = loads(body)
    except JsonSyntaxError as exc:
        raise errors.INVALID_JSON.format(err=stream_wording(exc)) from exc
    if value is None:
        return {}
    gotype = struct.gotype if struct else "object"
    if not isinstance(value, dict):
        raise _invalid(f"json: cannot unmarshal {_json_type(value)} into Go value of type {gotype}")
    if struct is not None and struct.fields is not None:
        return _check_struct(value, struct, gotype.removeprefix("server."))
    return value


def unmarshal_request(body: bytes, struct: Struct) -> dict[str, Any]:
    """A body the server reads with ``json.Unmarshal`` rather than its streaming decoder
    (CONSUMER.UNPIN): a syntax error, an empty body included, in that function's words."""
    trouble = syntax_error(body)
    if trouble is not None:
        raise _invalid(trouble)
    return load_request(body, struct)


def _invalid(text: str) -> errors.ApiError:
    return errors.INVALID_JSON.format(err=text)


def _check_struct(req: dict[str, Any], struct: Struct, path: str) -> dict[str, Any]:
    """The request's known fields under their declared names (Go matches names without regard to
    case, and a later key wins), each checked where it stands, nested structs included."""
    fields = struct.fields or {}
    by_lower = {name.lower(): name for name in fields}
    out: dict[str, Any] = {}
    for key, value in req.items():
        name = by_lower.get(key.lower())
        if name is None:
            if struct.strict:
                raise _invalid(f'json: unknown field "{key}"')
            continue
        decoded = _decode_value(value, fields[name], f"{path}.{key}", "Go struct field ")
        if decoded is not None:
            out[name] = decoded
    return out


def _decode_value(value: Any, kind: str | Enum | Struct, path: str, field: str) -> Any:
    """The value as Go holds it once decoded, or the server's refusal. ``field`` is how Go names
    the place in a type error: a struct field or a slice element."""
    if isinstance(kind, Enum):
        return kind.parse(value)
    if value is None:
        return None
    where = f"{field}{path} of type {_name(kind)}"
    if not _json_type_fits(value, kind):
        raise _invalid(f"json: cannot unmarshal {_json_type(value)} into {where}")
    if isinstance(kind, Struct):
        return value if kind.fields is None else _check_struct(value, kind, path)
    return _check_contents(value, kind, path, where)


def _check_contents(value: Any, kind: str, path: str, where: str) -> Any:
    """A value of the JSON type its Go type reads: what Go still refuses in it (a number out of
    range, a member of the wrong type, a time that is not RFC 3339)."""
    if kind in _INTS:
        lo, hi = _INTS[kind]
        if isinstance(value, float) or not lo <= value < hi:
            raise _invalid(f"json: cannot unmarshal number {value} into {where}")
    elif kind == STRING_MAP:
        return {
            k: _zero_if_null(_decode_value(v, STRING, f"{path}.{k}", "Go struct field "), "")
            for k, v in value.items()
        }
    elif kind in _ELEMENTS:
        member, zero = _ELEMENTS[kind]
        return [
            _zero_if_null(_decode_value(item, member, f"{path}.{i}", ""), zero)
            for i, item in enumerate(value)
        ]
    elif kind == TIME:
        trouble = _time_error(value)
        if trouble:
            raise _invalid(trouble)
    return value


def _zero_if_null(value: Any, zero: Any) -> Any:
    return zero if value is None else value


#: The JSON value each Go type reads (the numbers are checked apart: a JSON bool is no number).
_JSON_TYPES: dict[str, type] = {
    STRING: str,
    BOOL: bool,
    TIME: str,
    STRING_MAP: dict,
    STRINGS: list,
    DURATIONS: list,
    SOURCES: list,
}


def _json_type_fits(value: Any, kind: str | Struct) -> bool:
    """Whether Go's decoder gets past the value's JSON type (its range or members aside)."""
    if isinstance(kind, Struct):
        return isinstance(value, dict)
    if kind in _INTS:
        return type(value) in (int, float)
    return isinstance(value, _JSON_TYPES[kind])


def _name(kind: str | Struct) -> str:
    return kind.gotype if isinstance(kind, Struct) else kind


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


# RFC 3339 as Go's time.Parse walks it: (layout element, digits it takes or the literal, the range
# a number must fall in, what its range error names).
_RFC3339 = "2006-01-02T15:04:05Z07:00"
_TIME_PARTS: tuple[tuple[str, int, int, str], ...] = (
    ("2006", 4, 10_000, ""),
    ("-", 0, 0, ""),
    ("01", 2, 13, "month"),
    ("-", 0, 0, ""),
    ("02", 2, 32, "day"),
    ("T", 0, 0, ""),
    ("15", 2, 24, "hour"),
    (":", 0, 0, ""),
    ("04", 2, 60, "minute"),
    (":", 0, 0, ""),
    ("05", 2, 60, "second"),
)


def _time_error(text: str) -> str | None:
    """Go's error for a ``time.Time`` in JSON that is not RFC 3339, or None when it is."""
    rest = text
    fail = f'parsing time "{text}" as "{_RFC3339}": cannot parse "{{rest}}" as "{{elem}}"'
    for elem, digits, bound, what in _TIME_PARTS:
        if not digits:
            if not rest.startswith(elem):
                return fail.format(rest=rest, elem=elem)
            rest = rest[len(elem) :]
            continue
        number = rest[:digits]
        if len(number) < digits or not number.isdigit():
            return fail.format(rest=rest, elem=elem)
        if what and not (1 if what in ("month", "day") else 0) <= int(number) < bound:
            return f'parsing time "{text}": {what} out of range'
        rest = rest[digits:]
    if rest[:1] in (".", ",") and rest[1:2].isdigit():
        rest = rest[1:].lstrip("0123456789")
    if rest.startswith("Z"):
        rest = rest[1:]
    elif len(rest) >= 6 and rest[0] in "+-" and rest[3] == ":" and (rest[1:3] + rest[4:6]).isdigit():
        rest = rest[6:]
    else:
        return fail.format(rest=rest, elem="Z07:00")
    return f'parsing time "{text}": extra text: "{rest}"' if rest else None


def load_optional_request(body: bytes, struct: Struct) -> dict[str, Any]:
    """A body the request may do without (STREAM.INFO, STREAM.NAMES/LIST): the real server decodes
    it only when it starts with ``{`` or ``[`` and ignores anything else (a number, a string,
    junk); what it decodes must still be an object."""
    if body.lstrip()[:1] not in (b"{", b"["):
        return {}
    return load_request(body, struct)


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
