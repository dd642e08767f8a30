"""Mirrors and sources across gateways in per-stream mode (#19, docs/perstream-status.md,
"Mirrors and sources"): two ``jetlake serve`` processes on one store root and one hub, each with
one of the origins S and T (R 2, placed one per gateway by ``two_gateways``). A mirror M of S and a
stream A sourcing S and T are created at the meta owner; placement keeps a stream with its local
origins, so the four become one group with one owner (one origin handed over), and the copies
follow their origins on that gateway. Publishes to S and T are sent again with ``Nats-Msg-Id``
until acknowledged, throughout. M and A converge to exactly their origins' messages (each once,
M's sequences S's), before and after ``kill -9`` of the group's owner, whose streams the other
gateway takes. What is checked is what clients see and what the Delta tables hold."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import nats
import pytest
from deltalake import DeltaTable
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StreamSource
from nats.js.errors import APIError

from storage_delta.commit.store import StoreRoot
from tests.differential import api
from tests.harness import ReferenceJetStream, s3_options, scrub, stop
from tests.test_perstream_serve import Spread, leaders, owner_index, stream_info, two_gateways
from tests.test_several_gateways import Publisher
from tests.test_stream_fence import s3_endpoint  # noqa: F401  (module fixture: a moto server)

pytestmark = [pytest.mark.slow, pytest.mark.alone]

GROUP = ["A", "M", "S", "T"]
#: Converging after the publishes: a handover or a takeover, and the copies' commits.
CONVERGE_S = 60.0


def stored_rows(root: StoreRoot, stream: str) -> list[tuple[int, str]]:
    """What the messages table holds for ``stream``: (seq, payload), in sequence order."""
    opts = dict(root.storage_options) if root.storage_options else None
    table = DeltaTable(root.table_uri("messages"), storage_options=opts).to_pyarrow_table(
        columns=["stream", "seq", "data"]
    )
    columns = table.to_pydict().values()
    return sorted((seq, data.decode()) for s, seq, data in zip(*columns, strict=True) if s == stream)


async def add_copy(js: JetStreamContext, name: str, **config: object) -> None:
    """Create a mirror or a sourcing stream (R 2), asked again while the meta owner has not heard
    the other gateway live yet (10005) or did not answer."""
    deadline = time.monotonic() + 30
    while True:
        try:
            await js.add_stream(name=name, num_replicas=2, **config)  # type: ignore[arg-type]
            return
        except APIError as exc:
            if exc.err_code != 10005 or time.monotonic() > deadline:
                raise
        except TimeoutError:
            assert time.monotonic() < deadline, f"{name} never created"
        await asyncio.sleep(0.1)


async def converged(t: Spread, published: dict[str, list[str]]) -> None:
    """Until M holds S's messages at S's sequences and A each of S's and T's once, as the tables
    hold them; then checked exactly (nothing twice, nothing missing)."""
    deadline = time.monotonic() + CONVERGE_S
    want_a = Counter(published["S"] + published["T"])
    while True:
        infos = {name: await stream_info(t.nc, name) for name in ("M", "A")}
        counts = {name: info["state"]["messages"] for name, info in infos.items()}
        want = {"M": len(published["S"]), "A": sum(want_a.values())}
        if counts == want:
            break
        assert all(counts[name] <= want[name] for name in want), f"copied twice: {counts}"
        assert time.monotonic() < deadline, f"never converged: {counts}, {infos}"
        await asyncio.sleep(0.2)
    # the copies follow their origins at the group's owner: found, and nothing left to copy
    for copy in [infos["M"]["mirror"], *infos["A"]["sources"]]:
        assert "error" not in copy, copy
        assert copy["lag"] == 0, copy
    origin = stored_rows(t.root, "S")
    assert [payload for _, payload in origin] == published["S"]
    assert stored_rows(t.root, "M") == origin  # a mirror's sequences are its origin's
    copied = Counter(payload for _, payload in stored_rows(t.root, "A"))
    assert copied == want_a, (copied - want_a, want_a - copied)


async def one_owner(t: Spread) -> str:
    """Once the group's four streams are answered by one gateway: that gateway."""
    deadline = time.monotonic() + CONVERGE_S
    while len(set((owners := await leaders(t.nc, GROUP)).values())) != 1 or len(owners) != len(GROUP):
        assert time.monotonic() < deadline, f"the group never came together: {owners}"
        await asyncio.sleep(0.1)
    return owners["A"]


def test_a_mirror_and_a_source_of_streams_on_two_gateways_converge_through_a_kill_9(tmp_path: Path) -> None:
    print("local root:", two_gateways(tmp_path, _copies_across_gateways))


def test_the_same_on_a_hub_cluster_and_on_s3(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """As above, the gateways leaves of two nodes of a 3-node hub cluster (the client on the
    third); then on an s3:// root (moto: claims and fences through delta-rs; a lease of 5 s, as
    ``test_perstream_serve``'s S3 case, for the same reason)."""
    print("hub cluster:", two_gateways(tmp_path / "cluster", _copies_across_gateways, cluster=True))
    root = StoreRoot("s3://lake/pssrc", s3_options(request.getfixturevalue("s3_endpoint")))
    scenario = partial(_copies_across_gateways, per_round=15)
    lease = {"JETLAKE_OWNER_LEASE_MS": "5000"}
    print("s3:", two_gateways(tmp_path / "s3", scenario, root=root, env=lease))


async def _copies_across_gateways(t: Spread, per_round: int = 40) -> str:
    js = t.js
    assert t.placed["S"] != t.placed["T"]  # the origins on different gateways
    pub = Publisher(js)
    published: dict[str, list[str]] = {"S": [], "T": []}

    async def publish(stream: str, start: int, n: int) -> None:
        for i in range(start, start + n):
            await pub.publish(f"{stream.lower()}.x", f"{stream}-{i}")
            published[stream].append(f"{stream}-{i}")

    async def both(start: int) -> None:
        await asyncio.gather(publish("S", start, per_round), publish("T", start, per_round))

    await both(0)
    # created at the meta owner while S and T live on different gateways, publishes going on
    publishing = asyncio.create_task(both(per_round))
    await add_copy(js, "M", mirror=StreamSource(name="S"))
    await add_copy(js, "A", sources=[StreamSource(name="S"), StreamSource(name="T")])
    await publishing
    owner = await one_owner(t)
    await converged(t, published)

    # kill -9 of the group's owner while publishing: the survivor takes all four
    kill = partial(stop, t.procs[owner_index(t, owner)], signal.SIGKILL)
    publishing = asyncio.create_task(both(2 * per_round))
    await asyncio.sleep(0.2)
    await asyncio.to_thread(kill)
    killed_at = time.monotonic()
    await publishing
    published_at = time.monotonic()
    survivor = await one_owner(t)
    assert survivor != owner
    await converged(t, published)
    assert pub.errors == []
    complete = time.monotonic() - published_at
    return (
        f"after the kill -9 of the group's owner the last publish was acknowledged in"
        f" {published_at - killed_at:.2f} s, M and A were complete {complete:.2f} s later"
    )


def test_a_copys_checks_of_an_origin_on_the_other_gateway_answer_as_the_real_server(tmp_path: Path) -> None:
    """The create-time checks of a mirror's or a source's origin (its max message size, its
    direct gets, the cycle check) made by the meta owner, which answers creates, of an origin the
    other gateway serves (its config gathered), against a real server holding the same streams."""
    reference = ReferenceJetStream(tmp_path / "reference")
    reference.start()
    try:
        lake, real = two_gateways(tmp_path / "lake", partial(_checks_of_an_origin_elsewhere, reference.url))
    finally:
        reference.stop()
    assert lake == real
    assert [answer["err_code"] for answer in real[1:3]] == [10030, 10046]
    assert real[4]["description"] == "detected cycle"
    assert real[5] == [None, True]


async def _checks_of_an_origin_elsewhere(reference_url: str, t: Spread) -> tuple[Any, Any]:
    # the first gateway started holds the store lease (the meta owner, which answers creates)
    assert "owner of the store" in t.logs[0].read_text()
    assert "owner of the store" not in t.logs[1].read_text()
    origin = next(stream for stream, gateway in t.placed.items() if owner_index(t, gateway) == 1)
    real = await nats.connect(reference_url)
    try:
        for stream in ("S", "T"):  # as two_gateways made them, of R 1 (a single server's only)
            config = {"name": stream, "subjects": [f"{stream.lower()}.>"], "duplicate_window": 120 * 10**9}
            assert "error" not in await api(real, f"STREAM.CREATE.{stream}", config)
        real_answers = scrub(await _origin_checks(real, origin, replicas=1))
    finally:
        await real.close()
    lake_answers = scrub(await _origin_checks(t.nc, origin, replicas=2))
    return lake_answers, real_answers


async def _origin_checks(nc: Client, origin: str, replicas: int) -> list[Any]:
    """The origin updated (max message size 100, direct gets) then, created: a mirror and a
    source whose max message size is smaller (refused), the origin updated to source X and X
    sourcing the origin (a cycle), a mirror accepted (its ``mirror_direct`` the origin's)."""
    base = {
        "name": origin,
        "subjects": [f"{origin.lower()}.>"],
        "duplicate_window": 120 * 10**9,
        "num_replicas": replicas,
        "max_msg_size": 100,
        "allow_direct": True,
    }

    async def error(subject: str, body: dict[str, Any]) -> Any:
        return (await api(nc, subject, body)).get("error")

    out = [await error(f"STREAM.UPDATE.{origin}", base)]
    out.append(await error("STREAM.CREATE.M", {"name": "M", "mirror": {"name": origin}, "max_msg_size": 10}))
    out.append(
        await error("STREAM.CREATE.A", {"name": "A", "sources": [{"name": origin}], "max_msg_size": 10})
    )
    out.append(await error(f"STREAM.UPDATE.{origin}", {**base, "sources": [{"name": "X"}]}))
    cycle = {"name": "X", "subjects": ["x.>"], "sources": [{"name": origin}]}
    out.append(await error("STREAM.CREATE.X", cycle))
    mirror = await api(nc, "STREAM.CREATE.M", {"name": "M", "mirror": {"name": origin}})
    out.append([mirror.get("error"), mirror.get("config", {}).get("mirror_direct")])
    return out
