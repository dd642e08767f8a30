"""Bad input, generated (hypothesis) and from a fixed corpus, sent to the real JetStream and to
jetlake: the same answer (error JSON with the same code and err_code, the same status, or the same
silence), no crash, no stall, and nothing changed by a request that was refused.

A new API subject is one line in ``ENDPOINTS``. Each pair of servers is this module's own, so
streams that generated configs happen to create touch no other test.
"""

from __future__ import annotations

import asyncio
import json
import string
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeout

from tests.harness import Jetlake, ReferenceJetStream, scrub

SILENCE_S = 0.4  # how long an unanswered request waits before it counts as silence
ANSWER_S = 10.0  # how long a request that both servers answer may take (a durable commit of 1 MB)
EXAMPLES = 60  # per property: bounded, this runs in CI against two live servers

STREAM, CONSUMER = "FZ", "C"

# API subjects jetlake serves, with placeholders for the tokens the fuzzer varies: {stream} and
# {consumer} may name the seeded stream FZ and consumer C; {victim} never names FZ (requests that
# remove things must not take the fixture away). One line each.
ENDPOINTS: dict[str, str] = {
    "INFO": "INFO",
    "STREAM.CREATE": "STREAM.CREATE.{stream}",
    "STREAM.UPDATE": "STREAM.UPDATE.{victim}",
    "STREAM.INFO": "STREAM.INFO.{stream}",
    "STREAM.NAMES": "STREAM.NAMES",
    "STREAM.LIST": "STREAM.LIST",
    "STREAM.DELETE": "STREAM.DELETE.{victim}",
    "STREAM.PURGE": "STREAM.PURGE.{victim}",
    "STREAM.MSG.GET": "STREAM.MSG.GET.{stream}",
    "STREAM.MSG.DELETE": "STREAM.MSG.DELETE.{victim}",
    "CONSUMER.CREATE": "CONSUMER.CREATE.{stream}.{consumer}",
    "CONSUMER.CREATE (ephemeral)": "CONSUMER.CREATE.{stream}",
    "CONSUMER.CREATE (filtered)": "CONSUMER.CREATE.{stream}.{consumer}.{filter}",
    "CONSUMER.DURABLE.CREATE": "CONSUMER.DURABLE.CREATE.{stream}.{consumer}",
    "CONSUMER.INFO": "CONSUMER.INFO.{stream}.{consumer}",
    "CONSUMER.MSG.NEXT": "CONSUMER.MSG.NEXT.{stream}.{consumer}",
}


# ---- the two servers ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A reference JetStream and a jetlake of this module's own, each with stream FZ on ``fz.>``
    holding two messages and a durable pull consumer C."""
    ref = ReferenceJetStream(Path(tmp_path_factory.mktemp("fuzz-ref")))
    lake = Jetlake(Path(tmp_path_factory.mktemp("fuzz-lake")))
    ref.start()
    try:
        lake.start()
        try:
            urls = {"jetstream": ref.url, "jetlake": lake.url}
            asyncio.run(_seed(urls))
            yield urls
        finally:
            lake.stop()
    finally:
        ref.stop()


async def _seed(urls: dict[str, str]) -> None:
    for url in urls.values():
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            await js.add_stream(name=STREAM, subjects=["fz.>"])
            await js.publish("fz.a", b"one")
            await js.publish("fz.b", b"two")
            await js.pull_subscribe("fz.>", durable=CONSUMER, stream=STREAM)
        finally:
            await nc.close()


# ---- observing a server -------------------------------------------------------------------------


async def _quiet(exc: Exception) -> None:
    """Protocol errors from deliberately bad input are the test's business, not the log's."""


@asynccontextmanager
async def _asked(
    url: str, subject: str, body: bytes, headers: dict[str, str] | None
) -> AsyncIterator[Subscription]:
    """One request on a fresh connection (so a waiting pull request dies with it), its inbox open
    until the block ends: a late answer can still be read."""
    nc = await nats.connect(url, error_cb=_quiet)
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox, max_msgs=1)
        await nc.publish(subject, body, reply=inbox, headers=headers)
        yield sub
    finally:
        await nc.close()


async def _answer(sub: Subscription, wait: float) -> tuple[Any, ...]:
    """What came back within ``wait`` seconds."""
    try:
        msg = await sub.next_msg(timeout=wait)
    except NatsTimeout:
        return ("silence",)
    if msg.headers and msg.headers.get("Status") == "503" and not msg.data:
        return ("no responders",)
    return classify(msg.headers, msg.data)


async def ask(
    url: str, subject: str, body: bytes, headers: dict[str, str] | None, wait: float = SILENCE_S
) -> tuple[Any, ...]:
    """One request: what came back within ``wait`` seconds."""
    async with _asked(url, subject, body, headers) as sub:
        return await _answer(sub, wait)


def classify(headers: dict[str, str] | None, data: bytes) -> tuple[Any, ...]:
    """The part of an answer clients act on: status code, error code and err_code, or success."""
    if headers and headers.get("Status"):
        return ("status", headers["Status"], headers.get("Description", ""))
    try:
        doc = json.loads(data)
    except ValueError:
        return ("message", len(data))
    if isinstance(doc, dict) and "error" in doc:
        return ("error", doc["error"].get("code"), doc["error"].get("err_code"))
    if isinstance(doc, dict) and "seq" in doc:
        return ("puback", doc.get("stream"))
    return ("ok", doc.get("type") if isinstance(doc, dict) else None)


def refused(answer: tuple[Any, ...]) -> bool:
    return answer[0] in ("error", "no responders") or (answer[0] == "status" and answer[1] >= "400")


async def state(url: str) -> Any:
    """What a refused request must not change: the streams, FZ's state and consumer C's info (less
    ``num_waiting``, which a pull request that is still waiting moves legitimately)."""
    nc = await nats.connect(url)
    try:
        names = await _api(nc, "STREAM.NAMES", b"{}")
        info = await _api(nc, f"STREAM.INFO.{STREAM}", b"")
        cons = await _api(nc, f"CONSUMER.INFO.{STREAM}.{CONSUMER}", b"")
        cons.pop("num_waiting", None)
        return scrub({"names": names.get("streams"), "state": info.get("state"), "consumer": cons})
    finally:
        await nc.close()


async def _api(nc: Client, subject: str, body: bytes) -> dict[str, Any]:
    return dict(json.loads((await nc.request(f"$JS.API.{subject}", body, timeout=5)).data))


async def both(
    pair: dict[str, str],
    subject: str,
    body: bytes,
    headers: dict[str, str] | None = None,
    wait: float = SILENCE_S,
) -> dict[str, Any]:
    """The answer of each server to the same request. A server silent for ``wait`` while the
    other answered is given an answer's time (``ANSWER_S``) before its silence counts: on a loaded
    machine an answer can come after ``wait``, and it is still an answer to compare."""
    async with AsyncExitStack() as stack:
        subs = {
            target: await stack.enter_async_context(_asked(url, subject, body, headers))
            for target, url in pair.items()
        }
        answers = {target: await _answer(sub, wait) for target, sub in subs.items()}
        if ("silence",) in answers.values() and any(a != ("silence",) for a in answers.values()):
            for target in [t for t, a in answers.items() if a == ("silence",)]:
                answers[target] = await _answer(subs[target], ANSWER_S)
        return answers


# ---- the cases ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    endpoint: str
    stream: str
    consumer: str
    body: bytes


async def exchange(pair: dict[str, str], case: Case, headers: dict[str, str] | None = None) -> None:
    """Send to both; assert the same answer, an unchanged jetlake after a refusal, and a gateway
    that still answers at once."""
    subject = _subject(ENDPOINTS[case.endpoint], case.stream, case.consumer, "fz.x")
    before = await state(pair["jetlake"])
    answers = await both(pair, subject, case.body, headers)
    assert answers["jetlake"] == answers["jetstream"], (subject, case.body, headers)
    if refused(answers["jetlake"]):
        assert await state(pair["jetlake"]) == before, "a refused request changed something"
    assert (await ask(pair["jetlake"], "$JS.API.INFO", b"", None))[0] == "ok", "the gateway stalled"


# ---- generated input ----------------------------------------------------------------------------

TOKEN_CHARS = string.ascii_letters + string.digits + "-_"
good_token = st.text(TOKEN_CHARS, min_size=1, max_size=12)
# tokens the real server treats specially or refuses in names
odd_token = st.sampled_from(["*", ">", "ÄÖ", "x" * 300, "$SYS", "_INBOX"])
token = st.one_of(st.just(STREAM), st.just(CONSUMER), good_token, odd_token)

json_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.text()
)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _dump(value: Any) -> bytes:
    return json.dumps(value).encode()


# Bodies that are not a JSON object at all: what load_request must refuse like the real server.
not_an_object = st.one_of(
    st.binary(max_size=64).filter(lambda b: not b.strip().startswith(b"{")),
    json_value.filter(lambda v: not isinstance(v, dict)).map(_dump),
    st.sampled_from([b"{", b"{not json", b'{"a":', b"{}}", b"\xff\xfe", b'{"a":1,}']),
)
request_headers = st.none() | st.dictionaries(
    st.text(TOKEN_CHARS, min_size=1, max_size=10).map(lambda k: "X-" + k),
    st.text(string.printable.strip(), max_size=20),
    max_size=3,
)


def _subject(template: str, stream: str, consumer: str, filt: str) -> str:
    victim = stream if stream != STREAM else "NOT" + STREAM
    return "$JS.API." + template.format(stream=stream, consumer=consumer, filter=filt, victim=victim)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    endpoint=st.sampled_from(sorted(ENDPOINTS)),
    stream=token,
    consumer=token,
    body=not_an_object,
    headers=request_headers,
)
async def test_non_object_bodies(
    pair: dict[str, str],
    endpoint: str,
    stream: str,
    consumer: str,
    body: bytes,
    headers: dict[str, str] | None,
) -> None:
    """Malformed JSON, JSON that is not an object, and junk bytes, to every API subject."""
    await exchange(pair, Case(endpoint, stream, consumer, body), headers)


# Fields the requests of ENDPOINTS read; generated objects put arbitrary JSON values in them.
REQUEST_FIELDS = [
    "offset",
    "subject",
    "subjects_filter",
    "deleted_details",
    "seq",
    "last_by_subj",
    "next_by_subj",
    "filter",
    "keep",
    "batch",
    "expires",
    "no_wait",
    "max_bytes",
    "stream_name",
    "action",
]
request_object = st.dictionaries(st.sampled_from(REQUEST_FIELDS), json_value, min_size=1, max_size=3)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(endpoint=st.sampled_from(sorted(ENDPOINTS)), stream=token, consumer=token, req=request_object)
async def test_request_fields_of_any_type(
    pair: dict[str, str], endpoint: str, stream: str, consumer: str, req: dict[str, Any]
) -> None:
    """Request objects whose fields hold values of any JSON type (a string offset, a list for a
    sequence, an object for a subject)."""
    await exchange(pair, Case(endpoint, stream, consumer, _dump(req)))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(endpoint=st.sampled_from(sorted(ENDPOINTS)), stream=token, consumer=token)
async def test_subject_tokens(pair: dict[str, str], endpoint: str, stream: str, consumer: str) -> None:
    """Names in the subject: the existing stream and consumer, unknown ones, wildcards, odd text;
    with an empty body."""
    await exchange(pair, Case(endpoint, stream, consumer, b""))


@pytest.mark.waits
@settings(max_examples=EXAMPLES // 3, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    extra=st.lists(good_token | odd_token, min_size=1, max_size=3),
    prefix=st.sampled_from(["", "STREAM.", "CONSUMER.", "STREAM.INFO.", "CONSUMER.INFO.FZ."]),
)
async def test_unknown_api_subjects(pair: dict[str, str], extra: list[str], prefix: str) -> None:
    """API subjects nobody serves (unknown operations, extra tokens) get the server's silence
    (fewer examples: each silence costs the wait on both servers)."""
    subject = "$JS.API." + prefix + ".".join(extra)
    before = await state(pair["jetlake"])
    answers = await both(pair, subject, b"{}")
    assert answers["jetlake"] == answers["jetstream"], subject
    assert await state(pair["jetlake"]) == before


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    subject=st.lists(good_token, min_size=1, max_size=3).map(lambda t: "fz." + ".".join(t)),
    size=st.sampled_from([0, 1, 100, 4096, 65_536, 1_000_000]),
    headers=request_headers,
)
async def test_publishes_to_stream_subjects(
    pair: dict[str, str], subject: str, size: int, headers: dict[str, str] | None
) -> None:
    """Publishes of any size (up to the server's max payload) with arbitrary non-JetStream headers
    are PubAck'd by both, and stored alike."""
    payload = bytes(i % 251 for i in range(size))
    # answered by both (no silence to wait out): the gateway's PubAck follows a synced commit
    answers = await both(pair, subject, payload, headers, ANSWER_S)
    assert answers["jetlake"] == answers["jetstream"] == ("puback", STREAM)
    keys = ("messages", "bytes", "first_seq", "last_seq", "num_subjects")
    states = {target: (await state(url))["state"] for target, url in pair.items()}
    assert {k: states["jetlake"][k] for k in keys} == {k: states["jetstream"][k] for k in keys}


# ---- a fixed corpus -----------------------------------------------------------------------------


CORPUS = [
    # malformed JSON where a config is required
    pytest.param("STREAM.CREATE.BAD1", b"{", id="create-truncated"),
    # a JSON array where an object is required
    pytest.param("STREAM.CREATE.BAD2", b"[]", id="create-array"),
    # JSON null unmarshals to the zero config: the name in the subject does not match it
    pytest.param("STREAM.CREATE.BAD3", b"null", id="create-null"),
    # bytes that are not UTF-8
    pytest.param("STREAM.CREATE.BAD4", b'{"name":"\xff"}', id="create-not-utf8"),
    # a number where the config is required
    pytest.param("STREAM.CREATE.BAD5", b"42", id="create-number"),
    # an optional body that is a number is ignored (the real server's isJSONObjectOrArray)
    pytest.param(f"STREAM.INFO.{STREAM}", b"42", id="info-number"),
    # ... and an optional body that is an array is invalid JSON
    pytest.param(f"STREAM.INFO.{STREAM}", b"[1]", id="info-array"),
    # names: a string body is ignored
    pytest.param("STREAM.NAMES", b'"x"', id="names-string"),
    # names: malformed JSON is not
    pytest.param("STREAM.NAMES", b"{not json", id="names-malformed"),
    # names: a field the request does not have
    pytest.param("STREAM.NAMES", b'{"bogus":1}', id="names-unknown-field"),
    # purge: a field the request does not have
    pytest.param(f"STREAM.PURGE.{STREAM}", b'{"bogus":1}', id="purge-unknown-field"),
    # list: an offset of the wrong type
    pytest.param("STREAM.LIST", b'{"offset":"x"}', id="list-offset-string"),
    # delete takes no body: 10038 even for a stream that does not exist
    pytest.param("STREAM.DELETE.NOSUCH", b'{"x":1}', id="delete-with-body"),
    # purge of a stream that does not exist, with a junk optional body
    pytest.param("STREAM.PURGE.NOSUCH", b"true", id="purge-junk-body"),
    # info of a stream name with a wildcard
    pytest.param("STREAM.INFO.*", b"", id="info-wildcard-name"),
    # a consumer on a stream that does not exist
    pytest.param("CONSUMER.INFO.NOSUCH.C", b"", id="consumer-info-no-stream"),
    # a consumer that does not exist
    pytest.param(f"CONSUMER.INFO.{STREAM}.NOSUCH", b"", id="consumer-info-no-consumer"),
    # the durable name in the subject and the body differ
    pytest.param(
        f"CONSUMER.DURABLE.CREATE.{STREAM}.D1",
        json.dumps({"stream_name": STREAM, "config": {"durable_name": "D2"}}).encode(),
        id="durable-name-mismatch",
    ),
    # the stream name in the body and the subject differ
    pytest.param(
        f"CONSUMER.CREATE.{STREAM}.D3",
        json.dumps({"stream_name": "OTHER", "config": {"name": "D3"}}).encode(),
        id="consumer-stream-mismatch",
    ),
    # a pull body that is neither a JSON object nor a number is ignored (no 400)
    pytest.param(f"CONSUMER.MSG.NEXT.{STREAM}.{CONSUMER}", b'"x"', id="next-string-body"),
    # a consumer create's action is an enum of its own: null, other case or type is invalid JSON
    pytest.param(f"CONSUMER.CREATE.{STREAM}.A1", b'{"action": null}', id="create-action-null"),
    pytest.param(
        f"CONSUMER.CREATE.{STREAM}.A1",
        b'{"stream_name":"%s","action":"CREATE","config":{"name":"A1"}}' % STREAM.encode(),
        id="create-action-case",
    ),
    pytest.param(f"CONSUMER.CREATE.{STREAM}.A1", b'{"action": 1}', id="create-action-number"),
    # a stream config is decoded strictly: an unknown field is invalid JSON
    pytest.param("STREAM.CREATE.STRICT", b'{"name":"STRICT","bogus":1}', id="create-unknown-field"),
    # a number that does not fit its field is named as it was written
    pytest.param("STREAM.CREATE.NUM", b'{"name":"NUM","max_msgs":1e2}', id="create-number-exponent"),
    pytest.param("STREAM.CREATE.NUM", b'{"name":"NUM","max_msgs":1.50}', id="create-number-fraction"),
    pytest.param("STREAM.CREATE.NUM", b'{"name":"NUM","retention":1e0}', id="create-enum-number"),
    pytest.param(
        f"CONSUMER.CREATE.{STREAM}.N1",
        b'{"stream_name":"%s","config":{"name":"N1","ack_wait":2E9}}' % STREAM.encode(),
        id="consumer-number-exponent",
    ),
    # a later key wins, but an earlier one of the wrong type is still the error
    pytest.param("STREAM.CREATE.DUP", b'{"name":"DUP","max_msgs":"x","max_msgs":5}', id="create-dup-key"),
    # stream_name is required in a create body and checked before anything but the JSON (10056)
    pytest.param(
        f"CONSUMER.CREATE.{STREAM}.D4",
        b'{"config":{"name":"D4"}}',
        id="consumer-create-no-stream-name",
    ),
    # a create body is decoded strictly, before the stream name is compared (10025)
    pytest.param(f"CONSUMER.CREATE.{STREAM}.D5", b'{"bogus":1}', id="consumer-create-unknown-field"),
    # CONSUMER.INFO refuses any body but an empty object (10038) before looking anything up
    pytest.param(
        f"CONSUMER.INFO.{STREAM}.{CONSUMER}",
        b"null",
        id="consumer-info-with-body",
    ),
    # a pull request for a consumer (or stream) that does not exist: nobody answers but the
    # server's "no responders" status
    pytest.param(f"CONSUMER.MSG.NEXT.{STREAM}.NOSUCH", b"", id="next-unknown-consumer"),
    pytest.param("CONSUMER.MSG.NEXT.NOSUCH.C", b'{"batch":1}', id="next-unknown-stream"),
    # a malformed pull body: 400 with the decoder's error as the description (test_pull_json.py)
    pytest.param(f"CONSUMER.MSG.NEXT.{STREAM}.{CONSUMER}", b"{", id="next-malformed-json"),
    # a get naming no message, or a delete with an empty body, is refused (10003) before the
    # stream is looked up; a delete of sequence 0 is not (404 here, 10057 on a stream)
    pytest.param("STREAM.MSG.DELETE.NOSUCH", b'{"seq":0}', id="msg-delete-seq0-no-stream"),
    pytest.param(f"STREAM.MSG.DELETE.{STREAM}", b"null", id="msg-delete-null"),
    pytest.param("STREAM.MSG.GET.NOSUCH", b'{"seq":1,"batch":1}', id="msg-get-batch-no-stream"),
    pytest.param("STREAM.MSG.GET.NOSUCH", b'{"seq":1,"last_by_subj":"a"}', id="msg-get-seq-and-last"),
    pytest.param(
        "STREAM.MSG.GET.NOSUCH",
        b"",
        id="msg-get-empty-no-stream",
    ),
    pytest.param(
        "STREAM.MSG.DELETE.NOSUCH",
        b"{}",
        id="msg-delete-empty-no-stream",
    ),
]


@pytest.mark.parametrize(("subject", "body"), CORPUS)
async def test_bad_request_corpus(pair: dict[str, str], subject: str, body: bytes) -> None:
    """Each bad request gets the real server's answer (its code and err_code, its status, or its
    silence) and changes nothing."""
    before = await state(pair["jetlake"])
    answers = await both(pair, "$JS.API." + subject, body)
    assert answers["jetlake"] == answers["jetstream"]
    if refused(answers["jetlake"]):
        assert await state(pair["jetlake"]) == before
