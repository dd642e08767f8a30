"""A stream's ``subject_transform`` and ``republish``, on the real JetStream and on jetlake: the
configs both accept or refuse (the whole answer compared), the subjects messages are stored under
(every mapping function but ``random``), and the copies ``republish`` sends (subject, headers,
payload; the time stamp checked against the stored message's time on the same server)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from nats.aio.client import Client

from tests.differential import api, assert_same
from tests.test_stream_config import fill


def _t(src: str, dest: str) -> dict[str, Any]:
    return {"subject_transform": {"src": src, "dest": dest}}


CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("transform", _t("{p}.*.>", "{p}x.$1.>")),
    ("transform_no_source", _t("", "{p}x.>")),
    ("transform_only_dest_key", {"subject_transform": {"dest": "{p}x.>"}}),
    ("transform_no_dest", _t("{p}.>", "")),
    ("transform_fwc_not_kept", _t("{p}.>", "{p}x.$1")),
    ("transform_source_empty_token", _t("{p}..b", "{p}x")),
    ("transform_source_space", _t("{p}. b", "{p}x")),
    ("transform_unknown_function", _t("{p}.*", "{p}x.{{foo(1)}}")),
    ("transform_left", _t("{p}.*", "{p}x.{{left(1,2)}}")),
    ("transform_wildcard_range", _t("{p}.*", "{p}x.{{wildcard(2)}}")),
    ("transform_dollar_range", _t("{p}.*", "{p}x.$3")),
    ("transform_dest_space", _t("{p}.*", "{p}x y")),
    ("transform_dest_empty_token", _t("{p}.*", "{p}x..$1")),
    ("transform_dest_star", _t("{p}.*", "{p}x.*")),
    ("transform_no_wildcards_fn", _t("{p}.a", "{p}x.{{wildcard(1)}}")),
    (
        "transform_no_wildcards_partition",
        _t("{p}.a", "{p}x.{{partition(3)}}"),
    ),
    ("transform_wildcard_no_args", _t("{p}.*", "{p}x.{{wildcard()}}")),
    (
        "transform_wildcard_two_args",
        _t("{p}.*", "{p}x.{{wildcard(1,2)}}"),
    ),
    (
        "transform_wildcard_not_number",
        _t("{p}.*", "{p}x.{{wildcard(a)}}"),
    ),
    ("transform_split_one_arg", _t("{p}.*", "{p}x.{{split(1)}}")),
    ("transform_split_three_args", _t("{p}.*", "{p}x.{{split(1,-,+)}}")),
    ("transform_split_space", _t("{p}.*", "{p}x.{{split(1, )}}")),
    (
        "transform_slice_bad_size",
        _t("{p}.*", "{p}x.{{slicefromleft(1,x)}}"),
    ),
    ("transform_partition_bad", _t("{p}.*", "{p}x.{{partition(x,1)}}")),
    ("transform_random_two_args", _t("{p}.*", "{p}x.{{random(1,2)}}")),
    ("republish", {"republish": {"src": "{p}.>", "dest": "{p}r.>"}}),
    ("republish_headers_only", {"republish": {"src": "{p}.>", "dest": "{p}r.>", "headers_only": True}}),
    ("republish_no_source", {"republish": {"dest": "{p}r.>"}}),
    ("republish_no_source_pedantic", {"republish": {"dest": "{p}r.>"}, "pedantic": True}),
    ("republish_no_dest", {"republish": {"src": "{p}.>"}}),
    ("republish_cycle", {"republish": {"src": "{p}.>", "dest": "{p}.x.>"}}),
    ("republish_bad_transform", {"republish": {"src": "{p}.*", "dest": "{p}r.{{wildcard(3)}}"}}),
    ("republish_other_subjects", {"republish": {"src": "{p}other.>", "dest": "{p}r.>"}}),
    (
        "republish_implicit",
        {"republish": {"src": ">", "dest": ">"}, "subject_transform": {"src": "{p}.>", "dest": "{p}t.>"}},
    ),
    (
        "republish_implicit_pedantic",
        {
            "republish": {"src": ">", "dest": ">"},
            "subject_transform": {"src": "{p}.>", "dest": "{p}t.>"},
            "pedantic": True,
        },
    ),
]


@pytest.mark.parametrize(("label", "extra"), CONFIGS, ids=[c[0] for c in CONFIGS])
async def test_transform_and_republish_configs(
    targets: dict[str, str], unique: str, label: str, extra: dict[str, Any]
) -> None:
    """STREAM.CREATE answers the same (the config as kept, or the error), and an update to the same
    config too."""
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        req = fill({"name": name, "subjects": [f"{p}.>"], **extra}, name, p)
        created = await api(nc, f"STREAM.CREATE.{name}", req)
        updated = await api(nc, f"STREAM.UPDATE.{name}", req) if "error" not in created else None
        return [created, updated]

    await assert_same(targets, case, unique)


#: (source, destination, published subject suffixes): each suffix is published under ``{p}.``, and
#: the subjects the stream stored them under are compared.
MAPPINGS: list[tuple[str, str, str, list[str]]] = [
    ("dollar", "{p}.*.*", "{p}x.$2.$1", ["a.b", "c.d", "a.b.c"]),
    ("wildcard_fn", "{p}.*.*", "{p}x.{{wildcard(2)}}.{{ Wildcard(1) }}", ["a.b"]),
    ("fwc", "{p}.*.>", "{p}x.$1.>", ["a.b", "a.b.c.d"]),
    ("fwc_only", "{p}.>", "{p}x.>", ["a", "a.b.c"]),
    ("no_source", "", "{p}x.>", ["a.b"]),
    ("literal_source", "{p}.a", "{p}x.lit", ["a", "b"]),
    ("partition", "{p}.*.*", "{p}x.{{partition(5,1,2)}}.$1", ["a.b", "hello.world", "x.y", "1.2"]),
    ("partition_all", "{p}.*", "{p}x.{{partition(7)}}", ["a", "b", "cc", "order-17"]),
    ("partition_literal_source", "{p}.a", "{p}x.{{partition(4)}}", ["a"]),
    ("split_from_left", "{p}.*", "{p}x.{{splitFromLeft(1,3)}}", ["abcdef", "ab", "abc"]),
    ("split_from_right", "{p}.*", "{p}x.{{SplitFromRight(1,2)}}", ["abcdef", "ab", "a"]),
    ("slice_from_left", "{p}.*", "{p}x.{{sliceFromLeft(1,3)}}", ["abcdefgh", "abcdef", "ab"]),
    ("slice_from_right", "{p}.*", "{p}x.{{sliceFromRight(1,3)}}", ["abcdefgh", "abcdef", "ab"]),
    ("split", "{p}.*", "{p}x.{{split(1,-)}}", ["a-b-c", "a--b", "-a", "a-", "--a", "abc"]),
    ("left", "{p}.*", "{p}x.{{left(1,2)}}", ["abcd", "a"]),
    ("right", "{p}.*", "{p}x.{{right(1,2)}}", ["abcd", "a"]),
    ("wildcard_zero", "{p}.*", "{p}x.$0", ["a"]),
]


@pytest.mark.parametrize(("label", "src", "dest", "subjects"), MAPPINGS, ids=[m[0] for m in MAPPINGS])
async def test_messages_are_stored_under_the_transformed_subject(
    targets: dict[str, str], unique: str, label: str, src: str, dest: str, subjects: list[str]
) -> None:
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        transform = fill({"src": src, "dest": dest}, name, p)
        created = await api(
            nc,
            f"STREAM.CREATE.{name}",
            {"name": name, "subjects": [f"{p}.>"], "subject_transform": transform},
        )
        assert "error" not in created, created
        js = nc.jetstream()
        for i, suffix in enumerate(subjects):
            await js.publish(f"{p}.{suffix}", str(i).encode())
        stored = []
        for seq in range(1, len(subjects) + 1):
            got = await api(nc, f"STREAM.MSG.GET.{name}", {"seq": seq})
            stored.append(got["message"]["subject"])
        return stored

    await assert_same(targets, case, unique)


async def test_the_transformed_subject_is_what_checks_and_limits_see(
    targets: dict[str, str], unique: str
) -> None:
    """Per-subject limits, ``Nats-Expected-Last-Subject-Sequence`` and last-by-subject gets look at
    the stored (transformed) subject."""
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        await api(
            nc,
            f"STREAM.CREATE.{name}",
            {
                "name": name,
                "subjects": [f"{p}.>"],
                "subject_transform": {"src": f"{p}.*.*", "dest": f"{p}x.$1"},
                "max_msgs_per_subject": 2,
            },
        )
        js = nc.jetstream()
        for suffix in ("a.1", "a.2", "a.3", "b.1"):
            await js.publish(f"{p}.{suffix}", suffix.encode())
        refused = await nc.request(
            f"{p}.a.4", b"x", headers={"Nats-Expected-Last-Subject-Sequence": "2"}, timeout=5
        )
        accepted = await nc.request(
            f"{p}.a.5", b"y", headers={"Nats-Expected-Last-Subject-Sequence": "3"}, timeout=5
        )
        last = await api(nc, f"STREAM.MSG.GET.{name}", {"last_by_subj": f"{p}x.a"})
        info = await api(nc, f"STREAM.INFO.{name}", {"subjects_filter": ">"})
        return [
            json.loads(refused.data),
            json.loads(accepted.data),
            last["message"]["seq"],
            info["state"]["messages"],
            info["state"].get("subjects"),
        ]

    await assert_same(targets, case, unique)


REPUBLISHES: list[tuple[str, dict[str, Any]]] = [
    ("all", {"src": "{p}.>", "dest": "{p}r.>"}),
    ("headers_only", {"src": "{p}.>", "dest": "{p}r.>", "headers_only": True}),
    ("some_subjects", {"src": "{p}.a", "dest": "{p}r.only"}),
    ("wildcards", {"src": "{p}.*", "dest": "{p}r.$1.x"}),
    ("no_source", {"dest": "{p}r.>"}),
]


@pytest.mark.parametrize(("label", "republish"), REPUBLISHES, ids=[r[0] for r in REPUBLISHES])
async def test_republished_copies(
    targets: dict[str, str], unique: str, label: str, republish: dict[str, Any]
) -> None:
    """What a plain subscriber on the destination receives, per published message, in order; each
    ``Nats-Time-Stamp`` is the stored message's time."""
    p = unique.lower()

    async def case(nc: Client, name: str) -> Any:
        created = await api(
            nc,
            f"STREAM.CREATE.{name}",
            {"name": name, "subjects": [f"{p}.>"], "republish": fill(republish, name, p)},
        )
        assert "error" not in created, created
        got: list[Any] = []
        sub = await nc.subscribe(f"{p}r.>")
        await nc.flush()
        js = nc.jetstream()
        await js.publish(f"{p}.a", b"one")
        await js.publish(f"{p}.b", b"two", headers={"X-Mine": "kept"})
        await js.publish(f"{p}.a", b"three")
        await js.publish(f"{p}.c.d", b"four")
        await nc.flush()
        deadline = asyncio.get_running_loop().time() + 2
        while asyncio.get_running_loop().time() < deadline:
            try:
                msg = await sub.next_msg(timeout=0.3)
            except TimeoutError:
                break
            headers = dict(msg.headers or {})
            stamp = headers.pop("Nats-Time-Stamp")
            stored = await api(nc, f"STREAM.MSG.GET.{name}", {"seq": int(headers["Nats-Sequence"])})
            assert stamp == stored["message"]["time"], (stamp, stored["message"]["time"])
            got.append([msg.subject, headers, msg.data])
        await sub.unsubscribe()
        return got

    out = await assert_same(targets, case, unique)
    assert out, "nothing republished"
