"""Consumer API against the real JetStream and jetlake: create forms, config validation and
defaults, update rules, info, delete, names, list, pause, ephemeral inactivity."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from nats.aio.client import Client
from nats.errors import TimeoutError

from tests.jsapi import api, publish, pull, same, stream


def _anon(answer: dict[str, Any]) -> dict[str, Any]:
    """An ephemeral consumer's generated name differs between servers; its length does not."""
    out = dict(answer)
    if "name" in out:
        out["name"] = len(out["name"])
    if "config" in out and "name" in out["config"] and "durable_name" not in out["config"]:
        out["config"] = {**out["config"], "name": len(out["config"]["name"])}
    return out


CONFIGS: list[dict[str, Any]] = [
    {},  # a raw create without ack_policy: ack none, ephemeral, 5 s inactivity
    {"ack_policy": "explicit"},  # max_ack_pending 1000, ack_wait 30 s
    {"ack_policy": "all", "max_ack_pending": 7, "ack_wait": 2_000_000_000},
    {"ack_policy": "none", "max_ack_pending": 5},  # kept even with ack none
    {"ack_policy": "explicit", "backoff": [1_000_000_000, 2_000_000_000]},  # ack_wait = backoff[0]
    {"ack_policy": "explicit", "max_deliver": 1, "backoff": [1_000_000_000, 2_000_000_000]},  # 10116
    {"ack_policy": "explicit", "max_deliver": 2, "backoff": [1_000_000_000, 2_000_000_000]},  # as many: fine
    {"ack_policy": "explicit", "backoff": [None]},  # Go reads a null member as 0: no ack wait shown
    {"Ack_Policy": "explicit", "FILTER_SUBJECTS": [None]},  # names in any case; an empty filter: 10139
    {"ack_policy": "explicit", "max_deliver": -5},  # any negative is -1
    {"ack_policy": "explicit", "max_deliver": 0, "replay_policy": "original"},  # replay original on pull
    {"ack_policy": "explicit", "sample_freq": "50%"},
    {"ack_policy": "explicit", "deliver_group": "g"},  # accepted on pull
    {"ack_policy": "explicit", "max_waiting": -1},  # the default 512
    {"ack_policy": "explicit", "max_batch": 5, "max_expires": 1_000_000_000, "max_bytes": 100},
    {"ack_policy": "explicit", "max_expires": 100},  # 10115
    {"ack_policy": "explicit", "ack_wait": -5},  # 10183
    {"ack_policy": "explicit", "max_ack_pending": -1},  # kept: unlimited
    {"ack_policy": "explicit", "headers_only": True},
    {"ack_policy": "explicit", "idle_heartbeat": 1_000_000_000},  # 10088: pull
    {"ack_policy": "explicit", "flow_control": True},  # 10089: pull
    {"ack_policy": "explicit", "rate_limit_bps": 100},  # 10086: pull
    {"ack_policy": "explicit", "deliver_subject": "ds.a", "max_waiting": 3},  # 10080
    {"ack_policy": "explicit", "deliver_subject": "ds.*"},  # 10079
    {"ack_policy": "explicit", "deliver_subject": "ds.b", "flow_control": True},  # 10108
    {"ack_policy": "none", "deliver_subject": "ds.c", "flow_control": True, "idle_heartbeat": 1_000_000_000},
    {"ack_policy": "explicit", "deliver_subject": "ds.d", "deliver_group": "g", "rate_limit_bps": 1000},
    {"deliver_policy": "by_start_sequence"},  # 10094 without opt_start_seq
    {"deliver_policy": "by_start_time"},  # 10094 without opt_start_time
    {"deliver_policy": "all", "opt_start_seq": 3},  # 10094: start sequence with deliver all
    {"deliver_policy": "new", "opt_start_time": "2020-01-01T00:00:00Z"},  # 10094
    {"deliver_policy": "last_per_subject"},  # 10094: needs a filter
    {"deliver_policy": "bogus"},  # 10025
    {"ack_policy": "bogus"},  # 10025
    {"deliver_policy": "by_start_sequence", "opt_start_seq": 3},  # num_pending 3
    {"deliver_policy": "by_start_time", "opt_start_time": "2020-01-01T00:00:00Z"},
    {"deliver_policy": "last"},  # num_pending 1
    {"deliver_policy": "new"},  # num_pending 0
    {"deliver_policy": "last_per_subject", "filter_subject": "{s}.*"},  # one per subject
    {"filter_subject": "{s}.s1"},
    {"filter_subject": "elsewhere.>"},  # accepted, nothing pending
    {"filter_subject": "{s}..x"},  # 10052 invalid subject
    {"filter_subject": "{s}.s1", "filter_subjects": ["{s}.s0"]},  # 10136
    {"filter_subjects": ["{s}.>", "{s}.s1"]},  # 10138 overlap
    {"filter_subjects": ["{s}.s0", "{s}.s1"]},
    {"description": "hi", "metadata": {"k": "v"}},
    {"mem_storage": True},
    {"inactive_threshold": -1},  # the default for an ephemeral
    {"pause_until": "2099-01-01T00:00:00Z"},  # paused, _nats.req.level 1
]


def _fill(value: Any, s: str) -> Any:
    if isinstance(value, str):
        return value.replace("{s}", s)
    if isinstance(value, list):
        return [_fill(v, s) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, s) for k, v in value.items()}
    return value


@pytest.mark.parametrize("cfg", CONFIGS, ids=[str(i) for i in range(len(CONFIGS))])
async def test_create_config(targets: dict[str, str], unique: str, cfg: dict[str, Any]) -> None:
    """Each config: the real server's defaults, rendering, num_pending, or its exact error."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await publish(nc, name, 5, subjects=2)
        body = {"stream_name": name, "config": _fill(cfg, name.lower())}
        named = await api(nc, f"CONSUMER.CREATE.{name}.c", body)
        ephemeral = await api(nc, f"CONSUMER.CREATE.{name}", body)
        durable = await api(nc, f"CONSUMER.DURABLE.CREATE.{name}.d", body)
        out = {"named": named, "ephemeral": _anon(ephemeral), "durable": durable}
        for answer in out.values():
            answer.pop("pause_remaining", None)
        return out

    await same(targets, case, unique)


@pytest.mark.parametrize(
    ("subject", "body"),
    [
        # a durable name in the body of an ephemeral create: 10020
        ("CONSUMER.CREATE.{S}", {"config": {"durable_name": "x", "ack_policy": "explicit"}}),
        # the durable name differs from the subject's: 10017
        ("CONSUMER.CREATE.{S}.a", {"config": {"durable_name": "b"}}),
        ("CONSUMER.DURABLE.CREATE.{S}.a", {"config": {"durable_name": "b"}}),
        # DURABLE.CREATE without a durable name in the body: 10018
        ("CONSUMER.DURABLE.CREATE.{S}.a", {"config": {"ack_policy": "explicit"}}),
        # a name in the body differing from the subject's: the subject wins
        ("CONSUMER.CREATE.{S}.a", {"config": {"name": "b"}}),
        # the filter in the subject (several tokens) and in the body
        ("CONSUMER.CREATE.{S}.a.{s}.s1", {"config": {"filter_subject": "{s}.s1"}}),
        ("CONSUMER.CREATE.{S}.a.{s}.s1", {"config": {}}),  # 10131
        ("CONSUMER.CREATE.{S}.a.{s}.s1", {"config": {"filter_subject": "{s}.s0"}}),  # 10131
        # the stream name in the body differs: 10056
        ("CONSUMER.CREATE.{S}.a", {"stream_name": "OTHER", "config": {}}),
        # a stream that does not exist: 10059
        ("CONSUMER.CREATE.NOPE{S}.a", {"config": {}}),
        # not JSON: 10025
        ("CONSUMER.CREATE.{S}.a", b"{nope"),
        # update of a consumer that does not exist: 10149
        ("CONSUMER.CREATE.{S}.a", {"action": "update", "config": {"durable_name": "a"}}),
    ],
)
async def test_create_forms(targets: dict[str, str], unique: str, subject: str, body: Any) -> None:
    """The create subjects and what each makes of name, durable name and filter."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await publish(nc, name, 4, subjects=2)
        b = _fill(body, name.lower()) if not isinstance(body, bytes) else body
        if isinstance(b, dict):
            b.setdefault("stream_name", name)
        answer = await api(nc, _fill(subject, name.lower()).replace("{S}", name), b)
        if answer.get("error", {}).get("err_code") == 10025:
            answer["error"]["description"] = answer["error"]["description"].split(":")[0]
        names = await api(nc, f"CONSUMER.NAMES.{name}")
        return {"answer": _anon(answer), "names": names}

    await same(targets, case, unique)


UPDATES: list[dict[str, Any]] = [
    {"max_deliver": 4},  # allowed
    {"ack_wait": 5_000_000_000, "max_ack_pending": 9, "description": "new"},  # allowed
    {"filter_subject": "{s}.s1"},  # allowed: num_pending follows the new filter
    {"ack_policy": "all"},  # ack policy can not be updated
    {"deliver_policy": "new"},  # deliver policy can not be updated
    {"max_waiting": 9},  # max waiting can not be updated
    {"deliver_subject": "push.x"},  # can not update pull consumer to push based
    {"replay_policy": "original"},  # replay policy can not be updated
    {"mem_storage": True},  # storage type can not be updated
]


@pytest.mark.parametrize("change", UPDATES, ids=[str(i) for i in range(len(UPDATES))])
async def test_update_rules(targets: dict[str, str], unique: str, change: dict[str, Any]) -> None:
    """A second create with another config updates what may change and refuses the rest;
    ``action: create`` refuses any difference (10148)."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await publish(nc, name, 6, subjects=3)
        base = {"durable_name": "u", "ack_policy": "explicit"}
        first = await api(nc, f"CONSUMER.CREATE.{name}.u", {"stream_name": name, "config": base})
        new = {**base, **_fill(change, name.lower())}
        strict = await api(
            nc, f"CONSUMER.CREATE.{name}.u", {"stream_name": name, "action": "create", "config": new}
        )
        same = await api(
            nc, f"CONSUMER.CREATE.{name}.u", {"stream_name": name, "action": "create", "config": base}
        )
        updated = await api(nc, f"CONSUMER.CREATE.{name}.u", {"stream_name": name, "config": new})
        info = await api(nc, f"CONSUMER.INFO.{name}.u")
        return {"first": first, "strict": strict, "same": same, "updated": updated, "info": info}

    await same(targets, case, unique)


async def test_info_delete_names_list(targets: dict[str, str], unique: str) -> None:
    """INFO, DELETE (twice), NAMES and LIST with offsets, and their errors for unknown names."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await publish(nc, name, 3)
        for c in ("b", "a", "c"):
            await api(nc, f"CONSUMER.CREATE.{name}.{c}", {"stream_name": name, "config": {"durable_name": c}})
        out: dict[str, Any] = {
            "names": await api(nc, f"CONSUMER.NAMES.{name}"),
            "names_offset": await api(nc, f"CONSUMER.NAMES.{name}", {"offset": 2}),
            "list": await api(nc, f"CONSUMER.LIST.{name}", {"offset": 1}),
            "info_missing": await api(nc, f"CONSUMER.INFO.{name}.zz"),
            "info_no_stream": await api(nc, f"CONSUMER.INFO.NO{name}.a"),
            "delete": await api(nc, f"CONSUMER.DELETE.{name}.b"),
            "delete_again": await api(nc, f"CONSUMER.DELETE.{name}.b"),
            "names_after": await api(nc, f"CONSUMER.NAMES.{name}"),
            "names_no_stream": await api(nc, f"CONSUMER.NAMES.NO{name}"),
            "list_no_stream": await api(nc, f"CONSUMER.LIST.NO{name}"),
            "stream": (await api(nc, f"STREAM.INFO.{name}"))["state"]["consumer_count"],
        }
        return out

    await same(targets, case, unique)


async def test_pause_resume(targets: dict[str, str], unique: str) -> None:
    """PAUSE stops delivery until the time; an empty body resumes; a past time is not paused."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await publish(nc, name, 2)
        await api(nc, f"CONSUMER.CREATE.{name}.p", {"stream_name": name, "config": {"durable_name": "p"}})
        js = nc.jetstream()
        sub = await js.pull_subscribe_bind("p", name)
        paused = await api(nc, f"CONSUMER.PAUSE.{name}.p", {"pause_until": "2099-01-01T00:00:00Z"})
        paused.pop("pause_remaining")
        info = await api(nc, f"CONSUMER.INFO.{name}.p")
        info.pop("pause_remaining")
        listed = (await api(nc, f"CONSUMER.LIST.{name}"))["consumers"][0]
        listed.pop("pause_remaining")
        try:
            got: Any = len(await sub.fetch(1, timeout=1))
        except Exception as exc:
            got = type(exc).__name__
        resumed = await api(nc, f"CONSUMER.PAUSE.{name}.p")
        resumed_info = await api(nc, f"CONSUMER.INFO.{name}.p")
        after = [m.data.decode() for m in await sub.fetch(1, timeout=3)]
        past = await api(nc, f"CONSUMER.PAUSE.{name}.p", {"pause_until": "2001-01-01T00:00:00Z"})
        past_info = await api(nc, f"CONSUMER.INFO.{name}.p")
        missing = await api(nc, f"CONSUMER.PAUSE.{name}.zz")
        return {
            "paused": paused,
            "info": info,
            "listed": listed,
            "got": got,
            "resumed": resumed,
            "resumed_info": resumed_info,
            "after": after,
            "past": past,
            "past_info": past_info,
            "missing": missing,
        }

    out = await same(targets, case, unique)
    levels = [out[k]["config"]["metadata"]["_nats.req.level"] for k in ("info", "resumed_info", "past_info")]
    assert levels == ["1", "0", "1"]


@pytest.mark.slow
async def test_ephemeral_goes_after_inactive_threshold(targets: dict[str, str], unique: str) -> None:
    """An ephemeral consumer with no requests for ``inactive_threshold`` is deleted; a durable
    stays, and so does an ephemeral that is kept busy with pull requests."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        cfg = {"ack_policy": "explicit", "inactive_threshold": 1_000_000_000}
        idle = await api(nc, f"CONSUMER.CREATE.{name}", {"stream_name": name, "config": cfg})
        busy = await api(nc, f"CONSUMER.CREATE.{name}.busy", {"stream_name": name, "config": cfg})
        await api(nc, f"CONSUMER.CREATE.{name}.dur", {"stream_name": name, "config": {"durable_name": "dur"}})
        inbox = nc.new_inbox()
        await nc.subscribe(inbox)
        for _ in range(6):
            await nc.publish(
                f"$JS.API.CONSUMER.MSG.NEXT.{name}.busy", b'{"batch":1,"expires":400000000}', reply=inbox
            )
            await asyncio.sleep(0.4)
        names = await api(nc, f"CONSUMER.NAMES.{name}")
        return {
            "idle_gone": idle["name"] not in names["consumers"],
            "busy": busy["name"] in names["consumers"],
            "total": names["total"],
        }

    out = await same(targets, case, unique)
    assert out == {"idle_gone": True, "busy": True, "total": 2}


@pytest.mark.slow
async def test_inactive_threshold_counts_from_the_last_request_gone(
    targets: dict[str, str], unique: str
) -> None:
    """A pull request that waits longer than ``inactive_threshold`` keeps its ephemeral consumer:
    the threshold counts from when the request ended (it expired), not from when it came."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        cfg = {"ack_policy": "explicit", "inactive_threshold": 1_000_000_000}
        created = await api(nc, f"CONSUMER.CREATE.{name}", {"stream_name": name, "config": cfg})
        inbox = nc.new_inbox()
        await nc.subscribe(inbox)
        await nc.publish(
            f"$JS.API.CONSUMER.MSG.NEXT.{name}.{created['name']}",
            b'{"batch":1,"expires":2000000000}',
            reply=inbox,
        )
        t0 = time.monotonic()
        seen = []
        # the request ends at 2 s; the server's own check runs once per threshold, so it deletes
        # between 3 and 4 s, jetlake at 3 s: neither instant is sampled
        for at in (1.5, 2.5, 5.0):
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            names = await api(nc, f"CONSUMER.NAMES.{name}")
            seen.append(created["name"] in (names["consumers"] or []))
        return seen

    assert await same(targets, case, unique) == [True, True, False]


@pytest.mark.parametrize(
    "cfg",
    [
        {},  # ack none: max_ack_pending and inactive_threshold from the stream's limits
        {"ack_policy": "explicit"},
        {"ack_policy": "explicit", "max_ack_pending": 100},  # 10121 over the limit
        {"ack_policy": "explicit", "max_ack_pending": 20, "inactive_threshold": 10_000_000_000},  # 10153
        {"ack_policy": "explicit", "durable_name": "c"},  # durables get the threshold too
    ],
)
async def test_stream_consumer_limits(targets: dict[str, str], unique: str, cfg: dict[str, Any]) -> None:
    """A stream's consumer_limits are the consumers' defaults and caps."""

    async def case(nc: Client, name: str) -> Any:
        limits = {"inactive_threshold": 3_000_000_000, "max_ack_pending": 50}
        await stream(nc, name, consumer_limits=limits)
        return await api(nc, f"CONSUMER.CREATE.{name}.c", {"stream_name": name, "config": cfg})

    await same(targets, case, unique)


@pytest.mark.waits
async def test_reset(targets: dict[str, str], unique: str) -> None:
    """CONSUMER.RESET starts the consumer again above its ack floor or at a sequence (also past the
    end); pending acks are dropped and the consumer sequence restarts; an unknown consumer gets
    no answer."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await publish(nc, name, 5)
        await api(
            nc,
            f"CONSUMER.CREATE.{name}.d",
            {"stream_name": name, "config": {"durable_name": "d", "ack_policy": "explicit"}},
        )
        got = await pull(nc, name, "d", {"batch": 3}, 3)
        await nc.request(f"$JS.ACK.{name}.d.1.1.1.0.0", b"+ACK", timeout=2)
        out: dict[str, Any] = {"got": got}
        for i, body in enumerate((b"", {"seq": 4}, {"seq": 1}, {"seq": 99}, {"seq": -1})):
            answer = await api(nc, f"CONSUMER.RESET.{name}.d", body)
            out[f"reset{i}"] = answer
            out[f"after{i}"] = await pull(nc, name, "d", {"batch": 2, "no_wait": True}, 3)
        try:
            await nc.request(f"$JS.API.CONSUMER.RESET.{name}.zz", b"", timeout=1)
            out["missing"] = "answered"
        except TimeoutError:
            out["missing"] = "silent"
        return out

    out = await same(targets, case, unique)
    assert out["missing"] == "silent"


async def test_reset_bounded_by_the_deliver_policy(targets: dict[str, str], unique: str) -> None:
    """CONSUMER.RESET to a sequence may not go below a by-start-sequence or by-start-time start
    (`below start seq`, `below start time`) and cannot move a consumer whose policy starts from the
    stream's end at all (`not allowed`): 400/10204 `invalid reset: …`. An empty reset (back above
    the ack floor) is served under every policy."""

    async def case(nc: Client, name: str) -> Any:
        await stream(nc, name)
        await publish(nc, name, 8)
        fifth = await api(nc, f"STREAM.MSG.GET.{name}", {"seq": 5})
        starts: dict[str, dict[str, Any]] = {
            "all": {},
            "by_start_sequence": {"opt_start_seq": 5},
            "by_start_time": {"opt_start_time": fifth["message"]["time"]},
            "new": {},
            "last": {},
            "last_per_subject": {"filter_subject": f"{name.lower()}.>"},
        }
        out = {}
        for policy, start in starts.items():
            cfg = {"durable_name": policy, "ack_policy": "explicit", "deliver_policy": policy, **start}
            await api(nc, f"CONSUMER.CREATE.{name}.{policy}", {"stream_name": name, "config": cfg})
            for body in ({"seq": 3}, {"seq": 5}, {"seq": 6}, b""):
                answer = await api(nc, f"CONSUMER.RESET.{name}.{policy}", body)
                out[f"{policy} {body!r}"] = answer.get("error") or answer["reset_seq"]
        return out

    out = await same(targets, case, unique)
    assert out["by_start_sequence {'seq': 3}"]["description"] == "invalid reset: below start seq"
    assert out["by_start_time {'seq': 3}"]["description"] == "invalid reset: below start time"
    assert out["new {'seq': 6}"]["description"] == "invalid reset: not allowed"
    assert out["all {'seq': 3}"] == 3
