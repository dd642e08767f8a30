"""``jetlake stream …`` and ``jetlake consumer …`` against the real JetStream and against jetlake: the
same commands print the same tables and numbers (times masked), and fail with the same errors."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from typing import Any

import nats

from gateway.cli import inspect as inspect_cli
from tests.harness import ROOT

TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC|^\[\d\d:\d\d:\d\d\]", re.MULTILINE)


def masked(status: int, out: str, err: str) -> tuple[int, str, str]:
    return status, TIME.sub("<time>", out), TIME.sub("<time>", err)


def command_line(url: str, *args: str) -> tuple[int, str, str]:
    """``jetlake <args> --server <url>`` as its own process, as a user runs it."""
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", *args, "--server", url],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=os.environ.copy(),
        timeout=60,
        check=False,
    )
    return masked(proc.returncode, proc.stdout, proc.stderr)


async def jetlake_cli(url: str, *args: str) -> tuple[int, str, str]:
    """The same command in this process (what the command line runs after parsing its arguments):
    a new interpreter per step would cost seconds each on a loaded machine."""
    parser = argparse.ArgumentParser(prog="jetlake")
    inspect_cli.add_parsers(parser.add_subparsers(dest="command", required=True))
    return masked(*await inspect_cli.execute(parser.parse_args([*args, "--server", url])))


def table_row(output: str, first_cell: str) -> list[str]:
    """The cells of the table row that starts with ``first_cell`` (tables hold other tests' rows)."""
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip("│").split("│")]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in\n{output}")


async def prepare(url: str, name: str) -> None:
    """Five messages (one with a header) and two pull consumers, one filtered."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for i in range(5):
            await js.publish(
                f"{name.lower()}.{i % 2}", f"body {i}".encode(), headers={"X-N": str(i)} if i == 0 else None
            )
        await js.add_consumer(name, durable_name="all", ack_policy="explicit")
        await js.add_consumer(
            name, durable_name="odd", ack_policy="explicit", filter_subject=f"{name.lower()}.1"
        )
    finally:
        await nc.close()


async def session(url: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["add"] = await jetlake_cli(
        url, "stream", "add", name, "--subjects", f"{name.lower()}.>", "--max-msgs", "100"
    )
    await prepare(url, name)
    rc, text, err = await jetlake_cli(url, "stream", "ls")
    out["ls"] = (rc, table_row(text, "Name"), table_row(text, name), err)
    out["info"] = await jetlake_cli(url, "stream", "info", name)
    assert command_line(url, "stream", "info", name) == out["info"]
    out["consumer ls"] = await jetlake_cli(url, "consumer", "ls", name)
    out["next"] = await jetlake_cli(url, "consumer", "next", name, "all", "--count", "3")
    out["next odd, no ack"] = await jetlake_cli(url, "consumer", "next", name, "odd", "--no-ack")
    out["consumer info all"] = await jetlake_cli(url, "consumer", "info", name, "all")
    out["consumer info odd"] = await jetlake_cli(url, "consumer", "info", name, "odd")
    out["consumer ls after"] = await jetlake_cli(url, "consumer", "ls", name)
    out["info missing"] = await jetlake_cli(url, "stream", "info", f"{name}X")
    out["consumer missing"] = await jetlake_cli(url, "consumer", "info", name, "nope")
    out["rm without force"] = await jetlake_cli(url, "stream", "rm", name)
    out["rm"] = await jetlake_cli(url, "stream", "rm", name, "--force")
    out["info after rm"] = await jetlake_cli(url, "stream", "info", name)
    return out


async def test_cli_gives_the_same_answers(targets: dict[str, str], unique: str) -> None:
    """Every inspection command prints the same on both servers: stream and consumer tables, info
    sections, fetched-and-acked messages, and the errors."""
    results = {target: await session(url, unique) for target, url in targets.items()}
    ours, ref = results["jetlake"], results["jetstream"]
    for step in ref:
        assert ours[step] == ref[step], step
    # and the numbers are the ones the steps produced
    assert ref["ls"][2][3] == "5"
    assert "Unprocessed Messages: 2" in ref["consumer info all"][1]
    assert "Acknowledgment Floor: Consumer sequence: 3 Stream sequence: 3" in ref["consumer info all"][1]
    assert "Outstanding Acks: 1 out of maximum 1,000" in ref["consumer info odd"][1]
    assert ref["info missing"] == (1, "", "nats: error: stream not found (10059)\n")
    assert ref["rm"] == (0, f"Deleted Stream {unique}\n", "")
