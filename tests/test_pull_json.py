"""Pull request bodies that start with ``{`` but do not decode: the real server answers
``400 Bad Request - <its decoder's error>``, and the client sees that text, so it must match word for
word. Syntax errors of every scanner state, and values of the wrong type for each field of the
request struct; valid bodies alongside, which must not be refused."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from nats.aio.client import Client

from gateway.api.gojson import GoJsonError, syntax_error
from gateway.api.pull import decode_pull_request
from tests.jsapi import consumer, pull, same, stream

SYNTAX = [
    b"{",
    b"{not json",
    b'{"a":',
    b"{}}",
    b'{"a":1,}',
    b'{"a" 1}',
    b'{"a":1 "b":2}',
    b'{"a":[1 2]}',
    b'{"a":"\x01"}',
    b'{"a":"\\q"}',
    b'{"a":"\\u12g4"}',
    b'{"a":NaN}',
    b'{"a":01}',
    b'{"a":1.}',
    b'{"a":-}',
    b'{"a":tru}',
    b'{"a":nul}',
    b'{"a":"x',
    b'{"a":{"b":[}}',
    b'{"a":1}  x',
    b'{ "a" : [1,]}',
    b'{\n"a"\t:\r1,\n}',
    b'{"a":-01}',
    b'{"a":1e}',
    b'{"a":.5}',
]
TYPES = [
    b'{"batch":1.5}',
    b'{"batch":"x"}',
    b'{"batch":[1]}',
    b'{"batch":{}}',
    b'{"batch":true}',
    b'{"Batch":"x"}',
    b'{"batch":1e2}',
    b'{"batch":99999999999999999999}',
    b'{"no_wait":1}',
    b'{"no_wait":"true"}',
    b'{"expires":1.5}',
    b'{"expires":"1s"}',
    b'{"idle_heartbeat":true}',
    b'{"max_bytes":"1"}',
    b'{"group":1}',
    b'{"min_pending":"x"}',
    b'{"min_ack_pending":1.5}',
    b'{"id":1}',
    b'{"priority":"x"}',
    b'{"batch":"x","no_wait":"y"}',
    b'{"batch":"x","expires":',
    b'{"batch":1,"batch":"x"}',
]
# Valid: served (here: waiting, as the stream is empty) or expired at once (a negative expires)
VALID = [b'{"batch":null}', b'{"a":"\xff"}', b'{"a":"\\ud800"}', b'{"a":[1,2]}', b'{"expires":-5}']


async def test_bad_pull_bodies_get_the_servers_400(targets: dict[str, str], unique: str) -> None:
    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await consumer(nc, name, "c", ack_policy="explicit")
        answers = await asyncio.gather(
            *(pull(nc, name, "c", body, 1, wait=1.0) for body in SYNTAX + TYPES + VALID)
        )
        return dict(zip([b.decode("latin-1") for b in SYNTAX + TYPES + VALID], answers, strict=True))

    results = await same(targets, case, unique)
    refused = [body for body, answer in results.items() if answer[0][:2] == ("status", "400")]
    assert len(refused) == len(SYNTAX) + len(TYPES)  # every bad body is refused, no valid one


@pytest.mark.parametrize("body", SYNTAX)
def test_syntax_errors_are_found_by_the_scanner(body: bytes) -> None:
    """The scanner's verdict agrees with Python's parser on what is valid (the texts are checked
    against the real server above)."""
    assert syntax_error(body) is not None
    with pytest.raises(GoJsonError):
        decode_pull_request(body)


@pytest.mark.parametrize(
    "body", [b"{}", b'{"batch":3,"expires":5,"no_wait":true}', *VALID, b"[1]", b"1", b'"x"']
)
def test_valid_json_passes_the_scanner(body: bytes) -> None:
    assert syntax_error(body) is None


@pytest.mark.parametrize(
    ("subject", "body"),
    [
        ("STREAM.CREATE.{name}", b"{"),
        ("STREAM.CREATE.{name}", b'{"name":"X",}'),
        ("CONSUMER.CREATE.{name}", b'{"a" 1}'),
        ("STREAM.NAMES", b"{not"),
        ("STREAM.INFO.{name}", b'{"subjects_filter":tru}'),
    ],
)
async def test_malformed_api_requests_name_the_offset(
    targets: dict[str, str], unique: str, subject: str, body: bytes
) -> None:
    """API requests are read by the server's streaming decoder: the same 10025, worded with the
    offset of the bad byte, or ``unexpected EOF``."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        return json.loads((await nc.request(f"$JS.API.{subject.format(name=name)}", body, timeout=5)).data)

    await same(targets, case, unique)
