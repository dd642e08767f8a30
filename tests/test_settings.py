"""The one settings loader (``storage_delta/format/settings.py``) and the three settings it loads:
precedence (defaults < file < environment < flags), coercion by type, refusal of unknown keys and bad
values with the key and its source named, and the README's table, which must list every setting
exactly as the code defines it."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.main import _parser, main
from gateway.runtime.settings import LOADER
from spark_jobs.settings import JOBS_LOADER, SPARK_LOADER
from storage_delta.format.settings import Entry, Loader, SettingsError, setting

REPO = Path(__file__).resolve().parent.parent
# Each loader with the command line its flags belong to.
COMMANDS: list[tuple[Loader[Any], list[str]]] = [
    (LOADER, ["serve"]),
    (JOBS_LOADER, ["jobs", "run", "seal"]),
    (SPARK_LOADER, ["jobs", "run", "seal"]),
]
LOADERS = [loader for loader, _ in COMMANDS]


@dataclass(frozen=True)
class Inner:
    size: int = setting(1, "an integer inside a table")


@dataclass(frozen=True)
class Sample:
    name: str = setting("d", "a string")
    count: int = setting(1, "an integer")
    ratio: float = setting(0.5, "a number")
    on: bool = setting(False, "a boolean")
    opts: dict[str, str] = setting({"a": "1"}, "a dict")
    inner: Inner = field(default_factory=Inner)


@dataclass(frozen=True)
class NoMeaning:
    name: str = "x"


@dataclass(frozen=True)
class Unsupported:
    names: tuple[str, ...] = setting(("x",), "a tuple")


def sample(tmp_path: Path) -> Loader[Sample]:
    return Loader(Sample, tmp_path / "sample.toml", "T_")


def parse(loader: Loader[Any], *argv: str) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    loader.add_flags(parser)
    return vars(parser.parse_args(argv))


def value(settings: object, key: str) -> object:
    for part in key.split("."):
        settings = getattr(settings, part)
    return settings


def readme_rows() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text[text.index("\n## Configuration\n") :]
    section = section[: section.index("\n## ", 1)]
    return [line for line in section.splitlines() if line.startswith("| `conf/")]


def expected_rows() -> list[str]:
    rows = []
    for loader in LOADERS:
        file = loader.file.relative_to(REPO).as_posix()
        for e in loader.entries():
            default = f"`{e.default_text}`" if e.default_text else "empty"
            rows.append(f"| `{file}` | `{e.key}` | {e.meaning} | {default} | `{e.variable}` | `{e.flag}` |")
    return rows


def test_the_readme_table_names_every_setting_and_nothing_else() -> None:
    listed = {tuple(re.findall(r"`([^`]*)`", row)[:2]) for row in readme_rows()}
    defined = {
        (loader.file.relative_to(REPO).as_posix(), e.key) for loader in LOADERS for e in loader.entries()
    }
    assert sorted(defined - listed) == [], "settings without a row in README.md's Configuration table"
    assert sorted(listed - defined) == [], "rows in README.md's Configuration table naming no setting"


def test_the_readme_table_says_what_the_code_does() -> None:
    # On a change to a setting, paste these rows into README.md's Configuration table.
    assert readme_rows() == expected_rows(), "\n" + "\n".join(expected_rows())


@pytest.mark.parametrize("loader", LOADERS, ids=lambda loader: loader.file.name)
def test_each_shipped_file_holds_every_key_at_its_default(loader: Loader[Any]) -> None:
    # conf/ documents every setting, and the code's defaults are the file's, so the README's
    # defaults hold whether or not the file is there (an installed package has no conf/).
    text = loader.file.read_text()
    for e in loader.entries():
        table, _, key = e.key.rpartition(".")
        assert re.search(rf'^"?{re.escape(key)}"?\s*=', text, re.M) or (
            e.kind is dict and f"[{e.key}]" in text
        ), f"{e.key} missing from {loader.file}"
        assert not table or f"[{table}]" in text
    assert loader.load(environ={}) == loader.cls()


@pytest.mark.parametrize(("loader", "command"), COMMANDS, ids=lambda x: getattr(x, "file", Path()).name)
def test_every_setting_has_its_variable_and_its_flag_and_the_flag_wins(
    loader: Loader[Any], command: list[str]
) -> None:
    def text_and_value(e: Entry, n: int) -> tuple[str, object]:
        if e.key == "sync_interval":  # a text with a form of its own: "always" or a Go duration
            return f"{n}s", f"{n}s"
        if e.key == "event_loop":  # one of two names
            name = ("asyncio", "uvloop")[n % 2]
            return name, name
        if e.kind is int:
            return str(1000 + n), 1000 + n
        if e.kind is float:
            return f"{n}.5", n + 0.5
        if e.kind is dict:
            return f"k{n}=v{n}", {f"k{n}": f"v{n}"}
        return f"v{n}", f"v{n}"

    for e in loader.entries():
        env_text, env_value = text_and_value(e, 1)
        flag_text, flag_value = text_and_value(e, 2)
        args = vars(_parser().parse_args([*command, e.flag, flag_text]))
        by_env = loader.load(environ={e.variable: env_text})
        by_both = loader.load(args, environ={e.variable: env_text})
        if isinstance(e.default, dict):  # entries merge
            assert isinstance(env_value, dict)
            assert isinstance(flag_value, dict)
            assert value(by_env, e.key) == {**e.default, **env_value}
            assert value(by_both, e.key) == {**e.default, **env_value, **flag_value}
        else:
            assert (value(by_env, e.key), value(by_both, e.key)) == (env_value, flag_value), e.key


# (kind, file's TOML value, variable's text, flag's text, expected value from the file, env, flag)
PRECEDENCE = [
    ("name", '"f"', "e", "g", "f", "e", "g"),
    ("count", "2", "3", "4", 2, 3, 4),
    ("ratio", "2", "3.5", "1e3", 2.0, 3.5, 1000.0),  # an integer is a number; texts as Python reads them
    ("on", "true", "no", "ON", True, False, True),  # yes/no, on/off, 1/0 as well, any case
    ("inner.size", "5", "6", "7", 5, 6, 7),  # a key in a table: T_INNER_SIZE, --inner-size
]


@pytest.mark.parametrize(("key", "in_file", "env", "flag", "from_file", "from_env", "from_flag"), PRECEDENCE)
def test_file_then_environment_then_flags(
    tmp_path: Path,
    key: str,
    in_file: str,
    env: str,
    flag: str,
    from_file: object,
    from_env: object,
    from_flag: object,
) -> None:
    loader = sample(tmp_path)
    table, _, leaf = key.rpartition(".")
    loader.file.write_text(f"[{table}]\n{leaf} = {in_file}\n" if table else f"{leaf} = {in_file}\n")
    variable = "T_" + key.replace(".", "_").upper()
    flags = parse(loader, "--" + key.replace(".", "-").replace("_", "-"), flag)
    assert value(loader.load(environ={}), key) == from_file
    assert value(loader.load(environ={variable: env}), key) == from_env
    assert value(loader.load(flags, environ={variable: env}), key) == from_flag


def test_dict_entries_merge_source_over_source(tmp_path: Path) -> None:
    loader = sample(tmp_path)
    loader.file.write_text("[opts]\nb = 2\nc = true\n")  # TOML numbers and booleans as text
    flags = parse(loader, "--opts", "d=4", "--opts", "e = 5, f=x=y")  # repeated, like spark-submit's --conf
    got = loader.load(flags, environ={"T_OPTS": "c=3,d=3"}).opts
    assert got == {"a": "1", "b": "2", "c": "3", "d": "4", "e": "5", "f": "x=y"}


def test_defaults_when_the_default_file_is_absent(tmp_path: Path) -> None:
    assert sample(tmp_path).load(environ={}) == Sample()


def test_a_named_file_is_read_from_the_variable_or_the_flag(tmp_path: Path) -> None:
    loader = sample(tmp_path)
    (tmp_path / "a.toml").write_text("count = 8\n")
    (tmp_path / "b.toml").write_text("count = 9\n")
    assert loader.load(environ={"T_CONF_FILE": str(tmp_path / "a.toml")}).count == 8
    flags = parse(loader, "--conf-file", str(tmp_path / "b.toml"))
    assert loader.load(flags, environ={"T_CONF_FILE": str(tmp_path / "a.toml")}).count == 9


# (file's text, words the error must hold: the key and where it came from)
BAD_FILES = [
    ("nope = 1\n", ["nope", "no such setting", "sample.toml"]),  # a typo is not left at its default
    ("[inner]\nnope = 1\n", ["inner.nope", "no such setting"]),
    ("[extra]\nx = 1\n", ["extra", "no such setting"]),
    ("inner = 3\n", ["inner", "table"]),
    ('count = "3"\n', ["count", "'3'", "integer", "sample.toml"]),  # TOML has types: a string is no int
    ("count = true\n", ["count", "True", "integer"]),  # nor is a boolean
    ("ratio = nan\n", ["ratio", "finite"]),
    ('on = "yes"\n', ["on", "true or false"]),
    ("name = 3\n", ["name", "string"]),
    ("opts = 3\n", ["opts", "table"]),
    ("[opts]\nx = [1]\n", ["opts", "'x'", "string, number or boolean"]),
    ("count = \n", ["sample.toml"]),  # not TOML at all
]


@pytest.mark.parametrize(("text", "words"), BAD_FILES)
def test_bad_files_are_refused_naming_the_key_and_the_file(
    tmp_path: Path, text: str, words: list[str]
) -> None:
    loader = sample(tmp_path)
    loader.file.write_text(text)
    with pytest.raises(SettingsError) as err:
        loader.load(environ={})
    for word in words:
        assert word in str(err.value)


# (variable, text, words the error must hold)
BAD_TEXTS = [
    ("T_COUNT", "3.0", ["count", "'3.0'", "integer"]),
    ("T_RATIO", "inf", ["ratio", "finite"]),
    ("T_RATIO", "fast", ["ratio", "finite"]),
    ("T_ON", "maybe", ["on", "true or false"]),
    ("T_OPTS", "a=1,b", ["opts", "key=value"]),  # an entry without '='
    ("T_OPTS", "=1", ["opts", "key=value"]),  # an entry without a key
    ("T_INNER_SIZE", "big", ["inner.size", "integer"]),
]


@pytest.mark.parametrize(("variable", "text", "words"), BAD_TEXTS)
def test_bad_variables_and_flags_are_refused_naming_the_key_and_the_source(
    tmp_path: Path, variable: str, text: str, words: list[str]
) -> None:
    loader = sample(tmp_path)
    with pytest.raises(SettingsError) as err:
        loader.load(environ={variable: text})
    assert all(w in str(err.value) for w in words)
    assert f"environment variable {variable}" in str(err.value)
    flag = "--" + variable.removeprefix("T_").lower().replace("_", "-")
    with pytest.raises(SettingsError) as err:
        loader.load(parse(loader, flag, text), environ={})
    assert all(w in str(err.value) for w in words)
    assert f"flag {flag}" in str(err.value)


def test_a_named_file_that_is_missing_is_an_error(tmp_path: Path) -> None:
    loader = sample(tmp_path)
    with pytest.raises(SettingsError, match=r"missing\.toml"):
        loader.load(environ={"T_CONF_FILE": str(tmp_path / "missing.toml")})


@pytest.mark.parametrize("cls", [NoMeaning, Unsupported])
def test_a_field_the_loader_cannot_describe_or_read_is_a_programming_error(tmp_path: Path, cls: type) -> None:
    with pytest.raises(TypeError):
        Loader(cls, tmp_path / "x.toml", "T_").entries()


def test_flags_carry_the_meaning_the_variable_and_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--data-root TEXT where the Delta tables live" in help_text
    assert "(default 4222; JETLAKE_CLIENT_PORT)" in help_text


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["serve", "--client-port", "x"], ["jetlake serve", "client_port", "flag --client-port"]),
        (["serve", "--sync-interval", "soon"], ["jetlake serve", "sync_interval", "'soon'", "always"]),
        (["jobs", "run", "seal", "--every-seal", "soon"], ["jetlake jobs", "every.seal", "--every-seal"]),
        (["jobs", "run", "seal", "--conf", "nokey"], ["jetlake jobs", "conf", "flag --conf"]),
    ],
)
def test_the_commands_stop_on_a_bad_setting_before_starting_anything(
    argv: list[str], words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


def test_an_event_loop_jetlake_does_not_know_is_refused() -> None:
    with pytest.raises(SettingsError, match="event_loop: 'tokio' is not one of uvloop, asyncio"):
        LOADER.load(environ={"JETLAKE_EVENT_LOOP": "tokio"})
    assert LOADER.load(environ={"JETLAKE_EVENT_LOOP": "asyncio"}).event_loop == "asyncio"
