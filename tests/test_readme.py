"""The README's code blocks run. Every fenced block is either executed here, top to bottom as a reader
follows them, against a real gateway started as the other tests start one (tests/harness.py), or it
carries ``<!-- not run: <reason> -->`` on the line before it. A block that is neither fails the first
test, so an example cannot drift from the code unnoticed.

How a block runs depends on its language:

* ``python``: executed in one namespace shared by all the README's Python blocks (the streaming
  example uses the ``spark`` of the one before it); a ``print(...)  # <text>`` line must print
  ``<text>``; a streaming query a block starts processes what is available and is stopped.
* ``sh``: run by bash with ``set -euo pipefail``, so every command must succeed; ``NATS_URL`` points at
  the gateway (the CLI's documented variable), and ``./data`` in the working directory is its store.
* ``conf``: a nats-server configuration: a hub is started with it (its leafnode listener moved to a
  free loopback port) and a gateway attached to it as a leaf; a client that names no domain must reach
  the JetStream API and a key-value bucket through the configuration's mappings.

The README's default addresses (``127.0.0.1:4222``, ``127.0.0.1:8222``) and its ``/tmp/`` paths are
replaced by the test's own ports and directory, as tests share the machine; so is ``"./data"`` in
Python (see ``Reader.localised_python``). A block that uses Spark (``spark`` in its text, or ``jetlake
jobs``) is marked ``spark``. The blocks a block follows are run first when they have not been, except
that a block without Spark never waits for one with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest

from tests.harness import ROOT, Jetlake

README = ROOT / "README.md"
FENCE = re.compile(r"^```(\S*)\s*$")
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(\S.*?)\s*-->$")
EXPECTED = re.compile(r"print\(.*\)\s+#\s*(\S.*?)\s*$", re.MULTILINE)  # print(x)  # what it prints
LEAF_LISTEN = "0.0.0.0:7422"  # the README's hub listens here; the test's hub on a free loopback port


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    not_run: str | None  # the reason given in ``<!-- not run: … -->``, or None: it is run

    @property
    def name(self) -> str:
        return f"README.md:{self.line}"

    @property
    def spark(self) -> bool:
        return "spark" in self.text.lower() or "jetlake jobs" in self.text


def parse(markdown: str) -> list[Block]:
    """The fenced blocks of ``markdown`` in order, each with the reason of a ``not run`` comment on
    the line before its fence."""
    lines = markdown.splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == "```"), None)
        assert end is not None, f"README.md:{i + 1}: a code block is never closed"
        marker = NOT_RUN.match(lines[i - 1].strip()) if i > 0 else None
        body = "\n".join(lines[i + 1 : end]) + "\n"
        out.append(Block(i + 1, opening.group(1), body, marker.group(1) if marker else None))
        i = end + 1
    return out


BLOCKS = parse(README.read_text())
RUN = [b for b in BLOCKS if b.not_run is None]


class Hub(Jetlake):
    """A nats-server started with a configuration from the README (plus a client listener), and a
    gateway attached to its leafnode port."""

    def __init__(self, workdir: Path, conf: str) -> None:
        super().__init__(workdir)
        self.conf = conf

    def server_conf(self) -> str:
        assert LEAF_LISTEN in self.conf, f"the README's hub no longer listens on {LEAF_LISTEN}"
        return f"listen: 127.0.0.1:{self.port}\n" + self.conf.replace(
            LEAF_LISTEN, f"127.0.0.1:{self.leaf_port}"
        )


async def through_hub(url: str) -> tuple[int, bytes]:
    """A client with no domain option: a value put into and read back from a new key-value bucket
    (its ``$KV.>`` publish goes through the second mapping), then the account's stream count."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(bucket="readme")
        await kv.put("greeting", b"hello")
        entry = await kv.get("greeting")
        return (await js.account_info()).streams, entry.value or b""
    finally:
        await nc.close()


class Reader:
    """Someone following the README: one gateway, a working directory whose ``./data`` is the
    gateway's store, one Python namespace, and the blocks run so far."""

    def __init__(self, lake: Jetlake) -> None:
        self.lake = lake
        self.cwd = lake.workdir
        self.namespace: dict[str, Any] = {"__name__": "__readme__"}
        self.outcome: dict[int, str] = {}  # block line -> "ok" or "failed"

    def follow(self, block: Block, request: pytest.FixtureRequest) -> None:
        for earlier in RUN:
            if earlier.line >= block.line:
                break
            if earlier.spark and not block.spark:
                continue
            if earlier.line not in self.outcome:
                self.run(earlier, request)
            if self.outcome[earlier.line] != "ok":
                pytest.fail(f"{block.name} follows {earlier.name}, which failed")
        self.run(block, request)

    def run(self, block: Block, request: pytest.FixtureRequest) -> None:
        self.outcome[block.line] = "failed"
        if block.spark:
            request.getfixturevalue("spark")  # the run's session: build_spark_session returns it
        runner = getattr(self, f"run_{block.lang}", None)
        if runner is None:
            pytest.fail(f"{block.name}: no way to run a {block.lang or 'language-less'} block")
        runner(block)
        self.outcome[block.line] = "ok"

    def localised(self, text: str) -> str:
        return (
            text.replace("127.0.0.1:4222", f"127.0.0.1:{self.lake.port}")
            .replace("127.0.0.1:8222", f"127.0.0.1:{self.lake.monitor_port}")
            .replace("/tmp/", f"{self.cwd}/tmp/")
        )

    def localised_python(self, text: str) -> str:
        """Also ``"./data"``: the jetlake source resolves it in Spark's Python workers, which run in
        the directory the JVM started in (the test run's), not in this reader's."""
        return self.localised(text).replace('"./data"', f'"{self.lake.data_root}"')

    def run_python(self, block: Block) -> None:
        spark = self.namespace.get("spark")
        before = {q.id for q in spark.streams.active} if spark is not None else set()
        out = io.StringIO()
        code = compile(self.localised_python(block.text), block.name, "exec")
        with contextlib.chdir(self.cwd), contextlib.redirect_stdout(out):
            exec(code, self.namespace)
        printed = out.getvalue()
        sys.stdout.write(printed)
        for expected in EXPECTED.findall(block.text):
            assert expected in printed, f"{block.name} should print {expected!r}; it printed\n{printed}"
        spark = self.namespace.get("spark")
        started = [q for q in spark.streams.active if q.id not in before] if spark is not None else []
        for query in started:
            try:
                query.processAllAvailable()
            finally:
                query.stop()  # none outlives the test, also when it failed
            assert query.exception() is None, query.exception()
            rows = sum(p["numInputRows"] for p in query.recentProgress)
            assert rows > 0, f"the streaming query of {block.name} read nothing"

    def run_sh(self, block: Block) -> None:
        # `jetlake` is the console script's entry point run with ResourceWarnings shown, in our own
        # processes only: PYTHONWARNINGS would reach the Python workers Spark's JVM starts for a job,
        # and PySpark's worker daemon leaks files of its own (pyspark/daemon.py: stdin, and each
        # task's socket files, are opened with os.fdopen and left to the collector).
        bin_dir = self.cwd / "bin"
        bin_dir.mkdir(exist_ok=True)
        shim = bin_dir / "jetlake"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -W default::ResourceWarning -m gateway "$@"\n')
        shim.chmod(0o755)
        env = {
            **os.environ,
            "NATS_URL": self.lake.url,
            # then the venv's commands (spark-submit), importing this checkout's code
            "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]]),
            "PYTHONPATH": str(ROOT),
        }
        proc = subprocess.run(
            ["bash", "-euxo", "pipefail", "-c", self.localised(block.text)],
            cwd=self.cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=1500,
            check=False,
        )
        sys.stdout.write(proc.stdout + proc.stderr)
        assert proc.returncode == 0, f"{block.name} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        assert "ResourceWarning" not in proc.stderr, f"{block.name} leaked:\n{proc.stderr}"

    def run_conf(self, block: Block) -> None:
        hub = Hub(self.cwd / f"hub-{block.line}", block.text)
        hub.start()
        try:
            streams, value = asyncio.run(through_hub(hub.url))
        finally:
            hub.stop()
        assert (streams, value) == (1, b"hello")  # the bucket is the account's one stream


RUNNERS = {name.removeprefix("run_") for name in vars(Reader) if name.startswith("run_")}


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reader]:
    lake = Jetlake(tmp_path_factory.mktemp("readme"))
    lake.start()
    try:
        yield Reader(lake)
    finally:
        lake.stop()


# ---- the blocks are accounted for ----------------------------------------------------------------


def test_every_block_is_run_or_marked_not_run() -> None:
    unknown = [f"{b.name} ({b.lang or 'no language'})" for b in RUN if b.lang not in RUNNERS]
    assert not unknown, (
        f"blocks this test cannot run: {unknown}; give each a language it runs ({sorted(RUNNERS)}) "
        "or put <!-- not run: reason --> on the line before it"
    )
    # every kind of block is found: a parse that missed them would pass the line above
    assert {b.lang for b in RUN} == RUNNERS


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        # a block with its language
        ("text\n```python\nprint(1)\n```\n", [(2, "python", "print(1)\n", None)]),
        # the marker on the line before the fence says why it is not run
        (
            "<!-- not run: serves until stopped -->\n```sh\nmake run\n```\n",
            [(2, "sh", "make run\n", "serves until stopped")],
        ),
        # a marker further up marks nothing; a block without a language has lang ""
        ("<!-- not run: x -->\n\n```\na\n```\n", [(3, "", "a\n", None)]),
        # a marker without a reason is no marker
        ("<!-- not run: -->\n```sh\nls\n```\n", [(2, "sh", "ls\n", None)]),
        # blocks in order; a fence inside a block's text is its text
        (
            "```sh\na\n```\nb\n```conf\n  ```x\n```\n",
            [(1, "sh", "a\n", None), (5, "conf", "  ```x\n", None)],
        ),
    ],
)
def test_parse(markdown: str, expected: list[tuple[int, str, str, str | None]]) -> None:
    assert [(b.line, b.lang, b.text, b.not_run) for b in parse(markdown)] == expected


def test_expected_output_comments() -> None:
    text = "x = 1\nprint(x)  # 1\nprint(f(a), b)  # a b\nf(x)  # not a print\nprint(x)\n"
    assert EXPECTED.findall(text) == ["1", "a b"]


def test_a_block_that_is_never_closed_is_an_error() -> None:
    with pytest.raises(AssertionError, match=r"README\.md:1: a code block is never closed"):
        parse("```python\nprint(1)\n")


# ---- the blocks run ------------------------------------------------------------------------------


def _marks(block: Block) -> list[pytest.MarkDecorator]:
    # a Spark block may start several Spark applications (each `jetlake jobs run` is one)
    return [pytest.mark.spark, pytest.mark.timeout(1800)] if block.spark else []


@pytest.mark.parametrize("block", [pytest.param(b, id=b.name, marks=_marks(b)) for b in RUN])
def test_block_runs(block: Block, reader: Reader, request: pytest.FixtureRequest) -> None:
    reader.follow(block, request)
