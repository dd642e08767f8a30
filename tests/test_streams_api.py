"""The stream API beyond create: update rules, delete, list and names, info details, message get
and delete, direct get, sealed and deny flags; each case against the real JetStream and jetlake."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError, TimeoutError

from tests.differential import assert_same
from tests.harness import Jetlake
from tests.jsapi import same
from tests.streams_script import run_script
from tests.test_thin_slice import api


def untimed(answer: dict[str, Any]) -> dict[str, Any]:
    """A MSG.GET answer without the stored time (it differs between any two servers)."""
    if "message" in answer:
        answer["message"].pop("time")
    return answer


UPDATES: list[tuple[str, dict[str, Any]]] = [
    # limits, discard and flags may change
    ("limits", {"max_msgs": 5, "discard": "new", "max_bytes": 1000, "description": "d"}),
    # subjects may change, also to more subjects
    ("subjects", {"subjects": ["{n}.>", "{n}x.y"]}),
    # subjects of another stream: 10065
    ("overlap", {"subjects": ["{n}other.a"]}),
    # storage is fixed: 10052
    ("storage", {"storage": "memory"}),
    # retention cannot change to or from workqueue: 10052
    ("workqueue", {"retention": "workqueue"}),
    # limits <-> interest is allowed
    ("interest", {"retention": "interest"}),
    # a name in the body unlike the subject's: 10056
    ("name", {"name": "OTHER"}),
    # a value of the wrong type: Go's decoding error, 10025
    ("wrong_type", {"max_msgs": "many"}),
    # max_age below the duplicate window: 10052
    ("max_age", {"max_age": 1_000_000_000}),
    # sealing turns on deny_delete, deny_purge and discard new
    ("seal", {"sealed": True}),
]


@pytest.mark.parametrize(("label", "change"), UPDATES, ids=[u[0] for u in UPDATES])
async def test_stream_update(
    targets: dict[str, str], unique: str, label: str, change: dict[str, Any]
) -> None:
    async def case(nc: Client, name: str) -> Any:
        n = name.lower()
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{n}.>"]})
        await api(nc, f"STREAM.CREATE.{name}OTHER", {"name": f"{name}OTHER", "subjects": [f"{n}other.>"]})
        cfg = (await api(nc, f"STREAM.INFO.{name}"))["config"]
        body = {**cfg, **json.loads(json.dumps(change).replace("{n}", n))}
        answer = await api(nc, f"STREAM.UPDATE.{name}", body)
        info = await api(nc, f"STREAM.INFO.{name}")
        return {"answer": answer, "config": info["config"]}

    await assert_same(targets, case, unique)


async def test_stream_update_errors(targets: dict[str, str], unique: str) -> None:
    """Unknown stream, empty body, bad JSON; the config is checked (a name required, then the name
    compared) before the stream is looked up; a sealed stream cannot be unsealed."""

    async def case(nc: Client, name: str) -> Any:
        out = [await api(nc, f"STREAM.UPDATE.{name}", {"name": name})]
        out.append(await api(nc, f"STREAM.UPDATE.{name}", {"max_bytes": None}))
        out.append(await api(nc, f"STREAM.UPDATE.{name}", {"name": None, "max_msgs": 5}))
        out.append(await api(nc, f"STREAM.UPDATE.{name}", {"name": name, "max_age": -1}))
        out.append(await api(nc, f"STREAM.UPDATE.{name}", {"name": "OTHER"}))
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{name.lower()}.>"]})
        out.append(await api(nc, f"STREAM.UPDATE.{name}", b""))
        out.append((await api(nc, f"STREAM.UPDATE.{name}", b"{bad"))["error"]["err_code"])
        cfg = (await api(nc, f"STREAM.INFO.{name}"))["config"]
        out.append(await api(nc, f"STREAM.UPDATE.{name}", {**cfg, "sealed": True}))
        out.append(await api(nc, f"STREAM.UPDATE.{name}", {**cfg, "sealed": False}))
        return out

    await assert_same(targets, case, unique)


async def test_sealed_and_deny_flags(targets: dict[str, str], unique: str) -> None:
    """deny_delete and deny_purge refuse those requests; a sealed stream refuses publishes too."""

    async def case(nc: Client, name: str) -> Any:
        n = name.lower()
        await api(
            nc,
            f"STREAM.CREATE.{name}",
            {"name": name, "subjects": [f"{n}.>"], "deny_delete": True, "deny_purge": True},
        )
        out: list[Any] = [json.loads((await nc.request(f"{n}.a", b"x", timeout=5)).data)]
        out.append(await api(nc, f"STREAM.MSG.DELETE.{name}", {"seq": 1}))
        out.append(await api(nc, f"STREAM.PURGE.{name}", {}))
        cfg = (await api(nc, f"STREAM.INFO.{name}"))["config"]
        await api(nc, f"STREAM.UPDATE.{name}", {**cfg, "sealed": True})
        out.append(json.loads((await nc.request(f"{n}.a", b"x", timeout=5)).data))
        out.append(await api(nc, f"STREAM.MSG.DELETE.{name}", {"seq": 1}))
        out.append(await api(nc, f"STREAM.PURGE.{name}", {}))
        out.append((await api(nc, f"STREAM.INFO.{name}"))["state"])
        return out

    await assert_same(targets, case, unique)


async def test_stream_delete(targets: dict[str, str], unique: str) -> None:
    """Delete answers success; the stream is gone (info 10059, publishes get no responders, a
    second delete 10059); a new stream under the name starts from nothing."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        n = name.lower()
        await js.add_stream(name=name, subjects=[f"{n}.>"])
        for _ in range(3):
            await js.publish(f"{n}.a", b"x")
        await js.pull_subscribe(f"{n}.>", durable="d")
        out: list[Any] = [await api(nc, f"STREAM.DELETE.{name}")]
        out.append(await api(nc, f"STREAM.INFO.{name}"))
        out.append(await api(nc, f"STREAM.DELETE.{name}"))
        try:
            await nc.request(f"{n}.a", b"x", timeout=2)
            out.append("answered")
        except NoRespondersError:
            out.append("no responders")
        await js.add_stream(name=name, subjects=[f"{n}.>"])
        await js.publish(f"{n}.b", b"y")
        info = await api(nc, f"STREAM.INFO.{name}")
        out.append(info["state"])
        out.append(untimed(await api(nc, f"STREAM.MSG.GET.{name}", {"seq": 1})))
        return out

    await assert_same(targets, case, unique)


async def test_removals_racing_their_messages_commit(jetlake: Jetlake, unique: str) -> None:
    """A delete or purge of a message published (without a reply) just before is answered only once
    that message's commit has landed (the commit wakes it), and succeeds: the gateway takes the link
    in order, so the message exists. (Not differential: the real server stores a core publish
    asynchronously, so the same requests may find the message there or not.)"""
    nc = await nats.connect(jetlake.url)
    try:
        name = f"RACE{unique}"
        n = name.lower()
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{n}.>"]})
        for seq in range(1, 31):
            await nc.publish(f"{n}.a", b"x")
            if seq % 3:
                assert (await api(nc, f"STREAM.MSG.DELETE.{name}", {"seq": seq})).get("success") is True
            else:
                assert (await api(nc, f"STREAM.PURGE.{name}"))["purged"] == 1
        state = (await api(nc, f"STREAM.INFO.{name}"))["state"]
        assert (state["messages"], state["first_seq"], state["last_seq"]) == (0, 31, 30)
    finally:
        await nc.close()


async def test_stream_list_and_names(targets: dict[str, str], unique: str) -> None:
    """LIST and NAMES filter by subject and page by offset (LIST pages hold 256, NAMES 1024)."""

    async def case(nc: Client, name: str) -> Any:
        n = name.lower()
        for i in range(3):
            await api(nc, f"STREAM.CREATE.{name}{i}", {"name": f"{name}{i}", "subjects": [f"{n}.{i}.>"]})
        out: list[Any] = []
        for body in (
            {"subject": f"{n}.>"},
            {"subject": f"{n}.1.x"},
            {"subject": f"{n}.>", "offset": 2},
            {"subject": f"{n}.>", "offset": 5},
            {"subject": f"{n}nothing.>"},
        ):
            out.append(await api(nc, "STREAM.NAMES", body))
            out.append(await api(nc, "STREAM.LIST", body))
        return out

    await assert_same(targets, case, unique)


async def test_domain_named_where_the_server_names_it(targets: dict[str, str], unique: str) -> None:
    """jetlake serves JetStream domain ``jetlake``, so it names it where a real server in that
    domain does: PubAcks (between stream and sequence, duplicates too), ``$JS.API.INFO``,
    STREAM.INFO, UPDATE and LIST (CREATE does not), and every advisory; consumer info does not."""

    async def case(nc: Client, name: str) -> Any:
        s = name.lower()
        events: list[Any] = []

        async def on(msg: Any) -> None:
            body = json.loads(msg.data)
            if body.get("stream") == name:
                events.append((msg.subject.split(".")[3], body.get("domain")))

        sub = await nc.subscribe("$JS.EVENT.ADVISORY.>", cb=on)
        cfg = {"name": name, "subjects": [f"{s}.>"]}
        created = await api(nc, f"STREAM.CREATE.{name}", cfg)
        acks = [(await nc.request(f"{s}.a", b"x", headers={"Nats-Msg-Id": "1"})).data for _ in range(2)]
        updated = await api(nc, f"STREAM.UPDATE.{name}", {**cfg, "description": "d"})
        info = await api(nc, f"STREAM.INFO.{name}")
        listed = await api(nc, "STREAM.LIST", {"subject": f"{s}.a"})
        body = {"stream_name": name, "config": {"durable_name": "c", "ack_policy": "explicit"}}
        consumer = await api(nc, f"CONSUMER.CREATE.{name}.c", body)
        account = await api(nc, "INFO")
        await asyncio.sleep(0.3)
        await sub.unsubscribe()
        return {
            "acks": [a.decode() for a in acks],
            "domains": {
                "create": created.get("domain"),
                "update": updated.get("domain"),
                "info": info.get("domain"),
                "list": [i.get("domain") for i in listed["streams"]],
                "consumer": consumer.get("domain"),
                "account": account.get("domain"),
            },
            "events": events,
        }

    out = await same(targets, case, unique)
    assert out["acks"] == [
        f'{{"stream":"{unique}","domain":"jetlake","seq":1}}',
        f'{{"stream":"{unique}","domain":"jetlake","seq":1,"duplicate": true}}',
    ]
    assert out["domains"]["account"] == "jetlake"
    assert out["events"] == [("STREAM", "jetlake"), ("STREAM", "jetlake"), ("CONSUMER", "jetlake")]


async def test_stream_info_details(targets: dict[str, str], unique: str) -> None:
    """INFO with subjects_filter (per-subject counts, wildcard or literal) and deleted_details."""

    async def case(nc: Client, name: str) -> Any:
        n = name.lower()
        steps = [("pub", f"{s}.{i % 2}", 1) for i, s in enumerate("aabbcab")] + [("del", {"seq": 3})]
        out = await run_script(nc, name, {}, steps)
        for body in (
            {"subjects_filter": f"{n}.a.*"},
            {"subjects_filter": f"{n}.b.1"},
            {"subjects_filter": f"{n}.zz"},
            {"deleted_details": True},
            {"subjects_filter": ">", "deleted_details": True},
            b"{bad",
        ):
            info = await api(nc, f"STREAM.INFO.{name}", body)
            if "error" in info:
                info["error"]["description"] = info["error"]["description"].split(":")[0]
            out.append(info)
        return out

    await assert_same(targets, case, unique)


async def test_msg_get(targets: dict[str, str], unique: str) -> None:
    """MSG.GET by seq, last_by_subj (literal and wildcard), next_by_subj; headers and empty
    payloads; 10037 for holes and misses, 10003 for bad combinations."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        n = name.lower()
        await js.add_stream(name=name, subjects=[f"{n}.>"])
        await js.publish(f"{n}.a", b"one", headers={"X-K": "v"})
        await js.publish(f"{n}.b", b"two")
        await js.publish(f"{n}.a", b"")
        await js.publish(f"{n}.c", b"four")
        await api(nc, f"STREAM.MSG.DELETE.{name}", {"seq": 2})
        out: list[Any] = []
        for body in (
            {"seq": 1},
            {"seq": 2},
            {"seq": 3},
            {"seq": 9},
            {"last_by_subj": f"{n}.a"},
            {"last_by_subj": f"{n}.*"},
            {"last_by_subj": f"{n}.b"},
            {"next_by_subj": f"{n}.a", "seq": 2},
            {"next_by_subj": f"{n}.>", "seq": 2},
            {"next_by_subj": f"{n}.a"},
            {"next_by_subj": f"{n}.a", "seq": 4},
            {"seq": 1, "last_by_subj": f"{n}.a"},
            {},
        ):
            out.append(untimed(await api(nc, f"STREAM.MSG.GET.{name}", body)))
        out.append(await api(nc, f"STREAM.MSG.GET.{name}NOPE", {"seq": 1}))
        got = await js.get_msg(name, 1)
        out.append((got.subject, got.seq, got.data, dict(got.headers or {})))
        return out

    out = await assert_same(targets, case, unique)
    assert base64.b64decode(out[0]["message"]["data"]) == b"one"


async def test_direct_get(targets: dict[str, str], unique: str) -> None:
    """DIRECT.GET with a JSON body and as DIRECT.GET.<stream>.<subject>: headers Nats-Stream,
    Nats-Subject, Nats-Sequence, Nats-Time-Stamp and the message's own; 404 and 408 statuses;
    no responders for a stream without allow_direct."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        n = name.lower()
        await js.add_stream(name=name, subjects=[f"{n}.>"], allow_direct=True)
        await js.add_stream(name=f"{name}NO", subjects=[f"{n}no.>"])
        await js.publish(f"{n}.a", b"one", headers={"X-K": "v"})
        await js.publish(f"{n}.b", b"two")
        await js.publish(f"{n}.a", b"")
        out: list[Any] = []
        for subject, body in (
            (f"DIRECT.GET.{name}", {"seq": 1}),
            (f"DIRECT.GET.{name}", {"last_by_subj": f"{n}.a"}),
            (f"DIRECT.GET.{name}", {"next_by_subj": f"{n}.a", "seq": 2}),
            (f"DIRECT.GET.{name}.{n}.b", b""),
            (f"DIRECT.GET.{name}.{n}.zz", b""),
            (f"DIRECT.GET.{name}", {"seq": 9}),
            (f"DIRECT.GET.{name}", b"{bad"),
            (f"DIRECT.GET.{name}", b""),
            (f"DIRECT.GET.{name}NO", {"seq": 1}),
            (f"DIRECT.GET.{name}NONE", {"seq": 1}),
        ):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            try:
                msg = await nc.request(f"$JS.API.{subject}", data, timeout=3)
            except NoRespondersError:
                out.append("no responders")
                continue
            hdrs = {k: v for k, v in (msg.headers or {}).items() if k != "Nats-Time-Stamp"}
            out.append((hdrs, msg.data, "Nats-Time-Stamp" in (msg.headers or {})))
        got = await js.get_msg(name, subject=f"{n}.b", direct=True)
        out.append((got.subject, got.seq, got.data))
        # the "no responders" status itself names the subject asked
        raw = await nc.subscribe(inbox := nc.new_inbox())
        for subject in (f"DIRECT.GET.{name}NO", f"DIRECT.GET.{name}NO.{n}no.a"):
            await nc.publish(f"$JS.API.{subject}", b"", reply=inbox)
            msg = await raw.next_msg(timeout=3)
            out.append((dict(msg.headers or {}), msg.data))
        return out

    await assert_same(targets, case, unique)


async def test_direct_get_batch_and_multi_last(targets: dict[str, str], unique: str) -> None:
    """DIRECT.GET batches (with next_by_subj, max_bytes) and multi_last (wildcards, up_to_seq):
    Nats-Num-Pending / Nats-Last-Sequence on each message, a 204 EOB status at the end; no_hdr."""

    async def case(nc: Client, name: str) -> Any:
        js = nc.jetstream()
        n = name.lower()
        await js.add_stream(name=name, subjects=[f"{n}.>"], allow_direct=True)
        for s in "abac":
            await js.publish(f"{n}.{s}", f"v-{s}".encode())
        await api(nc, f"STREAM.MSG.DELETE.{name}", {"seq": 2})
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        out: list[Any] = []
        for body in (
            {"seq": 1, "batch": 3},
            {"seq": 2, "batch": 5, "next_by_subj": f"{n}.a"},
            {"seq": 1, "batch": 3, "max_bytes": 10},
            {"seq": 9, "batch": 2},
            {"multi_last": [f"{n}.a", f"{n}.c"]},
            {"multi_last": [f"{n}.>"], "batch": 1},
            {"multi_last": [f"{n}.*"], "up_to_seq": 2},
            {"seq": 1, "no_hdr": True},
        ):
            await nc.publish(f"$JS.API.DIRECT.GET.{name}", json.dumps(body).encode(), reply=inbox)
            got = []
            while True:
                msg = await sub.next_msg(timeout=3)
                hdrs = {k: v for k, v in (msg.headers or {}).items() if k != "Nats-Time-Stamp"}
                got.append((hdrs, msg.data))
                if not msg.headers or "Status" in msg.headers:
                    break
            out.append(got)
        return out

    await assert_same(targets, case, unique)


async def test_stream_advisories(targets: dict[str, str], unique: str) -> None:
    """STREAM.CREATED, UPDATED and DELETED advisories, and none for a repeated create or a refused
    update."""

    async def case(nc: Client, name: str) -> Any:
        sub = await nc.subscribe(f"$JS.EVENT.ADVISORY.STREAM.*.{name}")
        config = {"name": name, "subjects": [f"{name.lower()}.>"]}
        await api(nc, f"STREAM.CREATE.{name}", config)
        await api(nc, f"STREAM.CREATE.{name}", config)
        cfg = (await api(nc, f"STREAM.INFO.{name}"))["config"]
        await api(nc, f"STREAM.UPDATE.{name}", {**cfg, "storage": "memory"})
        await api(nc, f"STREAM.UPDATE.{name}", {**cfg, "max_msgs": 3})
        await api(nc, f"STREAM.DELETE.{name}")
        events: list[Any] = []
        for _ in range(3):
            msg = await sub.next_msg(timeout=3)
            body = json.loads(msg.data)
            events.append((msg.subject, body["type"], body["stream"], body["action"], sorted(body)))
        try:
            extra = await sub.next_msg(timeout=0.5)
            events.append(extra.subject)
        except TimeoutError:
            events.append("no more")
        return events

    await assert_same(targets, case, unique)


async def test_update_moves_subjects(targets: dict[str, str], unique: str) -> None:
    """After an update replaces a stream's subjects, the new subject is stored and the old one
    gets no responders."""

    async def case(nc: Client, name: str) -> Any:
        n = name.lower()
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{n}.old"]})
        cfg = (await api(nc, f"STREAM.INFO.{name}"))["config"]
        await api(nc, f"STREAM.UPDATE.{name}", {**cfg, "subjects": [f"{n}.new"]})
        out: list[Any] = [json.loads((await nc.request(f"{n}.new", b"x", timeout=5)).data)]
        try:
            await nc.request(f"{n}.old", b"x", timeout=2)
            out.append("answered")
        except NoRespondersError:
            out.append("no responders")
        out.append((await api(nc, f"STREAM.INFO.{name}"))["state"])
        return out

    await assert_same(targets, case, unique)


async def test_gets_by_time(targets: dict[str, str], unique: str) -> None:
    """MSG.GET and DIRECT.GET by `start_time` (alone: the first message at or after it, none after
    the last; with `next_by_subj`; DIRECT.GET batches), and `multi_last` with `up_to_time` (`404 No
    Results` before the first message; with `up_to_seq` too: `408 Bad Request`)."""

    async def case(nc: Client, name: str) -> Any:
        await api(
            nc,
            f"STREAM.CREATE.{name}",
            {"name": name, "subjects": [f"{name.lower()}.>"], "allow_direct": True},
        )
        js = nc.jetstream()
        times = ["2000-01-01T00:00:00Z"]
        for i in range(4):
            await js.publish(f"{name.lower()}.s{i % 2}", f"m{i}".encode())
            times.append(datetime.now(UTC).isoformat().replace("+00:00", "Z"))
            await asyncio.sleep(0.1)
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)

        async def direct(body: dict[str, Any]) -> list[Any]:
            await nc.publish(f"$JS.API.DIRECT.GET.{name}", json.dumps(body).encode(), reply=inbox)
            got: list[Any] = []
            while not got or not got[-1].get("Status", "").startswith(("2", "4")):
                msg = await sub.next_msg(timeout=3)
                got.append({k: v for k, v in (msg.headers or {}).items() if k != "Nats-Time-Stamp"})
                if not got[-1].get("Status") and "batch" not in body and "multi_last" not in body:
                    break
            return got

        out: dict[str, Any] = {}
        s0, s1 = f"{name.lower()}.s0", f"{name.lower()}.s1"
        for i, t in enumerate(times):
            get = await api(nc, f"STREAM.MSG.GET.{name}", {"start_time": t})
            out[f"get {i}"] = get.get("error") or get["message"]["seq"]
            get = await api(nc, f"STREAM.MSG.GET.{name}", {"start_time": t, "next_by_subj": s1})
            out[f"get {i} next"] = get.get("error") or get["message"]["seq"]
            out[f"direct {i}"] = await direct({"start_time": t})
            out[f"direct {i} next"] = await direct({"start_time": t, "next_by_subj": s0})
            out[f"direct {i} batch"] = await direct({"start_time": t, "batch": 2})
            out[f"multi_last {i}"] = await direct({"multi_last": [f"{name.lower()}.>"], "up_to_time": t})
        out["up_to both"] = await direct({"multi_last": [s0], "up_to_time": times[2], "up_to_seq": 1})
        out["multi_last none"] = await direct({"multi_last": ["zz.>"]})
        out["get start and seq"] = await api(nc, f"STREAM.MSG.GET.{name}", {"start_time": times[1], "seq": 2})
        return out

    out = await same(targets, case, unique)
    assert out["get 2"] == 3


ARCHIVE_REQUESTS: list[tuple[str, Any]] = [
    ("SNAPSHOT.{s}", b""),
    ("SNAPSHOT.{s}", {}),
    ("SNAPSHOT.NOSUCH", {"deliver_subject": "x"}),  # the stream is looked up before the body is read
    ("SNAPSHOT.{s}", b"[1]"),
    ("SNAPSHOT.{s}", {"bogus": 1}),
    ("SNAPSHOT.{s}", {"deliver_subject": "a", "chunk_size": "x"}),
    ("SNAPSHOT.{s}", {"no_consumers": True}),  # no deliver subject
    ("SNAPSHOT.{s}", {"deliver_subject": "a.*"}),
    ("SNAPSHOT.{s}", {"deliver_subject": "a b"}),
    ("RESTORE.R{s}", b""),
    ("RESTORE.R{s}", {}),
    ("RESTORE.R{s}", b"[1]"),
    ("RESTORE.R{s}", {"bogus": 1}),
    ("RESTORE.R{s}", {"config": [1]}),
    ("RESTORE.R{s}", {"config": {"bogus": 1}}),
    ("RESTORE.R{s}", {"config": {"max_msgs": "x"}}),
    ("RESTORE.R{s}", {"config": {"retention": "bogus"}}),
    ("RESTORE.R{s}", {"config": {"name": "OTHER"}}),
    ("RESTORE.R{s}", {"config": {"subjects": ["a.>", "a.b"]}}),  # checked as a create's config
    ("RESTORE.R{s}", {"state": [1]}),
    ("RESTORE.R{s}", {"state": {"bogus": 1}}),
    ("RESTORE.R{s}", {"state": {"deleted": ["x"]}}),
    ("RESTORE.R{s}", {"state": {"lost": {"msgs": [1], "bogus": 2}}}),
    ("RESTORE.R{s}", {"state": {"first_ts": "x"}}),
    ("RESTORE.R{s}", {"state": {"subjects": []}}),
    ("RESTORE.{s}", {"config": {"subjects": ["x.>"]}}),  # the stream exists
]


async def test_snapshot_and_restore_requests(targets: dict[str, str], unique: str) -> None:
    """STREAM.SNAPSHOT and STREAM.RESTORE requests are checked as the server checks them, in its
    order: an empty body (10003), the stream (10059), the body as its Go struct (10025), the
    deliver subject (10015); a restore's name (10056), config (as a create's) and an existing
    stream (10130)."""

    async def case(nc: Client, name: str) -> Any:
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{name}.>"]})
        out = {}
        for subject, body in ARCHIVE_REQUESTS:
            asked = "STREAM." + subject.replace("{s}", name)
            answer = await api(nc, asked, body)
            out[f"{asked} {body!r}"] = answer
        return out

    out = await same(targets, case, unique)
    assert all("error" in answer for answer in out.values())
    assert out[f"STREAM.RESTORE.{unique} {{'config': {{'subjects': ['x.>']}}}}"]["error"]["err_code"] == 10130
