"""API answers the compatibility table states, against the real JetStream and jetlake: operations
only a cluster or the system account performs, and the stream's `max_consumers` limit."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from tests.jsapi import api, same, stream


async def answer(nc: Client, subject: str, body: bytes) -> Any:
    """The API's answer, or "silent" when none comes within a second."""
    try:
        return await asyncio.wait_for(api(nc, subject, body), 1)
    except TimeoutError:
        return "silent"


async def test_clustered_only_operations(targets: dict[str, str], unique: str) -> None:
    """A single server answers leader step-downs, peer removal, evacuation and move cancelling
    with 503/10010 whatever the stream or consumer (existing or not) and the body; a subject with
    a token too many or too few gets no answer."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await api(nc, f"CONSUMER.CREATE.{name}.c", {"stream_name": name, "config": {"durable_name": "c"}})
        requests = (
            (f"STREAM.LEADER.STEPDOWN.{name}", b""),
            ("STREAM.LEADER.STEPDOWN.NOSUCH", b"{bad"),
            (f"CONSUMER.LEADER.STEPDOWN.{name}.c", b""),
            (f"CONSUMER.LEADER.STEPDOWN.{name}.nosuch", b"{}"),
            (f"STREAM.PEER.REMOVE.{name}", b'{"peer":"x"}'),
            (f"STREAM.PEER.EVACUATE.{name}", b"junk"),
            (f"STREAM.CANCEL_MOVE.{name}", b""),
            ("STREAM.LEADER.STEPDOWN", b""),
            (f"CONSUMER.LEADER.STEPDOWN.{name}", b""),
            (f"STREAM.CANCEL_MOVE.{name}.x", b""),
            # the system account's operations: an ordinary account gets no answer
            ("META.LEADER.STEPDOWN", b""),
            ("SERVER.REMOVE", b"{}"),
            ("SERVER.EVACUATE", b""),
            ("META.RESCUE", b""),
            ("ACCOUNT.PURGE.ACC", b""),
            ("ACCOUNT.STREAM.MOVE.ACC.S", b""),
            ("ACCOUNT.STREAM.CANCEL_MOVE.ACC.S", b""),
        )
        answers = await asyncio.gather(*(answer(nc, subject, body) for subject, body in requests))
        return dict(zip([subject for subject, _ in requests], answers, strict=True))

    out = await same(targets, case, unique)
    assert out[f"STREAM.LEADER.STEPDOWN.{unique}"]["error"]["err_code"] == 10010
    assert out["META.LEADER.STEPDOWN"] == "silent"


async def test_max_consumers_enforced(targets: dict[str, str], unique: str) -> None:
    """A stream's `max_consumers` refuses a consumer beyond the limit (10026), counting ephemeral
    ones too; creating an existing consumer again is not a new one; a deleted one frees its place;
    raising the limit by an update admits more."""

    async def case(nc: Client, name: str) -> Any:
        out: dict[str, Any] = {"stream": (await stream(nc, name, max_consumers=2))["config"]["max_consumers"]}

        def create(consumer: str) -> Any:
            body = {"stream_name": name, "config": {"durable_name": consumer}}
            return api(nc, f"CONSUMER.CREATE.{name}.{consumer}", body)

        out["c1"] = (await create("c1")).get("error", "ok")
        eph = await api(nc, f"CONSUMER.CREATE.{name}", {"stream_name": name, "config": {}})
        out["ephemeral"] = eph.get("error", "ok")
        out["c2"] = (await create("c2")).get("error", "ok")
        out["c1 again"] = (await create("c1")).get("error", "ok")
        out["delete"] = await api(nc, f"CONSUMER.DELETE.{name}.c1")
        out["c2 after delete"] = (await create("c2")).get("error", "ok")
        out["c3"] = (await create("c3")).get("error", "ok")
        cfg = {"name": name, "subjects": [f"{name.lower()}.>"], "max_consumers": 3}
        out["update"] = (await api(nc, f"STREAM.UPDATE.{name}", cfg)).get("error", "ok")
        out["c3 after update"] = (await create("c3")).get("error", "ok")
        names = (await api(nc, f"CONSUMER.NAMES.{name}"))["consumers"]
        out["names"] = sorted(n for n in names if len(n) == 2)  # the durables (not the ephemeral)
        return out

    out = await same(targets, case, unique)
    assert out["c2"]["err_code"] == 10026
    assert out["names"] == ["c2", "c3"]


# (subject, body) with {s} for the test's stream: each request is refused (or served) as the
# server's strict decoder reads it; the error JSON must match word for word.
DECODING = [
    # consumer config fields of every Go type, each with a value of the wrong type
    *(
        ("CONSUMER.CREATE.{s}.c", '{"stream_name":"{s}","config":{' + f'"{field}":{value}' + "}}")
        for field, value in [
            ("bogus", "1"),
            ("ack_wait", '"x"'),
            ("ack_wait", "1.5"),
            ("max_deliver", '"3"'),
            ("max_deliver", "99999999999999999999"),
            ("rate_limit_bps", "-1"),
            ("filter_subject", "5"),
            ("durable_name", "5"),
            ("headers_only", '"yes"'),
            ("backoff", '"x"'),
            ("backoff", '["x"]'),
            ("filter_subjects", "[1]"),
            ("metadata", "[1]"),
            ("metadata", '{"a":1}'),
            ("metadata", '{"a":null}'),
            ("deliver_policy", '"bogus"'),
            ("deliver_policy", "null"),
            ("priority_policy", '"x"'),
            ("Ack_Wait", '"x"'),
            ("opt_start_time", '"x"'),
            ("opt_start_time", '"2020-01-01"'),
            ("opt_start_time", '"2020-13-01T00:00:00Z"'),
            ("opt_start_time", '"2020-01-01T00:00:00Zabc"'),
        ]
    ),
    # the first fault in the order sent is the one reported, the nested config's included
    ("CONSUMER.CREATE.{s}.c", '{"stream_name":"{s}","config":{"ack_wait":"x","deliver_policy":"bogus"}}'),
    ("CONSUMER.CREATE.{s}.c", '{"stream_name":"{s}","config":{"bogus":1,"ack_wait":"x"}}'),
    ("CONSUMER.CREATE.{s}.c", '{"stream_name":5,"config":{"deliver_policy":"x"}}'),
    ("CONSUMER.CREATE.{s}.c", '{"stream_name":"{s}","config":[]}'),
    # the config is decoded before the stream is looked up
    ("CONSUMER.CREATE.NOSUCH.c", '{"stream_name":"NOSUCH","config":{"ack_wait":"x"}}'),
    # a body that is not an object names the request's Go type
    *((subject, "[1]") for subject in ("STREAM.CREATE.X", "STREAM.INFO.{s}", "STREAM.NAMES", "STREAM.LIST")),
    *((subject, "[1]") for subject in ("STREAM.PURGE.{s}", "STREAM.MSG.GET.{s}", "STREAM.MSG.DELETE.{s}")),
    *(
        (subject, "[1]")
        for subject in ("CONSUMER.CREATE.{s}.c", "CONSUMER.NAMES.{s}", "CONSUMER.PAUSE.{s}.c")
    ),
    # request fields of the wrong type name the request struct
    *(
        (subject, '{"seq":"x"}')
        for subject in ("STREAM.PURGE.{s}", "STREAM.MSG.GET.{s}", "STREAM.MSG.DELETE.{s}")
    ),
    ("STREAM.NAMES", '{"offset":"x"}'),
    ("CONSUMER.NAMES.{s}", '{"offset":"x"}'),
    ("CONSUMER.LIST.{s}", '{"seq":1}'),
    ("CONSUMER.RESET.{s}.c", '{"seq":"x"}'),
    # reset ignores unknown fields; pause does not, and reads its body before the consumer
    ("CONSUMER.RESET.{s}.c", '{"bogus":1}'),
    ("CONSUMER.PAUSE.{s}.nosuch", '{"pause_until":"x"}'),
    ("CONSUMER.PAUSE.{s}.c", '{"offset":1}'),
]


async def test_request_decoding(targets: dict[str, str], unique: str) -> None:
    """Requests are decoded as the server decodes them into its Go structs: unknown fields and
    values of the wrong type get 10025 with the server's words (struct and field named, the first
    fault in the order sent), before anything is looked up."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await api(nc, f"CONSUMER.CREATE.{name}.c", {"stream_name": name, "config": {"durable_name": "c"}})
        out = {}
        for subject, body in DECODING:
            asked = subject.replace("{s}", name)
            answer = await api(nc, asked, body.replace("{s}", name).encode())
            out[f"{asked} {body}"] = answer.get("error") or answer.get("config", {}).get("metadata", "served")
        return out

    out = await same(targets, case, unique)
    refused = [answer for answer in out.values() if isinstance(answer, dict) and "err_code" in answer]
    assert len(refused) == len(DECODING) - 2  # all but the null metadata value and reset's unknown field


async def test_direct_get_decoding(targets: dict[str, str], unique: str) -> None:
    """DIRECT.GET reads its body leniently: unknown fields are ignored, a body naming no message
    is `408 Empty Request`, a value of the wrong type `408 Malformed Request`."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name, allow_direct=True)
        await nc.jetstream().publish(f"{name.lower()}.a", b"one")
        out = {}
        for body in (
            b"{}",
            b"null",
            b'{"seq":0}',
            b'{"bogus":1}',
            b'{"batch":2}',
            b'{"seq":"x"}',
            b'{"seq":1,"x":2}',
        ):
            msg = await nc.request(f"$JS.API.DIRECT.GET.{name}", body, timeout=5)
            hdrs = dict(msg.headers or {})
            out[body.decode()] = (hdrs.get("Status"), hdrs.get("Description"), msg.data.decode())
        return out

    out = await same(targets, case, unique)
    assert out["{}"][:2] == ("408", "Empty Request")


S = 1_000_000_000
PEDANTIC_CONSUMERS: list[dict[str, Any]] = [
    {"max_deliver": -5},
    {"max_waiting": -1},
    {"max_ack_pending": -2},
    {"max_batch": -1},
    {"max_expires": -1},
    {"max_bytes": -1},
    {"idle_heartbeat": -1},
    {"inactive_threshold": -1},
    {"priority_timeout": -1},
    {"ack_policy": "explicit", "backoff": [S, 2 * S]},  # ack_wait would become 1 s
    {"ack_policy": "none", "backoff": [S]},  # no ack_wait default without acks
    {"ack_policy": "explicit", "ack_wait": S, "backoff": [S, 2 * S], "max_deliver": 3},  # agrees
    {"ack_policy": "explicit", "max_deliver": -1, "max_waiting": 0, "max_ack_pending": -1},  # no change
]


async def test_pedantic_consumer_create(targets: dict[str, str], unique: str) -> None:
    """`pedantic` on a consumer create refuses (400/10157) what the server would otherwise change to
    fit, and so do a stream's consumer limits the config leaves to their defaults; without it the
    same configs are accepted."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        limited = f"{name}L"
        await stream(nc, limited, consumer_limits={"max_ack_pending": 50, "inactive_threshold": 10 * S})
        out: dict[str, Any] = {}
        for i, cfg in enumerate(PEDANTIC_CONSUMERS):
            for pedantic in (True, False):
                body = {"stream_name": name, "pedantic": pedantic, "config": {"durable_name": f"c{i}", **cfg}}
                answer = await api(nc, f"CONSUMER.CREATE.{name}.c{i}", body)
                out[f"{cfg} {pedantic}"] = answer.get("error") or answer["config"]
        for i, cfg in enumerate(
            ({}, {"max_ack_pending": 10}, {"max_ack_pending": 10, "inactive_threshold": S})
        ):
            body = {"stream_name": limited, "pedantic": True, "config": {"durable_name": f"l{i}", **cfg}}
            answer = await api(nc, f"CONSUMER.CREATE.{limited}.l{i}", body)
            out[f"limited {cfg}"] = answer.get("error") or answer["config"]
        return out

    out = await same(targets, case, unique)
    assert out["{'max_deliver': -5} True"]["err_code"] == 10157


async def test_pedantic_stream_update(targets: dict[str, str], unique: str) -> None:
    """`pedantic` on a stream update refuses what an update would otherwise change to fit (10157, or
    10052 for the marker-TTL rules), as on create."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        base = {"name": name, "subjects": [f"{name.lower()}.>"], "pedantic": True}
        out: dict[str, Any] = {}
        for cfg in (
            {"max_msgs": -5},
            {"max_age": 10 * S},  # the 2 min duplicate window would be cut to max_age
            {"subject_delete_marker_ttl": S},  # would turn on allow_msg_ttl and roll-ups
            {"max_consumers": 0},
            {"max_age": 10 * S, "duplicate_window": 5 * S},
        ):
            answer = await api(nc, f"STREAM.UPDATE.{name}", {**base, **cfg})
            out[str(cfg)] = answer.get("error") or answer["config"]
        return out

    out = await same(targets, case, unique)
    assert out["{'max_msgs': -5}"]["err_code"] == 10157


UPDATE_RULES: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"allow_msg_ttl": True}, {"allow_msg_ttl": False}),  # one way: 10052
    ({}, {"allow_msg_ttl": True}),  # on is allowed (and raises _nats.req.level)
    ({"allow_msg_ttl": True}, {"subject_delete_marker_ttl": 0}),  # TTLs stay on: 10052
    ({}, {"subject_delete_marker_ttl": S}),  # turns on TTLs and roll-ups
    ({"subject_delete_marker_ttl": S}, {"allow_msg_ttl": True, "allow_rollup_hdrs": True}),  # markers off
    ({"deny_delete": True}, {}),  # one way
    ({"deny_purge": True}, {}),  # one way
    ({}, {"deny_delete": True, "deny_purge": True}),
    ({}, {"persist_mode": "async"}),  # fixed
    ({"persist_mode": "async"}, {}),  # fixed
    ({"allow_msg_ttl": True}, {"storage": "memory"}),  # storage is checked first
    ({"deny_purge": True}, {"retention": "workqueue"}),  # retention before the flags
    ({"max_age": 10 * S, "allow_rollup_hdrs": True}, {"sealed": True}),  # sealing clears both
]


async def test_stream_update_rules(targets: dict[str, str], unique: str) -> None:
    """What an update may not turn off or change (500/10052 with the server's words, the first
    broken rule in the server's order), and what sealing implies."""

    async def case(nc: Client, name: str) -> Any:
        out: dict[str, Any] = {}
        for i, (first, then) in enumerate(UPDATE_RULES):
            n = f"{name}{i}"
            base = {"name": n, "subjects": [f"{n.lower()}.>"]}
            created = await api(nc, f"STREAM.CREATE.{n}", {**base, **first})
            assert "error" not in created, created
            answer = await api(nc, f"STREAM.UPDATE.{n}", {**base, **then})
            out[f"{first} then {then}"] = answer.get("error") or answer["config"]
        return out

    out = await same(targets, case, unique)
    assert out["{'deny_delete': True} then {}"]["err_code"] == 10052


@pytest.mark.waits
async def test_consumer_action_and_pause_advisories(targets: dict[str, str], unique: str) -> None:
    """CONSUMER.CREATED (not again for a repeated create), PAUSE for a pause, an unpause and a
    pause until a past time, DELETED for an API delete (once) and for an ephemeral consumer that
    outlived its `inactive_threshold`; ids and times aside, the bodies are the server's (an
    advisory repeated back to back counts once: the real server sometimes sends a pause twice)."""

    async def case(nc: Client, name: str) -> Any:
        seen: list[dict[str, Any]] = []

        async def on(msg: Msg) -> None:
            body = json.loads(msg.data)
            if body.get("stream") == name and ".STREAM." not in msg.subject:
                seen.append(
                    {
                        "subject": msg.subject,
                        **{k: v for k, v in body.items() if k not in ("id", "timestamp")},
                    }
                )

        sub = await nc.subscribe("$JS.EVENT.ADVISORY.>", cb=on)
        await stream(nc, name)
        body = {"stream_name": name, "config": {"durable_name": "c", "ack_policy": "explicit"}}
        await api(nc, f"CONSUMER.CREATE.{name}.c", body)
        await api(nc, f"CONSUMER.CREATE.{name}.c", body)
        for until in ({"pause_until": "2099-01-01T00:00:00Z"}, {}, {"pause_until": "2000-01-01T00:00:00Z"}):
            await api(nc, f"CONSUMER.PAUSE.{name}.c", until)
        await api(nc, f"CONSUMER.DELETE.{name}.c")
        await api(nc, f"CONSUMER.DELETE.{name}.c")
        ephemeral = {"stream_name": name, "config": {"name": "e", "inactive_threshold": S // 2}}
        await api(nc, f"CONSUMER.CREATE.{name}.e", ephemeral)
        await asyncio.sleep(2.5)  # the ephemeral consumer goes after half a second without interest
        await sub.unsubscribe()
        # the real server now and then sends a pause advisory twice in a row; the repeat is dropped
        return [e for i, e in enumerate(seen) if i == 0 or e != seen[i - 1]]

    out = await same(targets, case, unique)
    assert [e["subject"].split(".")[4] for e in out] == [
        "CREATED",
        "PAUSE",
        "PAUSE",
        "PAUSE",
        "DELETED",
        "CREATED",
        "DELETED",
    ]


CONFIG_RULES: list[tuple[bool, dict[str, Any]]] = [
    # ack_policy flow_control (2.15): the server sets flow control and a 1 s heartbeat ...
    (False, {"ack_policy": "flow_control", "deliver_subject": "dl.a"}),
    (False, {"ack_policy": "flow_control", "deliver_subject": "dl.b", "idle_heartbeat": 2 * S}),
    # ... unless pedantic, which wants them given
    (True, {"ack_policy": "flow_control", "deliver_subject": "dl.c"}),
    (
        True,
        {
            "ack_policy": "flow_control",
            "deliver_subject": "dl.d",
            "flow_control": True,
            "idle_heartbeat": 2 * S,
        },
    ),
    (
        True,
        {"ack_policy": "flow_control", "deliver_subject": "dl.e", "flow_control": True, "idle_heartbeat": S},
    ),
    (False, {"ack_policy": "flow_control"}),  # push only: 10218
    (False, {"ack_policy": "flow_control", "deliver_subject": "dl.f", "max_ack_pending": -1}),  # 10220
    (False, {"ack_policy": "flow_control", "deliver_subject": "dl.g", "ack_wait": S}),  # 10221
    (False, {"ack_policy": "flow_control", "deliver_subject": "dl.h", "backoff": [S]}),  # 10221
    (False, {"ack_policy": "flow_control", "deliver_subject": "dl.i", "max_deliver": 3}),  # 10222
    # a deliver subject the stream captures would store every delivery again: 10081
    (False, {"deliver_subject": "{n}.x"}),
    (False, {"deliver_subject": "{n}.x", "max_waiting": 5}),
    (False, {"deliver_subject": "{n}"}),  # not captured by {n}.>
    (False, {"deliver_subject": "a..b"}),  # 10112
    (False, {"deliver_subject": "{n}.*"}),  # 10079
    # filters: an empty (or null) one among several is 10139, checked before their validity
    (False, {"filter_subjects": ["a.>", ""]}),
    (False, {"filter_subjects": ["a..", None]}),
    (False, {"filter_subject": "a", "filter_subjects": [""]}),  # both: 10136 first
    # the rest of the server's config checks
    (False, {"description": "d" * 4097}),  # 10107
    (False, {"metadata": {"k": "v" * 128 * 1024}}),  # 10135
    (False, {"sample_freq": "abc"}),  # 10095 with strconv's words
    (False, {"sample_freq": "-5"}),
    (False, {"sample_freq": "101%"}),  # accepted
    (False, {"deliver_subject": "dl.j", "idle_heartbeat": S // 20}),  # 10083: below 100 ms
    (False, {"deliver_subject": "dl.k", "max_ack_pending": 5}),  # 10082: needs acks on push
    (False, {"num_replicas": -1}),  # 10133
    (False, {"ack_policy": "explicit", "backoff": [-1]}),  # 10184
    # field names match without regard to case, as in Go
    (False, {"ack_policy": "explicit", "Ack_Wait": 5 * S, "MAX_DELIVER": 3}),
]


async def test_consumer_config_rules(targets: dict[str, str], unique: str) -> None:
    """The server's consumer config checks: the flow-control ack policy's requirements and
    defaults, deliver subjects that are wildcards, invalid or captured by the stream itself,
    `direct`, empty filters, names, description and metadata sizes, sampling, heartbeats, replicas
    and backoff values."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        out: dict[str, Any] = {}
        for i, (pedantic, cfg) in enumerate(CONFIG_RULES):
            config = json.loads(json.dumps(cfg).replace("{n}", name.lower()))
            body = {"stream_name": name, "pedantic": pedantic, "config": {"durable_name": f"p{i}", **config}}
            answer = await api(nc, f"CONSUMER.CREATE.{name}.p{i}", body)
            out[f"{pedantic} {cfg}"] = answer.get("error") or answer["config"]
        # `direct` (push and ephemeral only); names in an ephemeral create's config
        ephemerals = (
            {"direct": True},
            {"direct": True, "deliver_subject": "dl.direct"},
            {"name": "a.b"},
            {"name": "a/b"},
        )
        for cfg in ephemerals:
            answer = await api(nc, f"CONSUMER.CREATE.{name}", {"stream_name": name, "config": cfg})
            out[f"ephemeral {cfg}"] = answer.get("error") or answer["config"]
        return out

    out = await same(targets, case, unique)
    assert out["False {'deliver_subject': '{n}.x'}"]["err_code"] == 10081
    assert out["ephemeral {'direct': True}"]["err_code"] == 10090


async def test_unpin(targets: dict[str, str], unique: str) -> None:
    """CONSUMER.UNPIN checks its body (read by `json.Unmarshal`: a syntax error without an offset,
    unknown fields ignored), the group (required, 10025; a valid name, 10162), then the stream and
    the consumer; a consumer without priority groups does not have the group (10160)."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await api(nc, f"CONSUMER.CREATE.{name}.c", {"stream_name": name, "config": {"durable_name": "c"}})
        requests = [
            (f"CONSUMER.UNPIN.{name}.c", body)
            for body in (
                b"",
                b"{",
                b"null",
                b"[1]",
                b"{}",
                b'{"bogus":1}',
                b'{"group":5}',
                b'{"group":"g"} x',
            )
        ]
        requests += [
            (f"CONSUMER.UNPIN.{name}.c", json.dumps({"group": g}).encode()) for g in ("a)", "a.b", "x" * 17)
        ]
        requests += [
            (f"CONSUMER.UNPIN.{name}.c", b'{"group":"a/b=c-d_e"}'),
            (f"CONSUMER.UNPIN.{name}.nosuch", b'{"group":"g"}'),
            ("CONSUMER.UNPIN.NOSUCH.c", b'{"group":"g"}'),
            ("CONSUMER.UNPIN.NOSUCH.c", b'{"group":"bad name"}'),  # the name before the stream
            (f"CONSUMER.UNPIN.{name}", b'{"group":"g"}'),  # a token short: no answer
        ]
        answers = await asyncio.gather(*(answer(nc, subject, body) for subject, body in requests))
        return {f"{subject} {body.decode()}": a for (subject, body), a in zip(requests, answers, strict=True)}

    out = await same(targets, case, unique)
    assert out[f"CONSUMER.UNPIN.{unique}.c " + '{"group":"a/b=c-d_e"}']["error"]["err_code"] == 10160


async def test_direct_consumers_are_not_listed(targets: dict[str, str], unique: str) -> None:
    """A `direct` consumer (the server's own kind for mirrors) counts in the account but stays out
    of the stream's listings and `consumer_count`; INFO and DELETE find it by name."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        before = (await api(nc, "INFO"))["consumers"]
        cfg = {"direct": True, "deliver_subject": f"direct.{name.lower()}"}
        created = await api(nc, f"CONSUMER.CREATE.{name}", {"stream_name": name, "config": cfg})
        consumer = created["name"]
        return {
            "account": (await api(nc, "INFO"))["consumers"] - before,
            "info": "error" not in await api(nc, f"CONSUMER.INFO.{name}.{consumer}"),
            "names": (await api(nc, f"CONSUMER.NAMES.{name}"))["consumers"],
            "list": (await api(nc, f"CONSUMER.LIST.{name}"))["total"],
            "stream": (await api(nc, f"STREAM.INFO.{name}"))["state"]["consumer_count"],
            "delete": await api(nc, f"CONSUMER.DELETE.{name}.{consumer}"),
        }

    out = await same(targets, case, unique)
    assert out["names"] == []
