"""NATS subject transforms: a source filter and a destination template with mapping functions, as a
stream's ``subject_transform``, its ``republish``, and the transforms of mirrors and sources use them.

The destination's tokens are literals, ``$N`` (the N-th wildcard of the source), or a function in
double braces: ``wildcard(n)``, ``partition(buckets, n...)`` (FNV-1a of the tokens, modulo the
buckets), ``splitFromLeft/Right(n, pos)``, ``sliceFromLeft/Right(n, size)``, ``split(n, delim)``,
``left/right(n, len)``, ``random(buckets)``; a final ``>`` carries the rest of the subject. The
rules, including the errors' words and which functions the validator knows, are nats-server's
(``server/subject_transform.go``, ``ValidateMapping``), pinned by differential tests.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, auto
from functools import partial

from storage_delta.format.nats import subject_matches

_MAX_INT32 = 2**31 - 1


class MappingError(ValueError):
    """A destination the server refuses; ``str()`` is the server's description."""


INVALID_DESTINATION = "invalid mapping destination"
_NOT_A_SUBJECT = f"{INVALID_DESTINATION}: invalid transform"
_UNKNOWN_FUNCTION = f"{INVALID_DESTINATION}: unknown function"
_OUT_OF_RANGE = f"{INVALID_DESTINATION}: wildcard index out of range"
_NOT_ENOUGH_ARGS = f"{INVALID_DESTINATION}: not enough arguments passed to the function"
_INVALID_ARG = f"{INVALID_DESTINATION}: function argument is invalid or in the wrong format"
_TOO_MANY_ARGS = f"{INVALID_DESTINATION}: too many arguments passed to the function"
BAD_SUBJECT = "invalid subject"


def _error(err: str, token: str) -> MappingError:
    return MappingError(f"{err} in {token}" if token else err)


class Fn(Enum):
    LITERAL = auto()
    PARTITION = auto()
    WILDCARD = auto()
    SPLIT_FROM_LEFT = auto()
    SPLIT_FROM_RIGHT = auto()
    SLICE_FROM_LEFT = auto()
    SLICE_FROM_RIGHT = auto()
    SPLIT = auto()
    LEFT = auto()
    RIGHT = auto()
    RANDOM = auto()


def _function(name: str) -> re.Pattern[str]:
    # e.g. "SplitFromLeft": each capital letter may be written in either case
    letters = "".join(f"[{c}{c.lower()}]" if c.isupper() else c for c in name)
    return re.compile(r"{{\s*" + letters + r"\s*\((.*)\)\s*}}")


_FUNCTIONS = {
    Fn.WILDCARD: _function("Wildcard"),
    Fn.PARTITION: _function("Partition"),
    Fn.SPLIT_FROM_LEFT: _function("SplitFromLeft"),
    Fn.SPLIT_FROM_RIGHT: _function("SplitFromRight"),
    Fn.SLICE_FROM_LEFT: _function("SliceFromLeft"),
    Fn.SLICE_FROM_RIGHT: _function("SliceFromRight"),
    Fn.RIGHT: _function("Right"),
    Fn.LEFT: _function("Left"),
    Fn.SPLIT: _function("Split"),
    Fn.RANDOM: _function("Random"),
}
_COMMA = re.compile(r",\s*")


def _args(fn: Fn, token: str) -> list[str] | None:
    match = _FUNCTIONS[fn].search(token)
    return None if match is None else _COMMA.split(match.group(1))


def _atoi(text: str) -> int | None:
    """Go's ``strconv.Atoi`` of a space-trimmed argument: an optional sign and decimal digits."""
    text = text.strip(" ")
    return int(text) if re.fullmatch(r"[+-]?\d+", text) else None


@dataclass(frozen=True, slots=True)
class _Token:
    fn: Fn
    literal: str = ""
    positions: tuple[int, ...] = ()  # wildcard numbers (1-based) as written; source token indexes once bound
    number: int = -1
    text: str = ""


def _index_int(fn: Fn, token: str, args: list[str]) -> _Token:
    """A function of a wildcard number and an integer (split and slice positions, lengths)."""
    if len(args) < 2:
        raise _error(_NOT_ENOUGH_ARGS, token)
    if len(args) > 2:
        raise _error(_TOO_MANY_ARGS, token)
    index, number = _atoi(args[0]), _atoi(args[1])
    if index is None or number is None or not -(2**31) <= number <= _MAX_INT32:
        raise _error(_INVALID_ARG, token)
    return _Token(fn, positions=(index,), number=number)


def _wildcard(token: str, args: list[str]) -> _Token:
    if args == [""]:
        raise _error(_NOT_ENOUGH_ARGS, token)
    if len(args) > 1:
        raise _error(_TOO_MANY_ARGS, token)
    n = _atoi(args[0])
    if n is None:
        raise _error(_INVALID_ARG, token)
    return _Token(Fn.WILDCARD, positions=(n,))


def _partition(token: str, args: list[str]) -> _Token:
    buckets = _atoi(args[0])
    positions = [_atoi(a) for a in args[1:]]
    if buckets is None or buckets > _MAX_INT32 or None in positions:
        raise _error(_INVALID_ARG, token)
    return _Token(Fn.PARTITION, positions=tuple(p for p in positions if p is not None), number=buckets)


def _split_args(token: str, args: list[str]) -> _Token:
    if len(args) < 2:
        raise _error(_NOT_ENOUGH_ARGS, token)
    if len(args) > 2:
        raise _error(_TOO_MANY_ARGS, token)
    index = _atoi(args[0])
    if index is None or " " in args[1] or "." in args[1]:
        raise _error(_INVALID_ARG, token)
    return _Token(Fn.SPLIT, positions=(index,), text=args[1])


def _random(token: str, args: list[str]) -> _Token:
    if len(args) != 1:
        raise _error(_NOT_ENOUGH_ARGS, token)
    buckets = _atoi(args[0])
    if buckets is None or buckets > _MAX_INT32:
        raise _error(_INVALID_ARG, token)
    return _Token(Fn.RANDOM, number=buckets)


#: Each function's argument reader, in the order the server tries their patterns.
_READERS: tuple[tuple[Fn, Callable[[str, list[str]], _Token]], ...] = (
    (Fn.WILDCARD, _wildcard),
    (Fn.PARTITION, _partition),
    *(
        (fn, partial(_index_int, fn))
        for fn in (
            Fn.SPLIT_FROM_LEFT,
            Fn.SPLIT_FROM_RIGHT,
            Fn.SLICE_FROM_LEFT,
            Fn.SLICE_FROM_RIGHT,
            Fn.RIGHT,
            Fn.LEFT,
        )
    ),
    (Fn.SPLIT, _split_args),
    (Fn.RANDOM, _random),
)


def _placeholder(token: str) -> _Token:
    """What one destination token asks for (the server's ``indexPlaceHolders``)."""
    if len(token) > 1 and token[0] == "$":  # the old ``$N`` form; other ``$`` tokens are literals
        n = _atoi(token[1:]) if token[1:].strip(" ") == token[1:] else None
        return _Token(Fn.LITERAL, token) if n is None else _Token(Fn.WILDCARD, positions=(n,))
    if not (len(token) > 4 and token.startswith("{{") and token.endswith("}}")):
        return _Token(Fn.LITERAL, token)
    for fn, read in _READERS:
        if (args := _args(fn, token)) is not None:
            return read(token, args)
    raise _error(_UNKNOWN_FUNCTION, token)


def _subject_info(subject: str) -> tuple[bool, list[str], int, bool]:
    """Valid, tokens, number of ``*``, has a ``>`` (the server's ``subjectInfo``)."""
    if not subject:
        return False, [], 0, False
    toks = subject.split(".")
    pwcs, fwc = 0, False
    for t in toks:
        if not t or fwc:
            return False, [], 0, False
        if t == ">":
            fwc = True
        elif t == "*":
            pwcs += 1
    return True, toks, pwcs, fwc


@dataclass(frozen=True, slots=True)
class SubjectTransform:
    """A compiled transform: ``match`` a published subject, or None when it is not the source's."""

    source: str
    dest: str
    stoks: tuple[str, ...]
    dtoks: tuple[str, ...]
    plan: tuple[_Token, ...]

    @classmethod
    def parse(cls, source: str, dest: str) -> SubjectTransform | None:
        """None for an empty destination (no transform); raises :class:`MappingError`."""
        if not dest:
            return None
        source = source or ">"
        sv, stoks, npwcs, sfwc = _subject_info(source)
        dv, dtoks, dnpwcs, dfwc = _subject_info(dest)
        if not sv or not dv or dnpwcs > 0 or sfwc != dfwc:
            raise MappingError(BAD_SUBJECT)
        wildcard_at = [i for i, t in enumerate(stoks) if t == "*"]  # wildcard n is stoks[wildcard_at[n-1]]
        plan: list[_Token] = []
        for token in dtoks:
            tok = _placeholder(token)
            if npwcs > 0 or sfwc:
                if tok.fn not in (Fn.LITERAL, Fn.RANDOM):
                    for n in tok.positions:
                        if n > npwcs:
                            raise _error(_OUT_OF_RANGE, f"{token}: [{n}]")
                    # the server's map of wildcard numbers answers 0 for a number it does not hold
                    bound = tuple(wildcard_at[n - 1] if 1 <= n <= npwcs else 0 for n in tok.positions)
                    tok = _Token(tok.fn, tok.literal, bound, tok.number, tok.text)
            elif tok.fn in (Fn.RANDOM, Fn.PARTITION):
                tok = _Token(tok.fn, tok.literal, (), tok.number, tok.text)
            elif tok.fn is not Fn.LITERAL:
                raise _error(_OUT_OF_RANGE, token)
            plan.append(tok)
        return cls(source, dest, tuple(stoks), tuple(dtoks), tuple(plan))

    def match(self, subject: str) -> str | None:
        """The transformed subject, or None when ``subject`` is not one the source matches."""
        if self.source == ">" and self.dest == ">":
            return subject
        toks = subject.split(".")
        if "" in toks or any(t in ("*", ">") for t in toks):
            return None
        if self.source != ">" and not subject_matches(self.source, subject):
            return None
        return self.apply(toks)

    def apply(self, toks: list[str]) -> str:
        out: list[str] = []
        for i, tok in enumerate(self.plan):
            if tok.fn is Fn.LITERAL:
                if self.dtoks[i] == ">":
                    break
                out.append(tok.literal)
            else:
                out.append(_run(tok, toks))
        text = ".".join(out)
        if self.dtoks[-1] == ">":
            rest = ".".join(toks[len(self.stoks) - 1 :])
            text = f"{text}.{rest}" if out else rest
        return text


def _fnv1a32(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def _run(tok: _Token, toks: list[str]) -> str:
    """One mapping function applied to the subject's tokens."""
    fn, n = tok.fn, tok.number
    if fn is Fn.PARTITION:
        key = "".join(toks[p] for p in tok.positions) if tok.positions else ".".join(toks)
        return "0" if n == 0 else str(_fnv1a32(key.encode()) % (n & 0xFFFFFFFF))
    if fn is Fn.RANDOM:
        return "0" if n == 0 else str(random.randrange(_MAX_INT32 + 1) % abs(n))
    if fn is Fn.WILDCARD:
        p = tok.positions[0] if tok.positions else len(toks)
        return toks[p] if p < len(toks) else ""
    src = toks[tok.positions[0]]
    size = len(src)
    if fn is Fn.SPLIT:
        return _split(src, tok.text)
    if not 0 < n < size:
        return src  # too small to cut where asked: left whole
    if fn is Fn.SPLIT_FROM_LEFT:
        return f"{src[:n]}.{src[n:]}"
    if fn is Fn.SPLIT_FROM_RIGHT:
        return f"{src[: size - n]}.{src[size - n :]}"
    if fn is Fn.SLICE_FROM_LEFT:
        return ".".join(src[i : i + n] for i in range(0, size, n))
    if fn is Fn.SLICE_FROM_RIGHT:
        head = size % n
        return ".".join(([src[:head]] if head else []) + [src[i : i + n] for i in range(head, size, n)])
    if fn is Fn.LEFT:
        return src[:n]
    return src[size - n :]  # Fn.RIGHT


def _split(src: str, delim: str) -> str:
    """The server's ``split``: empty pieces dropped, but a separator is written before a piece that
    follows an empty one unless the empty one came first (so ``--a`` gives ``.a``)."""
    pieces = src.split(delim) if delim else list(src)  # Go splits at every character then
    out = []
    for j, piece in enumerate(pieces):
        out.append(piece)
        if j < len(pieces) - 1 and pieces[j + 1] and not (j == 0 and not piece):
            out.append(".")
    return "".join(out)


def validate_mapping(source: str, dest: str) -> None:
    """The server's ``ValidateMapping``: a destination's tokens, then the transform itself."""
    if not dest:
        return
    fwc = False
    for t in dest.split("."):
        if not t or fwc:
            raise _error(_NOT_A_SUBJECT, t)
        if len(t) > 4 and t.startswith("{{") and t.endswith("}}"):
            if not any(pattern.search(t) for pattern in _FUNCTIONS.values()):
                raise _error(_UNKNOWN_FUNCTION, t)
            continue
        if t == ">":
            fwc = True
        elif any(c in t for c in "\t\n\f\r "):
            raise MappingError(_NOT_A_SUBJECT)
    SubjectTransform.parse(source, dest)
