"""The next-generation Python clients, nats-core 0.2 and nats-jetstream 0.3 (Python 3.13, from
their own venv), against the real JetStream and jetlake: streams, publish with the expected-*
headers, message get (API and direct), fetch with a nak, messages() with idle heartbeats, ordered
consumers, CONSUMER.RESET, purge, message delete and consumer management. nats-jetstream 0.3 has
no KV or object store. The driver is tests/nats_jetstream/driver.py; each case's reports from both
servers must be equal, and a few facts of the real server's report are pinned so that both servers
cannot agree on a broken case."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.harness import scrub

pytestmark = pytest.mark.nats_jetstream

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "nats_jetstream" / "driver.py"
PYTHON = ROOT / ".venv-nats-jetstream" / "bin" / "python"


@pytest.fixture(scope="module")
def client_python() -> Path:
    """The clients' venv, made by the Makefile's target (which `make test` runs first) when a
    test run starts without it; the target says what is missing when Python 3.13 is."""
    made = subprocess.run(
        ["make", "--no-print-directory", "nats-jetstream-client"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if made.returncode != 0:
        raise RuntimeError(f"make nats-jetstream-client failed:\n{made.stdout}\n{made.stderr}")
    return PYTHON


def reports(python: Path, targets: dict[str, str], stream: str, case: str) -> dict[str, Any]:
    """The driver's report of ``case`` from each server, scrubbed of times and server ids."""
    out = {}
    for name, url in targets.items():
        res = subprocess.run(
            [str(python), str(DRIVER), url, stream, case],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        lines = res.stdout.splitlines()
        if res.returncode != 0 or not lines:
            raise AssertionError(f"driver {case} failed against {name}\n{res.stdout}\n{res.stderr}")
        out[name] = scrub(json.loads(lines[-1]))
    return out


def same(python: Path, targets: dict[str, str], stream: str, case: str) -> Any:
    got = reports(python, targets, stream, case)
    assert got["jetlake"] == got["jetstream"], f"jetlake:   {got['jetlake']}\njetstream: {got['jetstream']}"
    return got["jetstream"]


def test_streams(client_python: Path, targets: dict[str, str], unique: str) -> None:
    """Create (the same again, then different), update, info with subjects, names, listing by
    subject, delete and what follows a delete."""
    out = same(client_python, targets, unique, "streams")
    assert out["create_again"] is True
    assert out["create_different"]["err_code"] == 10058
    assert out["update"]["config"]["max_msgs"] == 50
    assert out["info_subjects"]["state"]["subjects"] == {f"{unique}.a": 1, f"{unique}.b": 1}
    assert out["names"] == [unique]
    assert out["listed"] == [unique]
    assert out["info_deleted"]["err_code"] == out["delete_deleted"]["err_code"] == 10059


def test_publish(client_python: Path, targets: dict[str, str], unique: str) -> None:
    """PubAcks with and without a message id (a duplicate's), each expected-* header right and
    wrong, and a subject no stream captures."""
    out = same(client_python, targets, unique, "publish")
    assert out["msg_id_again"] == {**out["msg_id"], "duplicate": True}
    assert [
        out[f"expected_{k}_wrong"]["err_code"] for k in ("stream", "last_seq", "subject_seq", "msg_id")
    ] == [
        10060,
        10071,
        10071,
        10070,
    ]
    assert out["expected_msg_id"]["sequence"] == 8
    assert out["no_stream"]["raised"] == "NoRespondersError"


def test_get(client_python: Path, targets: dict[str, str], unique: str) -> None:
    """get_message and get_last_message_for_subject through STREAM.MSG.GET and DIRECT.GET."""
    out = same(client_python, targets, unique, "get")
    for path in ("msg_get", "direct"):
        assert out[path]["seq1"]["headers"] == {"X-Tag": ["t1"]}
        assert out[path]["last_a"]["seq"] == 3
        assert out[path]["missing"]["raised"] == "MessageNotFoundError"
    assert out["msg_get"]["missing"]["err_code"] == 10037


def test_fetch(client_python: Path, targets: dict[str, str], unique: str) -> None:
    """fetch with a nak (the redelivery leads the next batch), fetch_nowait, next on an empty
    consumer, max_bytes, and a heartbeat more than half the expiry."""
    out = same(client_python, targets, unique, "fetch")
    assert out["second"][0] == [f"{unique}.a", "1", 1, 5, 2]
    assert [m[2] for m in out["nowait"]] == [8, 9, 10]
    assert out["nowait_empty"] == [[], None]
    assert out["next_empty"]["raised"] == "TimeoutError"
    assert out["heartbeat_too_large"][1]["text"] == "Bad Request: Bad Request - heartbeat value too large"


def test_messages_with_heartbeats(client_python: Path, targets: dict[str, str], unique: str) -> None:
    """messages() keeps its pulls alive through an idle spell by the servers' heartbeats (the
    client counts none missed) and gets what is published meanwhile."""
    out = same(client_python, targets, unique, "messages")
    assert out["heartbeat_misses"] == 0
    assert [m[2] for m in out["messages"]] == list(range(1, 21))
    assert out["num_ack_pending"] == 0


def test_ordered_consumers(client_python: Path, targets: dict[str, str], unique: str) -> None:
    """Ordered consumers: messages(), fetches (each a new memory-stored server consumer from the
    next sequence), last per subject; closing deletes them."""
    out = same(client_python, targets, unique, "ordered")
    assert out["config"]["mem_storage"] is True
    assert [m[2] for m in out["messages"]] == list(range(1, 21))
    assert [[m[2] for m in batch] for batch in out["fetches"]] == [[1, 3, 5, 7], [9, 11, 13, 15], [17, 19]]
    assert [m[2] for m in out["last_per_subject"]] == [19, 20]
    assert out["consumers_left"] == []


def test_consumer_reset(client_python: Path, targets: dict[str, str], unique: str) -> None:
    """reset() to a sequence and back above the ack floor, and where the deliver policy bounds it."""
    out = same(client_python, targets, unique, "reset")
    assert out["to_2"]["reset_seq"] == 2
    assert [m[2] for m in out["after_to_2"]] == [2, 3, 4]
    assert out["by_start_sequence_3"]["description"] == "invalid reset: below start seq"
    assert out["by_start_time_3"]["description"] == "invalid reset: below start time"
    assert out["new_6"]["description"] == "invalid reset: not allowed"
    assert out["new_None"] == 9


def test_stream_and_consumer_management(client_python: Path, targets: dict[str, str], unique: str) -> None:
    """Purge by subject, keeping some, up to a sequence and whole; message delete (plain and
    secure); consumer update (and a refused one), names, list, pause, resume, delete, and the
    errors of what is gone."""
    out = same(client_python, targets, unique, "manage")
    assert out["deleted"]["deleted"] == [3, 4, 6, 7, 8, 9, 11, 12]
    assert out["delete_again"]["err_code"] == 10043
    assert out["update"]["description"] == "two"
    assert out["update_refused"]["description"] == "ack policy can not be updated"
    assert (out["paused"], out["resumed"]) == (True, None)
    assert out["pause_missing"]["err_code"] == 10014
    assert out["purge_all"]["first_sequence"] == 13
