"""The one settings loader: a frozen dataclass filled from its defaults, then a TOML file, then
``<PREFIX><KEY>`` environment variables, then command-line flags, each overriding the one before.

Why one: the gateway, the Spark jobs and the Spark session each had a loader, with their own
coercions, precedence and names, so a key could be set one way for one process and not for another.
Here a field's type decides how a value is read, wherever it comes from, and its name decides its
variable and its flag; the README's table of settings is generated from the same entries (and
``tests/test_settings.py`` checks it), so what it says holds for every process.

It sits in storage_delta's lowest layer because both ``gateway`` and ``spark_jobs`` load settings and
may import ``storage_delta`` only; it needs nothing beyond the standard library. Nothing is read at
import: a process calls ``Loader.load`` once when it starts (starlette's ``Config`` is the model:
typed, prefixed, read once, explicit about where a value came from).

Field types: ``int``, ``float``, ``bool``, ``str``, ``dict[str, str]`` and a nested frozen dataclass
(a TOML table; its fields are keys ``table.key``, variables ``<PREFIX>TABLE_KEY`` and flags
``--table-key``). A variable and a flag take the same text: numbers as Python writes them, booleans
as true/false (yes/no, on/off, 1/0), a dict as ``key=value,key=value`` (so its values cannot hold a
comma; use the file for those). Dict entries merge: each source's entries are laid over the ones
before, key by key, so one flag can add a Spark property without dropping the file's.
"""

from __future__ import annotations

import argparse
import math
import os
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, get_args, get_origin, get_type_hints

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["Entry", "Loader", "SettingsError", "setting"]

T = TypeVar("T")
S = TypeVar("S", bound="DataclassInstance")

#: Where ``setting`` keeps a field's meaning in the field's metadata.
MEANING = "jetlake.meaning"
_SCALARS: tuple[type, ...] = (int, float, bool, str)
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


class SettingsError(ValueError):
    """A setting that cannot be used: an unknown key, a value of the wrong type, a missing file. The
    message names the key and where the value came from, so the operator knows what to fix."""


def setting(default: T, meaning: str) -> T:
    """A settings field: its default and what it means, which becomes its flag's help and its row in
    the README. Typed as the default so that ``port: int = setting(4222, "...")`` checks."""
    if isinstance(default, dict):
        entries = dict(default)  # each instance gets its own copy of a mutable default
        return cast(T, field(default_factory=lambda: dict(entries), metadata={MEANING: meaning}))
    return field(default=default, metadata={MEANING: meaning})


@dataclass(frozen=True)
class Entry:
    """One leaf setting, with every name it goes by."""

    key: str  # in the file; ``table.key`` for a key inside a table
    kind: type  # int, float, bool, str or dict: how a value is read
    meaning: str
    default: object
    variable: str  # JETLAKE_DATA_ROOT
    flag: str  # --data-root

    @property
    def default_text(self) -> str:
        """The default written as its variable or flag would take it ('' when empty)."""
        return _text(self.default)


@dataclass(frozen=True)
class Loader(Generic[S]):
    """How one settings class is loaded: its default file (which may be absent, as in an installed
    package without ``conf/``), its variables' prefix and the flag that names another file
    (``None``: only the variable ``<PREFIX>CONF_FILE`` does)."""

    cls: type[S]
    file: Path
    prefix: str
    file_flag: str | None = "--conf-file"

    @property
    def file_variable(self) -> str:
        return f"{self.prefix}CONF_FILE"

    def entries(self) -> list[Entry]:
        """Every leaf setting in field order; raises TypeError for a field this loader cannot read
        or one without a meaning (a programming error, caught by the tests)."""
        out = list(_entries(self.cls, self.prefix, ()))
        if self.file_variable in {e.variable for e in out}:
            raise TypeError(f"{self.cls.__name__}: a field's variable is {self.file_variable}")
        return out

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        """A flag for every setting (``--data-root`` for ``data_root``), and the file flag. Values
        stay text until ``load`` reads them, so a bad one is reported like a bad variable."""
        if self.file_flag:
            parser.add_argument(
                self.file_flag,
                dest=self.file_variable,
                metavar="FILE",
                default=argparse.SUPPRESS,
                help=f"settings file (default {self.file}; {self.file_variable})",
            )
        for e in self.entries():
            help_text = f"{e.meaning} (default {e.default_text or 'empty'}; {e.variable})"
            parser.add_argument(
                e.flag,
                dest=e.variable,
                metavar=_METAVAR[e.kind],
                # a repeated dict flag adds entries, as spark-submit's --conf does
                action="append" if e.kind is dict else "store",
                default=argparse.SUPPRESS,
                help=help_text.replace("%", "%%"),
            )

    def load(self, flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> S:
        """The settings: defaults < file < environment < flags. ``flags`` is ``vars(args)`` of a
        parser given ``add_flags``; ``environ`` defaults to ``os.environ``, read now."""
        env = os.environ if environ is None else environ
        given = flags or {}
        entries = self.entries()
        values: dict[str, object] = {e.key: e.default for e in entries}
        path, explicit = self._file(given, env)
        if explicit or path.is_file():
            self._read_file(path, values)
        for e in entries:
            if e.variable in env:
                _put(values, e, _from_text(e, env[e.variable], f"environment variable {e.variable}"))
            # a flag's value: a text, or a list of texts for a dict flag (given once per entry group)
            flag = given.get(e.variable, [])
            for text in [flag] if isinstance(flag, str) else flag:
                _put(values, e, _from_text(e, text, f"flag {e.flag}"))
        return _build(self.cls, values, "")

    def _file(self, flags: Mapping[str, Any], env: Mapping[str, str]) -> tuple[Path, bool]:
        """The file to read, and whether it was asked for (then it must exist)."""
        named = flags.get(self.file_variable) or env.get(self.file_variable)
        return (Path(named), True) if named else (self.file, False)

    def _read_file(self, path: Path, values: dict[str, object]) -> None:
        try:
            with path.open("rb") as fh:
                doc = tomllib.load(fh)
        except OSError as exc:
            raise SettingsError(f"settings file {path}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"settings file {path}: {exc}") from None
        entries = {e.key: e for e in self.entries()}
        for key, raw in _flatten(self.cls, doc, "", path):
            _put(values, entries[key], _from_toml(entries[key], raw, str(path)))


def _entries(cls: type, prefix: str, path: tuple[str, ...]) -> Iterator[Entry]:
    hints = get_type_hints(cls)
    for f in fields(cls):
        hint = hints[f.name]
        here = (*path, f.name)
        if isinstance(hint, type) and is_dataclass(hint):
            yield from _entries(hint, prefix, here)
            continue
        key = ".".join(here)
        if MEANING not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name}: declare it with setting(default, meaning)")
        default = f.default_factory() if callable(f.default_factory) else f.default
        yield Entry(
            key=key,
            kind=_kind(hint, key),
            meaning=f.metadata[MEANING],
            default=default,
            variable=prefix + "_".join(here).upper(),
            flag="--" + "-".join(here).replace("_", "-"),
        )


def _kind(hint: object, key: str) -> type:
    for kind in _SCALARS:
        if hint is kind:
            return kind
    if get_origin(hint) is dict and get_args(hint) == (str, str):
        return dict
    raise TypeError(f"{key}: settings of type {hint} are not supported")


def _flatten(cls: type, table: Mapping[str, Any], prefix: str, path: Path) -> Iterator[tuple[str, Any]]:
    """(key, value) for every leaf in a file's table, refusing keys the class does not have: a typo
    in a file must not leave a setting at its default unnoticed."""
    hints = get_type_hints(cls)
    names = {f.name for f in fields(cls)}
    for name, raw in table.items():
        key = prefix + name
        if name not in names:
            raise SettingsError(f"{key}: no such setting (in {path})")
        hint = hints[name]
        if isinstance(hint, type) and is_dataclass(hint):
            if not isinstance(raw, dict):
                raise SettingsError(f"{key}: expected a table [{key}], got {raw!r} (in {path})")
            yield from _flatten(hint, raw, key + ".", path)
        else:
            yield key, raw


def _put(values: dict[str, object], e: Entry, value: object) -> None:
    if e.kind is dict:
        values[e.key] = {**cast(dict[str, str], values[e.key]), **cast(dict[str, str], value)}
    else:
        values[e.key] = value


def _from_toml(e: Entry, raw: object, source: str) -> object:
    """A file's value: TOML has types already, so only the right one is taken (an integer where a
    float is wanted too); a dict's values may be numbers or booleans, kept as their text."""
    if e.kind is dict:
        if not isinstance(raw, dict):
            raise _bad(e, raw, source, "a table of key = value")
        for k, v in raw.items():
            if not isinstance(v, str | int | float | bool):
                raise _bad(e, v, f"{source}, key {k!r}", "a string, number or boolean")
        return {str(k): _text(v) for k, v in raw.items()}
    if e.kind is float and type(raw) in (int, float) and math.isfinite(cast(float, raw)):
        return float(cast(float, raw))
    if e.kind is not float and type(raw) is e.kind:  # ``type``: a boolean is no integer here
        return raw
    raise _bad(e, raw, source, _WANTED[e.kind])


def _from_text(e: Entry, text: str, source: str) -> object:
    """A variable's or flag's value, read by the field's type."""
    value = _READERS[e.kind](text)
    if value is None:
        raise _bad(e, text, source, _WANTED[e.kind])
    return value


def _read_bool(text: str) -> bool | None:
    word = text.strip().lower()
    return True if word in _TRUE else False if word in _FALSE else None


def _read_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _read_float(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _read_dict(text: str) -> dict[str, str] | None:
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    if not all(len(p) == 2 and p[0].strip() for p in pairs):
        return None
    return {k.strip(): v.strip() for k, v in pairs}


_READERS: dict[type, Callable[[str], object | None]] = {
    str: str,
    bool: _read_bool,
    int: _read_int,
    float: _read_float,
    dict: _read_dict,
}
_METAVAR = {int: "INT", float: "NUMBER", bool: "true|false", str: "TEXT", dict: "KEY=VALUE,..."}
_WANTED = {
    int: "an integer",
    float: "a finite number",
    bool: "true or false",
    str: "a string",
    dict: "key=value pairs separated by commas",
}


def _bad(e: Entry, raw: object, source: str, wanted: str) -> SettingsError:
    return SettingsError(f"{e.key}: {raw!r} is not {wanted} (from {source})")


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ",".join(f"{k}={_text(v)}" for k, v in value.items())
    return str(value)


def _build(cls: type[S], values: Mapping[str, object], prefix: str) -> S:
    hints = get_type_hints(cls)
    kwargs: dict[str, object] = {}
    for f in fields(cls):
        hint = hints[f.name]
        if isinstance(hint, type) and is_dataclass(hint):
            kwargs[f.name] = _build(hint, values, f"{prefix}{f.name}.")
        else:
            kwargs[f.name] = values[prefix + f.name]
    return cls(**kwargs)
