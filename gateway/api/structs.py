"""Decoding a JSON body into a Go struct as nats-server's ``encoding/json`` does: the one decoder of
every request the gateway reads (API requests, configs nested in them, pull requests).

A request type is declared once, as a typed model (a frozen dataclass of :func:`go` fields, made a
:class:`RequestType` by :func:`request_type`) or, for a config whose fields' presence matters to its
validation, as a :class:`Struct` (field names and Go types, enums, nested structs). :func:`decode`
walks the parsed body (:func:`gateway.api.gojson.parse`: objects as their key/value pairs in
order, numbers as written) and gives what Go would hold, or raises
:class:`~gateway.api.gojson.GoJsonError` with the server's words for the first fault in the order
sent: an unknown field (strict structs), a value of the wrong JSON type, a number out of its type's
range or not whole (named as it was written), a time that is not RFC 3339, an enum value the type's
own ``UnmarshalJSON`` refuses. Field names match without regard to case, a later key wins, a field
sent as ``null`` is left at its zero value (left out), a ``null`` member of a list or map is the
member type's zero value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Generic, TypeVar

from gateway.api.gojson import GoJsonError, NumberLiteral, Pairs

# Go types of request fields, as a Struct maps them (the names appear in the server's errors).
INT, INT32, INT64, UINT = "int", "int32", "int64", "uint64"
STRING, BOOL, TIME, STRINGS, UINTS = "string", "bool", "time.Time", "[]string", "[]uint64"
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
_ELEMENTS = {STRINGS: (STRING, ""), DURATIONS: (DURATION, 0), UINTS: (UINT, 0)}


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
        is_text = isinstance(value, str) and not isinstance(value, NumberLiteral)
        if self.type_wording is not None and value is not None and not is_text:
            raise GoJsonError(self.type_wording.format(kind=json_type(value)))
        text = value.lower() if self.fold_case and is_text else value
        if is_text and text in self.aliases:
            return self.aliases[text]
        if not is_text or text not in self.values:
            sent = _as_sent(value)
            raise GoJsonError(self.wording.format(text=sent, quoted=json.dumps(sent)))
        return str(text)


@dataclass(frozen=True, slots=True)
class Struct:
    """A request struct as the server's decoder reads it: its Go type and its fields (JSON name: Go
    type, Enum or nested Struct); ``fields`` None leaves the members unread (a struct the server
    keeps as it is). Not ``strict``: unknown fields are ignored, as where the server uses plain
    ``json.Unmarshal`` rather than its strict decoder."""

    gotype: str
    fields: Mapping[str, str | Enum | Struct] | None = None
    strict: bool = True

    @property
    def path(self) -> str:
        """How Go's errors name the struct (the package prefix dropped)."""
        return self.gotype.removeprefix("server.")


M = TypeVar("M")


def go(kind: str | Enum | Struct, zero: Any) -> Any:
    """A request model's field: the Go type the server decodes it as, and Go's zero value for it
    (what a field left out or sent as ``null`` holds)."""
    return field(default=zero, metadata={"go": kind})


@dataclass(frozen=True, slots=True)
class RequestType(Generic[M]):
    """A request body as a typed model: the frozen dataclass whose fields (declared with
    :func:`go`) name the JSON fields and their Go types, and the :class:`Struct` derived from it
    that :func:`decode` reads; ``build`` makes the model of what was decoded."""

    model: type[M]
    struct: Struct

    def build(self, decoded: Mapping[str, Any]) -> M:
        return self.model(**decoded)


def request_type(model: type[M], gotype: str, strict: bool = True) -> RequestType[M]:
    """The request type of ``model`` (a dataclass of :func:`go` fields), Go type ``gotype``."""
    declared = {f.name: f.metadata["go"] for f in fields(model)}  # type: ignore[arg-type]
    return RequestType(model, Struct(gotype, declared, strict))


def decode(pairs: Pairs, struct: Struct, path: str | None = None) -> dict[str, Any]:
    """The body's known fields under their declared names, each decoded where it stands."""
    fields = struct.fields or {}
    by_lower = {name.lower(): name for name in fields}
    where = struct.path if path is None else path
    out: dict[str, Any] = {}
    for key, value in pairs:
        name = by_lower.get(key.lower())
        if name is None:
            if struct.strict:
                raise GoJsonError(f'json: unknown field "{key}"')
            continue
        decoded = _decode_value(value, fields[name], f"{where}.{key}", "Go struct field ")
        if decoded is not None:
            out[name] = decoded
    return out


def plain(value: Any) -> Any:
    """A parsed value as ordinary JSON data (objects as dicts, a later key winning; numbers as
    ``int`` or ``float``): what the server keeps of a struct it does not read."""
    if isinstance(value, Pairs):
        return {k: plain(v) for k, v in value}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, NumberLiteral):
        try:
            return int(value)
        except ValueError:
            return float(value)
    return value


def _decode_value(value: Any, kind: str | Enum | Struct, path: str, field: str) -> Any:
    """``field`` is how Go names the place in a type error: a struct field or a slice element."""
    if isinstance(kind, Enum):
        return kind.parse(value)
    if value is None:
        return None
    where = f"{field}{path} of type {_name(kind)}"
    if not _json_type_fits(value, kind):
        raise GoJsonError(f"json: cannot unmarshal {json_type(value)} into {where}")
    if isinstance(kind, Struct):
        return plain(value) if kind.fields is None else decode(value, kind, path)
    return _decode_contents(value, kind, path, where)


def _decode_contents(value: Any, kind: str, path: str, where: str) -> Any:
    """A value of the JSON type its Go type reads: what Go still refuses in it (a number out of
    range or not whole, a member of the wrong type, a time that is not RFC 3339)."""
    if kind in _INTS:
        return _whole_number(value, kind, where)
    if kind == STRING_MAP:
        return {
            k: _zero_if_null(_decode_value(v, STRING, f"{path}.{k}", "Go struct field "), "")
            for k, v in value
        }
    if kind in _ELEMENTS:
        member, zero = _ELEMENTS[kind]
        return [
            _zero_if_null(_decode_value(item, member, f"{path}.{i}", ""), zero)
            for i, item in enumerate(value)
        ]
    if kind == TIME:
        trouble = _time_error(value)
        if trouble:
            raise GoJsonError(trouble)
    return plain(value)


def _whole_number(literal: NumberLiteral, kind: str, where: str) -> int:
    lo, hi = _INTS[kind]
    try:
        number = int(literal)
    except ValueError:
        number = None
    if number is None or not lo <= number < hi:
        raise GoJsonError(f"json: cannot unmarshal number {literal} into {where}")
    return number


def _zero_if_null(value: Any, zero: Any) -> Any:
    return zero if value is None else value


def _json_type_fits(value: Any, kind: str | Struct) -> bool:
    """Whether Go's decoder gets past the value's JSON type (its range or members aside)."""
    if isinstance(kind, Struct):
        return isinstance(value, Pairs)
    return json_type(value) == _JSON_TYPES[kind]


#: The JSON type each Go type reads.
_JSON_TYPES: dict[str, str] = {
    **dict.fromkeys(_INTS, "number"),
    STRING: "string",
    TIME: "string",
    BOOL: "bool",
    STRING_MAP: "object",
    STRINGS: "array",
    DURATIONS: "array",
    UINTS: "array",
    SOURCES: "array",
}


def _name(kind: str | Struct) -> str:
    return kind.gotype if isinstance(kind, Struct) else kind


def json_type(value: Any) -> str:
    """A parsed value's JSON type as Go's errors name it."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, NumberLiteral):
        return "number"
    if isinstance(value, str):
        return "string"
    return "object" if isinstance(value, Pairs) else "array"


def _as_sent(value: Any) -> str:
    """A parsed value as JSON text again (an enum's refusal quotes what was sent)."""
    if isinstance(value, NumberLiteral):
        return str(value)
    if isinstance(value, Pairs):
        return "{" + ",".join(f"{json.dumps(k)}:{_as_sent(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_as_sent(v) for v in value) + "]"
    return json.dumps(value)


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
