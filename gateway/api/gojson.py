"""Parsing JSON as Go's ``encoding/json`` does, with the real server's words for a syntax error.

Clients see these texts verbatim (an API error's description, a pull request's ``400 Bad Request``
status), so they are the server's: asked of nats-server 2.15 (``tests/test_fuzz.py`` and
``tests/test_pull_json.py`` send the same bodies to both servers). A valid body is parsed once by
Python's parser; a scan in the manner of Go's scanner (whose state names appear in the messages)
runs only to word a refusal. Decoding the parsed body into a request struct is
:mod:`gateway.api.structs`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_WS = b" \t\n\r"
_GO_ESCAPES = {7: "\\a", 8: "\\b", 12: "\\f", 10: "\\n", 13: "\\r", 9: "\\t", 11: "\\v"}


class GoJsonError(ValueError):
    """A body the server's decoder refuses; ``str()`` is the server's text."""


class JsonSyntaxError(GoJsonError):
    """A syntax error at byte ``index`` of the body (``None``: the body ended too soon)."""

    def __init__(self, text: str, index: int | None) -> None:
        super().__init__(text)
        self.index = index


class NumberLiteral(str):
    """A JSON number as written: Go reports a number that does not fit its field by its text."""


class Pairs(list[tuple[str, Any]]):
    """A JSON object as its key/value pairs in order (a key may repeat; Go decodes each)."""


def quote_char(c: int) -> str:
    """A byte as Go's ``quoteChar`` prints it in a syntax error."""
    if c == ord("'"):
        return "'\\''"
    if c == ord('"'):
        return "'\"'"
    if c < 0x20 or c == 0x7F:
        return "'" + _GO_ESCAPES.get(c, f"\\x{c:02x}") + "'"
    return f"'{chr(c)}'"


def syntax_error(data: bytes) -> str | None:
    """The server's text for the first syntax error in ``data`` (one JSON value), or None: the
    text of ``json.Unmarshal``, which pull requests report."""
    try:
        check_syntax(data)
    except JsonSyntaxError as exc:
        return str(exc)
    return None


def stream_wording(exc: JsonSyntaxError) -> str:
    """The same error as the server's streaming decoder words it, which API requests report: an
    early end is ``unexpected EOF``, anything else names its offset (counted from one)."""
    return "unexpected EOF" if exc.index is None else f"{exc} at offset {exc.index + 1}"


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(data: bytes, **hooks: Any) -> Any:
    """``data`` parsed by Python's parser, which refuses what Go's scanner refuses once ``NaN`` and
    ``Infinity`` are refused too; the byte-by-byte scan runs only to word a refusal, so a valid body
    (every pull request on the delivery path) is parsed once. Go keeps invalid UTF-8 inside
    strings as U+FFFD."""
    try:
        return json.loads(data.decode("utf-8", errors="replace"), parse_constant=_refuse_constant, **hooks)
    except ValueError:
        check_syntax(data)  # raises JsonSyntaxError with the server's words
        raise


def parse(data: bytes) -> Any:
    """``data`` as Go's decoder sees it before it fills a struct: objects as their key/value pairs
    in order, numbers as written (:mod:`gateway.api.structs` decodes it)."""
    return loads(data, object_pairs_hook=Pairs, parse_int=NumberLiteral, parse_float=NumberLiteral)


def check_syntax(data: bytes) -> None:
    """Scan ``data`` as one JSON value; raises :class:`JsonSyntaxError` at the first error."""
    end = _skip(data, _value(data, _skip(data, 0), "looking for beginning of value"))
    if end < len(data):
        raise JsonSyntaxError(f"invalid character {quote_char(data[end])} after top-level value", end)


def _skip(data: bytes, i: int) -> int:
    while i < len(data) and data[i] in _WS:
        i += 1
    return i


def _at(data: bytes, i: int) -> int:
    if i >= len(data):
        raise JsonSyntaxError("unexpected end of JSON input", None)
    return data[i]


def _value(data: bytes, i: int, context: str) -> int:
    """Scan one value starting at ``i`` (whitespace skipped); returns the index after it."""
    c = _at(data, i)
    if c == ord("{"):
        return _object(data, i + 1)
    if c == ord("["):
        return _array(data, i + 1)
    if c == ord('"'):
        return _string(data, i + 1)
    if c == ord("-") or ord("0") <= c <= ord("9"):
        return _number(data, i)
    for word in (b"true", b"false", b"null"):
        if c == word[0]:
            return _literal(data, i, word)
    raise JsonSyntaxError(f"invalid character {quote_char(c)} {context}", i)


def _object(data: bytes, i: int) -> int:
    return _members(data, i, ord("}"), _key_value, "object key:value pair")


def _array(data: bytes, i: int) -> int:
    return _members(data, i, ord("]"), _element, "array element")


def _members(data: bytes, i: int, close: int, member: Callable[[bytes, int], int], after: str) -> int:
    """Scan an object's or an array's members up to ``close`` (the opening bracket is behind ``i``),
    failing with Go's words for what may follow a member."""
    i = _skip(data, i)
    if _at(data, i) == close:
        return i + 1
    while True:
        i = _skip(data, member(data, i))
        c = _at(data, i)
        if c == close:
            return i + 1
        if c != ord(","):
            raise JsonSyntaxError(f"invalid character {quote_char(c)} after {after}", i)
        i = _skip(data, i + 1)


def _key_value(data: bytes, i: int) -> int:
    c = _at(data, i)
    if c != ord('"'):
        raise JsonSyntaxError(
            f"invalid character {quote_char(c)} looking for beginning of object key string", i
        )
    i = _skip(data, _string(data, i + 1))
    c = _at(data, i)
    if c != ord(":"):
        raise JsonSyntaxError(f"invalid character {quote_char(c)} after object key", i)
    return _value(data, _skip(data, i + 1), "looking for beginning of value")


def _element(data: bytes, i: int) -> int:
    return _value(data, i, "looking for beginning of value")


def _string(data: bytes, i: int) -> int:
    """Scan a string's body (the opening quote is behind ``i``)."""
    while True:
        c = _at(data, i)
        if c == ord('"'):
            return i + 1
        if c < 0x20:
            raise JsonSyntaxError(f"invalid character {quote_char(c)} in string", i)
        if c == ord("\\"):
            e = _at(data, i + 1)
            if e == ord("u"):
                hexes = data[i + 2 : i + 6]
                if len(hexes) < 4:
                    raise JsonSyntaxError("unexpected end of JSON input", None)
                if not all(chr(h) in "0123456789abcdefABCDEF" for h in hexes):
                    sequence = data[i : i + 6].decode("latin-1")
                    raise JsonSyntaxError(f"invalid escape sequence `{sequence}` in string", i)
                i += 6
                continue
            if chr(e) not in '"\\/bfnrt':
                raise JsonSyntaxError(f"invalid escape sequence `\\{chr(e)}` in string", i)
            i += 2
            continue
        i += 1


def _digits(data: bytes, i: int) -> int:
    while i < len(data) and ord("0") <= data[i] <= ord("9"):
        i += 1
    return i


def _number(data: bytes, i: int) -> int:
    def need_digit(j: int) -> int:
        c = _at(data, j)
        if not ord("0") <= c <= ord("9"):
            raise JsonSyntaxError(f"invalid character {quote_char(c)} in numeric literal", j)
        return _digits(data, j)

    if data[i] == ord("-"):
        i += 1
    i = i + 1 if _at(data, i) == ord("0") else need_digit(i)
    if i < len(data) and data[i] == ord("."):
        i = need_digit(i + 1)
    if i < len(data) and data[i] in b"eE":
        i += 1
        if i < len(data) and data[i] in b"+-":
            i += 1
        i = need_digit(i)
    return i


def _literal(data: bytes, i: int, word: bytes) -> int:
    for k in range(1, len(word)):
        c = _at(data, i + k)
        if c != word[k]:
            raise JsonSyntaxError(
                f"invalid character {quote_char(c)} in literal {word.decode()} (expecting '{chr(word[k])}')",
                i + k,
            )
    return i + len(word)
