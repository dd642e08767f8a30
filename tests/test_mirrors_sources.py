"""Mirrors and stream sources of a stream on the same server, on the real JetStream and on jetlake:
the configs both accept or refuse, what a mirror and a sourcing stream hold once caught up (history,
gaps, times, then live messages), their stream info, consumers on a mirror, and, on jetlake alone,
no gap and no duplicate after a ``kill -9`` in the middle of copying.

A copy's ``Nats-Stream-Source`` ends with its origin's identity, a hash of the origin's creation
time: each server's is checked against that server's origin (``created`` in its info)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from pyspark.sql import SparkSession

from gateway.api.stream_config import server_hash
from gateway.api.timefmt import rfc3339
from tests.differential import api, assert_same
from tests.harness import Jetlake, linked_core
from tests.test_stream_config import fill

CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("mirror", {"mirror": {"name": "{n}O"}}),
    ("mirror_zero_fields", {"mirror": {"name": "{n}O", "opt_start_seq": 0, "filter_subject": ""}}),
    ("mirror_start_seq", {"mirror": {"name": "{n}O", "opt_start_seq": 3}}),
    ("mirror_filter", {"mirror": {"name": "{n}O", "filter_subject": "{p}.a"}}),
    ("mirror_bad_name", {"mirror": {"name": "a.b"}}),
    ("mirror_empty_name", {"mirror": {"name": ""}}),
    ("mirror_with_subjects", {"mirror": {"name": "{n}O"}, "subjects": ["{p}.m"]}),
    ("mirror_with_sources", {"mirror": {"name": "{n}O"}, "sources": [{"name": "{n}O"}]}),
    ("mirror_counter", {"mirror": {"name": "{n}O"}, "allow_msg_counter": True}),
    ("mirror_schedules", {"mirror": {"name": "{n}O"}, "allow_msg_schedules": True}),
    ("mirror_batched", {"mirror": {"name": "{n}O"}, "allow_batched": True}),
    (
        "mirror_filter_and_transforms",
        {
            "mirror": {
                "name": "{n}O",
                "filter_subject": "{p}.a",
                "subject_transforms": [{"src": "{p}.b", "dest": "x"}],
            }
        },
    ),
    (
        "mirror_transform_bad_source",
        {"mirror": {"name": "{n}O", "subject_transforms": [{"src": "{p}..b", "dest": "x"}]}},
    ),
    (
        "mirror_transform_bad_dest",
        {"mirror": {"name": "{n}O", "subject_transforms": [{"src": "{p}.*", "dest": "x.$2"}]}},
    ),
    (
        "mirror_transforms_overlap",
        {
            "mirror": {
                "name": "{n}O",
                "subject_transforms": [{"src": "{p}.*", "dest": "x.$1"}, {"src": "{p}.a", "dest": "y"}],
            }
        },
    ),
    ("mirror_max_msg_size_smaller", {"mirror": {"name": "{n}O"}, "max_msg_size": 10}),
    ("mirror_of_missing", {"mirror": {"name": "{n}NOPE"}}),
    ("sources", {"subjects": ["{p}.s"], "sources": [{"name": "{n}O"}, {"name": "{n}O2"}]}),
    ("sources_no_subjects", {"sources": [{"name": "{n}O"}]}),
    ("sources_duplicate", {"sources": [{"name": "{n}O"}, {"name": "{n}O"}]}),
    (
        "sources_same_origin_other_filters",
        {
            "sources": [
                {"name": "{n}O", "filter_subject": "{p}.a"},
                {"name": "{n}O", "filter_subject": "{p}.b"},
            ]
        },
    ),
    ("sources_bad_name", {"sources": [{"name": "a b"}]}),
    (
        "sources_filter_and_transforms",
        {
            "sources": [
                {
                    "name": "{n}O",
                    "filter_subject": "{p}.a",
                    "subject_transforms": [{"src": "{p}.b", "dest": "x"}],
                }
            ]
        },
    ),
    (
        "sources_transform_bad_source",
        {"sources": [{"name": "{n}O", "subject_transforms": [{"src": "{p} b", "dest": "x"}]}]},
    ),
    (
        "sources_transform_bad_dest",
        {"sources": [{"name": "{n}O", "subject_transforms": [{"src": "{p}.*", "dest": "{{x(1)}}"}]}]},
    ),
    (
        "sources_transforms_overlap",
        {
            "sources": [
                {
                    "name": "{n}O",
                    "subject_transforms": [{"src": "{p}.>", "dest": "x.>"}, {"src": "{p}.a", "dest": "y"}],
                }
            ]
        },
    ),
    ("sources_max_msg_size_smaller", {"sources": [{"name": "{n}O"}], "max_msg_size": 10}),
]


async def _origins(nc: Client, name: str, p: str, max_msg_size: int = -1) -> None:
    """Two origin streams: ``{name}O`` on ``{p}.>`` and ``{name}O2`` on ``{p}2.>``."""
    for suffix, subject in (("O", f"{p}.>"), ("O2", f"{p}2.>")):
        created = await api(
            nc,
            f"STREAM.CREATE.{name}{suffix}",
            {"name": f"{name}{suffix}", "subjects": [subject], "max_msg_size": max_msg_size},
        )
        assert "error" not in created, created


def _comparable(info: dict[str, Any]) -> dict[str, Any]:
    """A create answer with ``active`` reduced to whether the copy has heard from its origin, and
    the sources in a fixed order (the server lists them from a map, in any order)."""
    for part in [info.get("mirror"), *(info.get("sources") or [])]:
        if part:
            part["active"] = part["active"] >= 0
    if info.get("sources"):
        info["sources"] = sorted(info["sources"], key=lambda s: json.dumps(s, sort_keys=True))
    return info


@pytest.mark.parametrize(("label", "extra"), CONFIGS, ids=[c[0] for c in CONFIGS])
async def test_mirror_and_source_configs(
    targets: dict[str, str], unique: str, label: str, extra: dict[str, Any]
) -> None:
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        await _origins(nc, name, p, max_msg_size=100)
        created = await api(nc, f"STREAM.CREATE.{name}", fill({"name": name, **extra}, name, p))
        if "error" not in created:
            await api(nc, f"STREAM.DELETE.{name}")  # no copying across the next cases
        return _comparable(created)

    await assert_same(targets, case, unique)


async def _caught_up(nc: Client, name: str, last_seq: int, messages: int) -> dict[str, Any]:
    """The stream's info once it holds ``messages`` up to ``last_seq`` (30 s at most: the real
    server makes a source's consumer again some seconds after an update)."""
    info: dict[str, Any] = {}
    for _ in range(600):
        info = await api(nc, f"STREAM.INFO.{name}")
        state = info["state"]
        if state["last_seq"] >= last_seq and state["messages"] >= messages:
            return info
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name} never caught up: {info}")


async def _stored(nc: Client, name: str, last_seq: int) -> list[Any]:
    out = []
    for seq in range(1, last_seq + 1):
        got = await api(nc, f"STREAM.MSG.GET.{name}", {"seq": seq})
        m = got.get("message")
        if m is None:
            out.append([seq, got["error"]["err_code"]])
            continue
        hdrs = base64.b64decode(m["hdrs"]).decode() if m.get("hdrs") else ""
        out.append([seq, m["subject"], hdrs, m.get("data", ""), m["time"]])
    return out


async def test_a_mirror_copies_history_with_gaps_then_live(targets: dict[str, str], unique: str) -> None:
    """Sequences, gaps and headers are the origin's; new messages follow with the origin's times; a
    consumer on the mirror gets them all; the mirror's info names its origin. (jetlake stores the
    history it copies at creation with the mirror's creation time, docs/compatibility.md.)"""
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        await _origins(nc, name, p)
        js = nc.jetstream()
        for i in range(1, 7):
            await js.publish(f"{p}.{'ab'[i % 2]}", f"m{i}".encode(), headers={"I": str(i)} if i % 3 else None)
        for seq in (2, 5):
            await api(nc, f"STREAM.MSG.DELETE.{name}O", {"seq": seq})
        created = await api(nc, f"STREAM.CREATE.{name}", {"name": name, "mirror": {"name": f"{name}O"}})
        assert "error" not in created, created
        history = await _caught_up(nc, name, 6, 4)
        await js.publish(f"{p}.a", b"live")
        live = await _caught_up(nc, name, 7, 5)
        origin = await _stored(nc, f"{name}O", 7)
        mirrored = await _stored(nc, name, 7)
        assert [row[:4] for row in mirrored] == [row[:4] for row in origin]
        assert mirrored[-1] == origin[-1]  # a live copy has its origin's time (history: see below)
        sub = await js.pull_subscribe("", durable="C", stream=name)
        got = [(m.metadata.sequence.stream, m.data) for m in await sub.fetch(10, timeout=2)]
        return [
            _comparable(history)["state"],
            _comparable(live)["mirror"],
            live["state"],
            [row[:4] for row in mirrored],
            got,
        ]

    await assert_same(targets, case, unique)


async def test_mirror_start_seq_filter_and_transforms(targets: dict[str, str], unique: str) -> None:
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        await _origins(nc, name, p)
        js = nc.jetstream()
        for i in range(1, 9):
            await js.publish(f"{p}.{'abc'[i % 3]}", f"m{i}".encode())
        await api(
            nc,
            f"STREAM.CREATE.{name}S",
            {"name": f"{name}S", "mirror": {"name": f"{name}O", "opt_start_seq": 4}},
        )
        await api(
            nc,
            f"STREAM.CREATE.{name}F",
            {"name": f"{name}F", "mirror": {"name": f"{name}O", "filter_subject": f"{p}.a"}},
        )
        transforms = [{"src": f"{p}.b", "dest": f"{p}x.b"}, {"src": f"{p}.c", "dest": f"{p}y.c"}]
        await api(
            nc,
            f"STREAM.CREATE.{name}T",
            {"name": f"{name}T", "mirror": {"name": f"{name}O", "subject_transforms": transforms}},
        )
        out = []
        for suffix, last, count in (("S", 8, 5), ("F", 6, 2), ("T", 8, 6)):
            info = await _caught_up(nc, f"{name}{suffix}", last, count)
            rows = await _stored(nc, f"{name}{suffix}", last)
            out.append([info["state"], [r[:4] for r in rows]])
        return out

    await assert_same(targets, case, unique)


async def test_sources_aggregate_origins_with_their_header(targets: dict[str, str], unique: str) -> None:
    """Each origin's order kept, filters and transforms applied, ``Nats-Stream-Source`` as the
    server writes it (its identity: the hash of that server's origin creation time), and the
    sources' info with their positions."""
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        await _origins(nc, name, p)
        js = nc.jetstream()
        for i in range(1, 5):
            await js.publish(f"{p}.{'ab'[i % 2]}", f"o{i}".encode())
            await js.publish(
                f"{p}2.{i}", f"t{i}".encode(), headers={"X": "y", "Nats-Expected-Stream": f"{name}O2"}
            )
        sources = [
            {"name": f"{name}O", "filter_subject": f"{p}.a"},
            {"name": f"{name}O2", "subject_transforms": [{"src": f"{p}2.*", "dest": f"{p}t.$1"}]},
        ]
        created = await api(
            nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{p}own"], "sources": sources}
        )
        assert "error" not in created, created
        info = await _caught_up(nc, name, 6, 6)
        identities = {
            o: server_hash(rfc3339(_ns((await api(nc, f"STREAM.INFO.{name}{o}"))["created"])))
            for o in ("O", "O2")
        }
        rows = await _stored(nc, name, 6)
        by_origin: dict[str, list[Any]] = {}
        for _seq, subject, hdrs, data, _time in rows:
            source = next(line for line in hdrs.split("\r\n") if line.startswith("Nats-Stream-Source: "))
            words = source.split(" ")
            origin = words[1].removeprefix(name)
            assert words[-1] == identities[origin], (words, identities)
            by_origin.setdefault(origin, []).append([subject, hdrs.replace(words[-1], "<identity>"), data])
        await js.publish(f"{p}own", b"own")
        await js.publish(f"{p}.a", b"live")
        after = await _caught_up(nc, name, 8, 8)
        return [
            sorted(s["name"] for s in _comparable(info)["sources"]),
            by_origin,
            after["state"],
            sorted((s["name"], s.get("seq"), s["lag"]) for s in after["sources"]),
        ]

    await assert_same(targets, case, unique)


def _ns(text: str) -> int:
    """An RFC 3339 time with nanoseconds as Unix nanoseconds."""
    from gateway.api.consumer_config import parse_time_ns

    return parse_time_ns(text)


@pytest.mark.slow
def test_copies_resume_after_kill_without_gap_or_duplicate(own_jetlake: Jetlake) -> None:
    """``kill -9`` while a mirror and a source copy 3,000 messages: after the restart both hold
    every origin message exactly once (the mirror under the origin's sequences, the source with
    each origin sequence in one ``Nats-Stream-Source`` header)."""
    total = 3000

    async def fill_and_start(url: str) -> None:
        async with await nats.connect(url) as nc:
            await api(nc, "STREAM.CREATE.K", {"name": "K", "subjects": ["k.>"]})
            js = nc.jetstream()
            for i in range(0, total, 100):
                await asyncio.gather(*(js.publish(f"k.{j % 7}", str(j).encode()) for j in range(i, i + 100)))
            await api(nc, "STREAM.CREATE.KM", {"name": "KM", "mirror": {"name": "K"}})
            await api(nc, "STREAM.CREATE.KS", {"name": "KS", "subjects": ["ks"], "sources": [{"name": "K"}]})
            # Kill once both are partway and have committed copies: a follower accepts its next
            # batch (256) only after the commit of the one before.
            for _ in range(500):
                km = (await api(nc, "STREAM.INFO.KM"))["state"]["messages"]
                ks = (await api(nc, "STREAM.INFO.KS"))["state"]["messages"]
                if km > 256 and ks > 256:
                    print(f"killed with {km} mirrored and {ks} sourced of {total}")
                    return
                await asyncio.sleep(0.01)

    async def check(url: str) -> tuple[int, int, list[int]]:
        async with await nats.connect(url) as nc:
            km = await _caught_up(nc, "KM", total, total)
            first = await api(
                nc, "STREAM.MSG.GET.KM", {"seq": 1}
            )  # from the lake: the restart's cache is cold
            assert base64.b64decode(first["message"]["data"]) == b"0", first
            ks = await _caught_up(nc, "KS", total, total)
            js = nc.jetstream()
            sub = await js.pull_subscribe("", durable="R", stream="KS")
            origin_seqs: list[int] = []
            while len(origin_seqs) < ks["state"]["messages"]:
                for m in await sub.fetch(500, timeout=5):
                    origin_seqs.append(int((m.headers or {})["Nats-Stream-Source"].split(" ")[1]))
                    await m.ack()
            return km["state"]["messages"], km["state"]["last_seq"], origin_seqs

    asyncio.run(fill_and_start(own_jetlake.url))
    own_jetlake.kill_gateway()
    own_jetlake.start_gateway()
    mirrored, last, origin_seqs = asyncio.run(check(own_jetlake.url))
    assert (mirrored, last) == (total, total)
    assert sorted(origin_seqs) == list(range(1, total + 1))  # each once: no gap, no duplicate
    assert origin_seqs == sorted(origin_seqs)  # in the origin's order


@pytest.fixture(scope="module")
def external(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], str, Jetlake]]:
    """``harness.linked_core``: the targets, the core's client URL and the jetlake (a test may kill
    its gateway)."""
    with linked_core(tmp_path_factory.mktemp("external")) as (reference, lake, core):
        yield {"jetstream": reference.url, "jetlake": lake.url}, core.url, lake


async def test_a_mirror_and_a_source_of_a_real_jetstream_in_another_domain(
    external: tuple[dict[str, str], str, Jetlake], unique: str
) -> None:
    """The origin lives on a real JetStream (domain ``core``); the mirror and the source reach it
    through ``external.api`` over the leaf links: history with a gap, then live messages; the
    copies are the origin's (a source's header carries the origin's identity as the core sends it)."""
    targets, core_url, _ = external
    p = unique.lower()
    ext = {"api": "$JS.core.API"}
    async with await nats.connect(core_url) as core:
        assert "error" not in await api(
            core, f"STREAM.CREATE.{unique}", {"name": unique, "subjects": [f"{p}.>"]}
        )
        js = core.jetstream()
        for i in range(1, 6):
            await js.publish(f"{p}.{i % 2}", f"m{i}".encode(), headers={"I": str(i)})
        await api(core, f"STREAM.MSG.DELETE.{unique}", {"seq": 2})

        async def case(nc: Client, name: str) -> Any:
            made = [
                await api(
                    nc,
                    f"STREAM.CREATE.{name}M",
                    {"name": f"{name}M", "mirror": {"name": name, "external": ext}},
                ),
                await api(
                    nc,
                    f"STREAM.CREATE.{name}S",
                    {
                        "name": f"{name}S",
                        "subjects": [f"{p}own"],
                        "sources": [{"name": name, "external": ext}],
                    },
                ),
            ]
            await _caught_up(nc, f"{name}M", 5, 4)
            await _caught_up(nc, f"{name}S", 4, 4)
            return [
                [_comparable(m) for m in made],
                [row[:4] for row in await _stored(nc, f"{name}M", 5)],
                [row[1:4] for row in await _stored(nc, f"{name}S", 4)],
            ]

        first = await assert_same(targets, case, unique)
        await js.publish(f"{p}.live", b"live")

        async def live(nc: Client, name: str) -> Any:
            mirror = await _caught_up(nc, f"{name}M", 6, 5)
            source = await _caught_up(nc, f"{name}S", 5, 5)
            return [mirror["state"], source["state"], [row[1:4] for row in await _stored(nc, f"{name}S", 5)]]

        await assert_same(targets, live, unique)
    assert first[1][0][1] == f"{p}.1"


@pytest.mark.waits  # the copies' one-second TTLs run out
async def test_copies_keep_their_ttl_only_where_the_stream_allows_it(
    targets: dict[str, str], unique: str
) -> None:
    """ADR-43: a mirror and a source store a message with ``Nats-TTL`` whatever their
    ``allow_msg_ttl``; with it, the copy expires as the origin's message does, without it the copy
    stays."""
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        await api(
            nc, f"STREAM.CREATE.{name}O", {"name": f"{name}O", "subjects": [f"{p}.>"], "allow_msg_ttl": True}
        )
        copies: dict[str, dict[str, Any]] = {
            "MT": {"mirror": {"name": f"{name}O"}, "allow_msg_ttl": True},
            "M": {"mirror": {"name": f"{name}O"}},
            "ST": {"sources": [{"name": f"{name}O"}], "allow_msg_ttl": True},
            "S": {"sources": [{"name": f"{name}O"}]},
        }
        for suffix, cfg in copies.items():
            assert "error" not in await api(
                nc, f"STREAM.CREATE.{name}{suffix}", {"name": f"{name}{suffix}", **cfg}
            )
        js = nc.jetstream()
        await js.publish(f"{p}.short", b"short", headers={"Nats-TTL": "1s"})
        await js.publish(f"{p}.kept", b"kept")
        for suffix in copies:
            await _caught_up(nc, f"{name}{suffix}", 2, 2)
        await asyncio.sleep(2.5)
        return {
            suffix: (await api(nc, f"STREAM.INFO.{name}{suffix}"))["state"]["messages"]
            for suffix in ("O", *copies)
        }

    out = await assert_same(targets, case, unique)
    assert out == {"O": 1, "MT": 1, "M": 2, "ST": 1, "S": 2}


@pytest.mark.spark
async def test_spark_reads_a_mirror_and_a_sourcing_stream_as_any_stream(
    spark: SparkSession, jetlake: Jetlake, unique: str, tmp_path: Path
) -> None:
    """A mirror and a sourcing stream are ordinary jetlake tables: Spark's logical view of each is
    what their consumers get (the mirror's gaps included, the source's header as a map entry), in
    a batch read and in a structured streaming query."""
    p = unique.lower()
    async with await nats.connect(jetlake.url) as nc:
        await api(nc, f"STREAM.CREATE.{unique}O", {"name": f"{unique}O", "subjects": [f"{p}.>"]})
        js = nc.jetstream()
        for i in range(1, 9):
            await js.publish(f"{p}.{i % 3}", f"m{i}".encode())
        await api(nc, f"STREAM.MSG.DELETE.{unique}O", {"seq": 4})
        await api(nc, f"STREAM.CREATE.{unique}M", {"name": f"{unique}M", "mirror": {"name": f"{unique}O"}})
        await api(
            nc,
            f"STREAM.CREATE.{unique}S",
            {
                "name": f"{unique}S",
                "subjects": [f"{p}own"],
                "sources": [{"name": f"{unique}O", "filter_subject": f"{p}.1"}],
            },
        )
        await _caught_up(nc, f"{unique}M", 8, 7)
        await _caught_up(nc, f"{unique}S", 2, 2)

    def read(stream: str) -> list[Any]:
        df = (
            spark.read.format("jetlake")
            .option("root", str(jetlake.data_root))
            .option("stream", stream)
            .load()
        )
        return [
            (r.seq, r.subject, bytes(r.data).decode(), (r.headers or {}).get("Nats-Stream-Source"))
            for r in df.orderBy("seq").collect()
        ]

    def streamed(stream: str) -> list[int]:
        query = (
            spark.readStream.format("jetlake")
            .option("root", str(jetlake.data_root))
            .option("stream", stream)
            .load()
            .writeStream.format("memory")
            .queryName(f"copies_{stream.lower()}")
            .option("checkpointLocation", str(tmp_path / stream))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        return [r.seq for r in spark.table(f"copies_{stream.lower()}").orderBy("seq").collect()]

    mirrored = await asyncio.to_thread(read, f"{unique}M")
    assert await asyncio.to_thread(streamed, f"{unique}M") == [row[0] for row in mirrored]
    assert await asyncio.to_thread(streamed, f"{unique}S") == [1, 2]
    assert mirrored == [(s, f"{p}.{s % 3}", f"m{s}", None) for s in (1, 2, 3, 5, 6, 7, 8)]
    sourced = await asyncio.to_thread(read, f"{unique}S")  # origin sequences 1 and 7 (4 was deleted)
    assert [row[:3] for row in sourced] == [(1, f"{p}.1", "m1"), (2, f"{p}.1", "m7")]
    assert [str(row[3]).split(" ")[:2] for row in sourced] == [[f"{unique}O", "1"], [f"{unique}O", "7"]]


async def test_sources_added_and_removed_by_updates_and_cycles_refused(
    targets: dict[str, str], unique: str
) -> None:
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        await _origins(nc, name, p)
        js = nc.jetstream()
        await js.publish(f"{p}.x", b"o1")
        await js.publish(f"{p}2.x", b"o2")
        base = {"name": name, "subjects": [f"{p}s.>"]}
        one = [{"name": f"{name}O"}]
        two = [*one, {"name": f"{name}O2"}]
        out: list[Any] = [(await api(nc, f"STREAM.CREATE.{name}", {**base, "sources": one})).get("error")]
        await _caught_up(nc, name, 1, 1)
        out.append((await api(nc, f"STREAM.UPDATE.{name}", {**base, "sources": two})).get("error"))
        await _caught_up(nc, name, 2, 2)
        out.append((await api(nc, f"STREAM.UPDATE.{name}", {**base, "sources": two[1:]})).get("error"))
        await js.publish(f"{p}.x", b"o1 again")  # no longer sourced
        await js.publish(f"{p}2.x", b"o2 again")
        info = await _caught_up(nc, name, 3, 3)
        out += [info["state"]["messages"], sorted(s["name"] for s in info["sources"])]
        cycle = {"name": f"{name}O2", "subjects": [f"{p}2.>"], "sources": [{"name": name}]}
        out.append((await api(nc, f"STREAM.UPDATE.{name}O2", cycle)).get("error"))
        return out

    out = await assert_same(targets, case, unique)
    assert out[-1]["description"] == "detected cycle"


@pytest.mark.slow
def test_copies_of_a_real_jetstream_resume_after_kill_without_gap_or_duplicate(
    external: tuple[dict[str, str], str, Jetlake],
) -> None:
    """As the test above, the origin on the core JetStream: ``kill -9`` while a mirror and a source
    copy 20,000 messages over the leaf link; after the restart each origin message is there once."""
    _, core_url, lake = external
    total = 20_000

    async def fill(url: str) -> None:
        async with await nats.connect(url) as core:
            await api(core, "STREAM.CREATE.XK", {"name": "XK", "subjects": ["xk.>"]})
            js = core.jetstream()
            for i in range(0, total, 500):
                await asyncio.gather(*(js.publish(f"xk.{j % 7}", str(j).encode()) for j in range(i, i + 500)))

    async def start_and_wait(url: str) -> None:
        ext = {"api": "$JS.core.API"}
        async with await nats.connect(url) as nc:
            await api(nc, "STREAM.CREATE.XKM", {"name": "XKM", "mirror": {"name": "XK", "external": ext}})
            await api(
                nc,
                "STREAM.CREATE.XKS",
                {"name": "XKS", "subjects": ["xks"], "sources": [{"name": "XK", "external": ext}]},
            )
            for _ in range(1000):  # kill once both have committed copies and neither is done
                km = (await api(nc, "STREAM.INFO.XKM"))["state"]["messages"]
                ks = (await api(nc, "STREAM.INFO.XKS"))["state"]["messages"]
                if km > 4096 and ks > 4096:
                    print(f"killed with {km} mirrored and {ks} sourced of {total}")
                    return
                await asyncio.sleep(0.01)

    async def check(url: str) -> tuple[int, list[int]]:
        async with await nats.connect(url) as nc:
            km = await _caught_up(nc, "XKM", total, total)
            await _caught_up(nc, "XKS", total, total)
            sub = await nc.jetstream().pull_subscribe("", durable="R", stream="XKS")
            origin_seqs: list[int] = []
            while len(origin_seqs) < total:
                for m in await sub.fetch(1000, timeout=5):
                    origin_seqs.append(int((m.headers or {})["Nats-Stream-Source"].split(" ")[1]))
                    await m.ack()
            return km["state"]["last_seq"], origin_seqs

    asyncio.run(fill(core_url))
    asyncio.run(start_and_wait(lake.url))
    lake.kill_gateway()
    lake.start_gateway()
    last, origin_seqs = asyncio.run(check(lake.url))
    assert last == total
    assert origin_seqs == list(range(1, total + 1))  # each once, in the origin's order


@pytest.mark.waits  # a one-second TTL runs out, then its marker's
async def test_a_source_places_delete_markers_when_its_copies_expire(
    targets: dict[str, str], unique: str
) -> None:
    """ADR-43: a sourcing stream may set ``subject_delete_marker_ttl``; a copy whose ``Nats-TTL``
    runs out leaves a marker on its subject, as a message published there would."""
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        await api(
            nc, f"STREAM.CREATE.{name}O", {"name": f"{name}O", "subjects": [f"{p}.>"], "allow_msg_ttl": True}
        )
        made = await api(
            nc,
            f"STREAM.CREATE.{name}",
            {"name": name, "sources": [{"name": f"{name}O"}], "subject_delete_marker_ttl": 2_000_000_000},
        )
        assert "error" not in made, made
        await nc.jetstream().publish(f"{p}.x", b"short", headers={"Nats-TTL": "1s"})
        await _caught_up(nc, name, 1, 1)
        await asyncio.sleep(1.5)  # the copy's TTL was raised to the marker TTL: still there
        early = (await api(nc, f"STREAM.INFO.{name}"))["state"]["messages"]
        await asyncio.sleep(1.5)  # now it has gone, and left a marker
        info = await api(nc, f"STREAM.INFO.{name}")
        last = await api(nc, f"STREAM.MSG.GET.{name}", {"last_by_subj": f"{p}.x"})
        message = last.get("message", {})
        hdrs = base64.b64decode(message["hdrs"]).decode() if message.get("hdrs") else ""
        return [early, info["state"]["messages"], info["state"]["last_seq"], message.get("seq"), hdrs]

    out = await assert_same(targets, case, unique)
    assert out[:2] == [1, 1]
    assert "Nats-Marker-Reason" in out[4]
