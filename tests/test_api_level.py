"""The JetStream API level (ADR-44): what jetlake reports, and ``Nats-Required-Api-Level`` refused
above it with 412/10185 (a status for pull requests and direct gets), before anything else of the
request is read, against the real server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from nats.aio.client import Client
from nats.errors import TimeoutError

from gateway.api.requests import API_LEVEL, above_api_level
from tests.jsapi import api, consumer, describe, publish, same, stream

LEVEL = "Nats-Required-Api-Level"


async def _request(nc: Client, subject: str, body: bytes, level: str) -> Any:
    msg = await nc.request(f"$JS.API.{subject}", body, timeout=5, headers={LEVEL: level})
    return json.loads(msg.data)


@pytest.mark.parametrize(
    ("subject", "body"),
    [
        ("INFO", b""),  # account info
        ("STREAM.INFO.{s}", b""),  # an error with the paging fields of a stream info
        ("STREAM.NAMES", b""),
        ("STREAM.CREATE.{s}X", b'{"name":"{s}X"}'),  # refused: nothing is created
        ("STREAM.PURGE.{s}", b""),  # refused: nothing is purged
        ("STREAM.MSG.GET.{s}", b'{"seq":1}'),
        ("STREAM.INFO.{s}", b"{bad"),  # the level is checked before the body is read
        ("CONSUMER.INFO.{s}.NOPE", b""),  # and before the consumer is looked up
        ("CONSUMER.LIST.{s}", b""),
        ("CONSUMER.CREATE.{s}.X", b'{"stream_name":"{s}","config":{"name":"X"}}'),
        ("STREAM.LEADER.STEPDOWN.{s}", b""),  # clustering support required comes first
    ],
)
@pytest.mark.parametrize("level", ["6", "abc", "5.0", "5", "+5", "-1", ""])
async def test_required_api_level(
    targets: dict[str, str], unique: str, subject: str, body: bytes, level: str
) -> None:
    """Above the level (or not a number) is 412/10185 and changes nothing; at or below it, or
    empty, the request is served as without the header."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await publish(nc, name, 2)
        answer = await _request(nc, subject.format(s=name), body.replace(b"{s}", name.encode()), level)
        after = await api(nc, f"STREAM.INFO.{name}X")
        state = (await api(nc, f"STREAM.INFO.{name}"))["state"]
        # an error answer whole (with the fields the server adds to it); of a success its type
        refusal = answer if "error" in answer else {"type": answer["type"]}
        return {"answer": refusal, "created": "error" not in after, "messages": state["messages"]}

    await same(targets, case, unique)


async def test_api_level_reported(targets: dict[str, str], unique: str) -> None:
    """``$JS.API.INFO`` and a stream's ``_nats.level`` metadata name the same level."""

    async def case(nc: Client, name: str) -> Any:
        created = await stream(nc, name)
        info = json.loads((await nc.request("$JS.API.INFO", b"", timeout=5)).data)
        return {"api": info["api"]["level"], "metadata": created["config"]["metadata"]["_nats.level"]}

    assert (await same(targets, case, unique)) == {"api": API_LEVEL, "metadata": str(API_LEVEL)}


async def _next(nc: Client, subject: str, body: bytes, level: str) -> Any:
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(f"$JS.API.{subject}", body, reply=inbox, headers={LEVEL: level})
    try:
        msg = await sub.next_msg(timeout=2)
    except TimeoutError:
        return "quiet"
    finally:
        await sub.unsubscribe()
    if msg.reply:  # a delivery
        return describe(msg)
    hdrs = dict(msg.headers or {})  # a status, or a direct get's message without its time
    hdrs.pop("Nats-Time-Stamp", None)
    return sorted(hdrs.items()), msg.data


async def test_pull_request_and_direct_get_hear_a_status(targets: dict[str, str], unique: str) -> None:
    """A pull request above the level hears ``412 Required Api Level`` (a push consumer's 409 comes
    first) and takes nothing; a direct get hears the same status where the stream serves them."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name, allow_direct=True)
        await publish(nc, name, 2)
        await consumer(nc, name, "pull", ack_policy="explicit")
        await consumer(nc, name, "push", deliver_subject=f"deliver.{name}")
        out = {
            "pull": await _next(nc, f"CONSUMER.MSG.NEXT.{name}.pull", b'{"batch":1,"no_wait":true}', "9"),
            "bad body": await _next(nc, f"CONSUMER.MSG.NEXT.{name}.pull", b"{bad", "9"),
            "push": await _next(nc, f"CONSUMER.MSG.NEXT.{name}.push", b"1", "9"),
            "direct": await _next(nc, f"DIRECT.GET.{name}", b'{"seq":1}', "9"),
            "direct at level": await _next(nc, f"DIRECT.GET.{name}", b'{"seq":1}', "5"),
        }
        info = await api(nc, f"CONSUMER.INFO.{name}.pull")
        return {**out, "delivered": info["delivered"], "waiting": info["num_waiting"]}

    await same(targets, case, unique)


@pytest.mark.parametrize(
    ("block", "refused"),
    [
        # what nats-server 2.15 answered to these raw header blocks (a client library strips
        # values, so the differential test above cannot send them)
        (b"NATS/1.0\r\nNats-Required-Api-Level: 6\r\n\r\n", True),
        (b"NATS/1.0\r\nNats-Required-Api-Level:5\r\n\r\n", False),
        (b"NATS/1.0\r\nNats-Required-Api-Level:  5\r\n\r\n", False),  # leading spaces dropped
        (b"NATS/1.0\r\nNats-Required-Api-Level: 5 \r\n\r\n", True),  # a trailing one is not
        (b"NATS/1.0\r\nNats-Required-Api-Level:\t5\r\n\r\n", True),  # nor a tab
        (b"NATS/1.0\r\nnats-required-api-level: 9\r\n\r\n", False),  # the name's case matters
        (b"NATS/1.0\r\nNats-Required-Api-Level: 5\r\nNats-Required-Api-Level: 9\r\n\r\n", False),
        (b"NATS/1.0\r\nX: 1\r\nNats-Required-Api-Level: 6\r\n\r\n", True),
        (b"NATS/1.0\r\nNats-Required-Api-Level:\r\n\r\n", False),  # empty: nothing asked
        (b"NATS/1.0\r\nNats-Required-Api-Level: 99999999999999999999\r\n\r\n", True),
        (b"NATS/1.0\r\nNats-Required-Api-Level: -99999999999999999999\r\n\r\n", True),  # out of int64
        (None, False),
    ],
)
def test_level_header_read_as_the_server_reads_it(block: bytes | None, refused: bool) -> None:
    assert above_api_level(block) is refused
