"""Account-wide answers of two gateways whose streams are spread over both, compared with a real
clustered JetStream (issue #19; docs/perstream-status.md, "Open points").

The same client case runs against two nats-servers with JetStream joined by routes and against two
``jetlake serve`` processes on one store root (the first the meta owner): five streams of
``num_replicas`` 2 with different subjects and a ``max_bytes`` (on jetlake spread over both
gateways, by their info's ``cluster.leader``), three durable consumers, some messages each, an
ack, a purge; then ``STREAM.NAMES`` and ``STREAM.LIST`` (plain, with a ``subject`` filter some
streams collide with, with an ``offset``, with a filter none matches, past the end),
``$JS.API.INFO``, ``CONSUMER.NAMES``/``LIST`` of a stream of the other gateway, a create whose
subjects overlap that stream's (400/10065), creates of existing names with another config
(10058) on each gateway, a delete of the other gateway's stream, then NAMES, LIST and INFO again.
Every answer is compared whole, except what differs by design:

* ``cluster``: names and RAFT fields are a JetStream cluster's own (jetlake's are the gateways,
  docs/architecture.md); how many replicas a stream's ``cluster`` lists is compared; consumer
  info has no ``cluster`` in jetlake (docs/compatibility.md, consumer ``num_replicas``);
* ``domain``: jetlake is reached as a JetStream domain (``jetlake``), the oracle has none;
* times (``created``, ``ts``, ``first_ts``, ``last_ts``), as in every differential test;
* ``$JS.API.INFO`` ``storage``: a cluster counts every replica's bytes (R 2: twice the streams'
  bytes, summed from the other servers' usage updates as they come); jetlake's store is the one
  copy, so its ``storage`` is checked to be the sum of the listed streams' ``bytes``, which are
  compared with the cluster's;
* ``$JS.API.INFO`` ``api`` counts: a cluster sums its servers' counts from usage updates sent at
  most every 250 ms, and the two runs ask different numbers of requests before the spread (the
  retries while a cluster elects its leader or the meta owner has not heard the other gateway);
  jetlake's are checked to count, between the two INFO requests, every request of the account,
  whichever gateway answered it;
* a page past the end (``offset`` 7 of 5 streams): a clustered server answers NAMES with
  ``streams`` ``[]`` where a single server answers ``null``, and LIST with ``total`` 0 where a
  single server counts the streams (its clustered LIST returns before it sets the total when the
  page is empty); jetlake answers as the single server does, which
  ``tests/test_streams_api.py::test_stream_list_and_names`` holds it to, so these two are
  checked to be the single server's answers.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from tests.harness import scrub
from tests.test_perstream_serve import leaders
from tests.test_replicas import JetStreamCluster, connected, request, two_gateways, until_ok
from tests.test_several_gateways import Publisher

pytestmark = [pytest.mark.slow]

#: The streams: their subjects and how many messages each gets.
STREAMS: dict[str, tuple[list[str], int]] = {
    "AUDIT": (["audit.>"], 4),
    "LOGS": (["logs.*.x"], 1),
    "ORDERS": (["orders.>"], 3),
    "PAY": (["pay.*"], 5),
    "SHIP": (["ship.a", "ship.b"], 2),
}
#: A filter some streams' subjects collide with and one's do not (``logs.*.x``).
FILTER = "*.a"

#: Given a client once the streams exist: a stream on the meta owner's gateway and one on the
#: other gateway (on jetlake once they are spread; the oracle is given jetlake's choice).
Placed = Callable[[Client], Awaitable[tuple[str, str]]]


async def _case(nc: Client, placed: Placed) -> dict[str, Any]:
    """The requests, in order, and their answers by what they ask."""
    for name, (subjects, _) in STREAMS.items():
        created = await until_ok(
            nc,
            f"STREAM.CREATE.{name}",
            {"name": name, "subjects": subjects, "num_replicas": 2, "max_bytes": 1 << 20},
        )
        assert "error" not in created, created
    local, remote = await placed(nc)
    out: dict[str, Any] = {}
    for stream, durable in ((remote, "C1"), (remote, "C2"), (local, "C1")):
        config = {"durable_name": durable, "ack_policy": "explicit"}
        out[f"create {stream} {durable}"] = await request(
            nc, f"CONSUMER.CREATE.{stream}.{durable}", {"stream_name": stream, "config": config}
        )
    js = nc.jetstream()
    pub = Publisher(js)
    for name, (subjects, count) in STREAMS.items():
        subject = subjects[0].replace("*", "k").replace(">", "k")
        for i in range(count):
            await pub.publish(subject, f"{name}-{i}")
    assert pub.errors == []
    sub = await js.pull_subscribe_bind("C1", stream=remote)
    (first,) = await sub.fetch(1, timeout=5)
    await first.ack_sync()
    out["purge"] = await request(nc, f"STREAM.PURGE.{local}", {"keep": 2})
    for label, body in (
        ("", None),
        (" subject", {"subject": FILTER}),
        (" offset", {"offset": 2}),
        (" no match", {"subject": "none.>"}),
        (" past the end", {"offset": 7}),
    ):
        out["names" + label] = await request(nc, "STREAM.NAMES", body)
        out["list" + label] = await request(nc, "STREAM.LIST", body)
    out["info"] = await request(nc, "INFO", None)
    out["consumer names"] = await request(nc, f"CONSUMER.NAMES.{remote}", None)
    out["consumer list"] = await request(nc, f"CONSUMER.LIST.{remote}", None)
    overlap = {"name": "OVER", "subjects": [STREAMS[remote][0][0]], "num_replicas": 2}
    out["overlap"] = await request(nc, "STREAM.CREATE.OVER", overlap)
    for name in (remote, local):
        again = {"name": name, "subjects": ["other"], "num_replicas": 2}
        out[f"again {name}"] = await request(nc, f"STREAM.CREATE.{name}", again)
    out["delete"] = await request(nc, f"STREAM.DELETE.{remote}", None)
    out["names after"] = await request(nc, "STREAM.NAMES", None)
    out["list after"] = await request(nc, "STREAM.LIST", None)
    out["info after"] = await request(nc, "INFO", None)
    return out


#: Pages past the end, where a clustered server's answers differ from a single server's
#: (module docstring).
PAST_THE_END = {"names past the end", "list past the end"}

#: The requests ``_case`` asks from the first INFO (itself included) to the last (not included),
#: and how many of them get an error (the overlap and the two creates of existing names).
BETWEEN_INFOS = (9, 3)


def spread_over(owners: tuple[str, str]) -> Placed:
    """Waits until every stream is served and both gateways serve some, none more than its share
    (the placement's bound: nothing moves after that), then picks a stream of each."""

    async def placed(nc: Client) -> tuple[str, str]:
        deadline = time.monotonic() + 30
        share = -(-len(STREAMS) // 2)
        while True:
            found = await leaders(nc, list(STREAMS))
            loads = [sum(1 for g in found.values() if g == o) for o in owners]
            if len(found) == len(STREAMS) and min(loads) > 0 and max(loads) <= share:
                break
            assert time.monotonic() < deadline, f"never spread: {found}"
            await asyncio.sleep(0.2)
        local, remote = (min(s for s, g in found.items() if g == o) for o in owners)
        return local, remote

    return placed


def given(local: str, remote: str) -> Placed:
    """The oracle: once every stream has a leader, the streams jetlake's spread chose."""

    async def placed(nc: Client) -> tuple[str, str]:
        for name in STREAMS:
            info = await until_ok(nc, f"STREAM.INFO.{name}", None)
            assert info["cluster"]["leader"], info
        return local, remote

    return placed


def comparable(answer: Any, domain: str | None) -> Any:
    """``answer`` without what differs by design (module docstring): each ``cluster`` reduced to
    how many replicas it lists, ``domain`` left out (where given, checked to be ``domain``),
    times left out; INFO's ``storage`` and ``api`` counts are compared apart."""
    if isinstance(answer, list):
        return [comparable(v, domain) for v in answer]
    if not isinstance(answer, dict):
        return answer
    out = dict(answer)
    assert out.pop("domain", domain) == domain
    if "delivered" in out:  # a consumer's info: jetlake shows no ``cluster`` (docs/compatibility.md)
        out.pop("cluster", None)
    elif isinstance(out.get("cluster"), dict):
        out["replicas listed"] = len(out.pop("cluster").get("replicas") or [])
    if out.get("type") == "io.nats.jetstream.api.v1.account_info_response":
        del out["storage"]
        out["api"] = {"level": out["api"]["level"]}
    return scrub({k: comparable(v, domain) for k, v in out.items()})


def test_account_wide_answers_of_two_gateways_match_a_clustered_jetstream(tmp_path: Path) -> None:
    with two_gateways(tmp_path) as (gw, peer):
        assert gw.gateway is not None
        host = socket.gethostname()
        owners = (f"jetlake-{host}-{gw.gateway.pid}", f"jetlake-{host}-{peer.proc.pid}")
        got, (local, remote) = asyncio.run(_on_jetlake(gw.url, owners))
    oracle = JetStreamCluster(tmp_path / "oracle", 2)
    oracle.start()
    try:
        expected = asyncio.run(_on(oracle.url, given(local, remote)))
    finally:
        oracle.stop()
    # the case is the one meant: streams listed, counted, filtered, paged, refused as intended
    assert expected["names"]["streams"] == sorted(STREAMS)
    assert expected["names subject"]["streams"] == ["AUDIT", "ORDERS", "PAY", "SHIP"]
    assert [s["config"]["name"] for s in expected["list offset"]["streams"]] == sorted(STREAMS)[2:]
    assert expected["overlap"]["error"]["err_code"] == 10065
    assert [expected[f"again {n}"]["error"]["err_code"] for n in (remote, local)] == [10058, 10058]
    assert expected["names after"]["streams"] == sorted(set(STREAMS) - {remote})
    assert expected["consumer names"]["consumers"] == ["C1", "C2"]
    infos = (expected["info"], expected["info after"])
    assert [(i["streams"], i["consumers"]) for i in infos] == [(5, 3), (4, 1)]
    assert [i["reserved_storage"] for i in infos] == [5 << 20, 4 << 20]
    # when listed, jetlake's streams were served by both gateways: the meta owner and the other
    served = {s["config"]["name"]: s["cluster"]["leader"] for s in got["list"]["streams"]}
    assert set(served.values()) == set(owners)
    assert (served[local], served[remote]) == owners
    for key in expected.keys() - PAST_THE_END:
        assert comparable(got[key], "jetlake") == comparable(expected[key], None), key
    # a page past the end: the cluster's quirks, jetlake's answer that of a single server
    for key, clustered, single in (
        ("names past the end", ([], 5), (None, 5)),
        ("list past the end", ([], 0), ([], 5)),
    ):
        assert (expected[key]["streams"], expected[key]["total"]) == clustered, expected[key]
        assert (got[key]["streams"], got[key]["total"]) == single, got[key]
    # jetlake's storage: the one copy of what the streams hold, as listed
    for info, listed in (("info", "list"), ("info after", "list after")):
        held = sum(s["state"]["bytes"] for s in got[listed]["streams"])
        assert got[info]["storage"] == held > 0, info
    # jetlake's API counts are the account's: both gateways' answers are counted
    before, after = got["info"]["api"], got["info after"]["api"]
    assert (after["total"] - before["total"], after["errors"] - before["errors"]) == BETWEEN_INFOS


async def _on(url: str, placed: Placed) -> dict[str, Any]:
    async with connected(url) as nc:
        return await _case(nc, placed)


async def _on_jetlake(url: str, owners: tuple[str, str]) -> tuple[dict[str, Any], tuple[str, str]]:
    """The case on jetlake, and the streams its spread chose (for the oracle)."""
    chosen: list[tuple[str, str]] = []
    spread = spread_over(owners)

    async def placed(nc: Client) -> tuple[str, str]:
        chosen.append(await spread(nc))
        return chosen[0]

    return await _on(url, placed), chosen[0]
