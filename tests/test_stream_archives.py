"""Stream snapshot and restore (``$JS.API.STREAM.SNAPSHOT`` / ``RESTORE``) over the server's chunked
protocol, driven by a plain client (:mod:`tests.archive_protocol`) against the real JetStream and
jetlake: the protocol's steps, a snapshot → delete → restore on the same server giving back the
same stream, messages and consumers, flow control, advisories, and the errors."""

from __future__ import annotations

import asyncio
import base64
import json
import random
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError

from tests.archive_protocol import Restored, Snapshot, restore, snapshot
from tests.differential import api, assert_same
from tests.harness import Jetlake, scrub


async def _fill(nc: Client, name: str) -> None:
    """A stream with interior and trailing removed messages, headers, two subjects, and two
    consumers: one with a delivered, acked, pending and redelivered history, one untouched."""
    rnd = random.Random(name)
    await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{name}.>"]})
    js = nc.jetstream()
    for i in range(12):
        headers = {"K": str(i)} if i % 3 == 0 else None
        await js.publish(f"{name}.{i % 2}", rnd.randbytes(700), headers=headers)
    for seq in (2, 12):
        await api(nc, f"STREAM.MSG.DELETE.{name}", {"seq": seq})
    await api(
        nc,
        f"CONSUMER.CREATE.{name}.C",
        {"stream_name": name, "config": {"durable_name": "C", "ack_policy": "explicit", "max_deliver": 5}},
    )
    await api(
        nc,
        f"CONSUMER.CREATE.{name}.N",
        {
            "stream_name": name,
            "config": {"durable_name": "N", "ack_policy": "explicit", "deliver_policy": "new"},
        },
    )
    sub = await js.pull_subscribe_bind("C", name)
    first = await sub.fetch(4, timeout=2)
    await first[0].ack_sync()
    await first[2].ack_sync()
    await first[1].nak()
    await nc.flush()
    # the nak'd one again and the six left, in whatever order the servers place the redelivery
    seen: list[int] = []
    while len(seen) < 7:
        seen += [m.metadata.sequence.stream for m in await sub.fetch(1, timeout=2)]
    assert sorted(seen) == [3, 6, 7, 8, 9, 10, 11]
    await sub.unsubscribe()


async def _messages(nc: Client, name: str, last: int) -> list[Any]:
    out: list[Any] = []
    for seq in range(1, last + 1):
        got = await api(nc, f"STREAM.MSG.GET.{name}", {"seq": seq})
        if "error" in got:
            out.append(got["error"]["err_code"])
            continue
        m = got["message"]
        out.append((m["seq"], m["subject"], m.get("hdrs"), base64.b64decode(m["data"])))
    return out


async def _look(nc: Client, name: str) -> dict[str, Any]:
    info = await api(nc, f"STREAM.INFO.{name}")
    return {
        "state": info["state"],
        "config": info["config"],
        "consumers": {c: scrub(await api(nc, f"CONSUMER.INFO.{name}.{c}")) for c in ("C", "N")},
        "messages": await _messages(nc, name, info["state"]["last_seq"]),
    }


async def _random_messages(nc: Client, name: str) -> None:
    """A stream of eight 1,000-byte messages that do not compress: an archive of several KiB."""
    await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{name}.>"]})
    js = nc.jetstream()
    rnd = random.Random(name)
    for _ in range(8):
        await js.publish(f"{name}.a", rnd.randbytes(1000))


def _restored(taken: Restored) -> dict[str, Any]:
    answer = dict(taken.answer)
    answer["deliver_subject"] = answer["deliver_subject"].rsplit(".", 1)[0]
    return {
        "answer": answer,
        "chunk replies": set(map(repr, taken.chunk_replies)),
        "final": scrub(taken.final),
    }


async def test_snapshot_delete_restore_gives_the_same_stream(targets: dict[str, str], unique: str) -> None:
    """Snapshot → delete → restore on the same server: the snapshot answer, the chunk and ack
    protocol (1 KiB chunks, replies ``$JS.SNAPSHOT.ACK.<stream>.<id>.<len>.<n>``, the short last
    chunk without one, the closing ``204``), the restore's deliver subject, empty chunk acks, the
    stream create answer, and then the same state, messages and consumer info as before, and a
    consumer that goes on where it was. Advisories as the server publishes them."""

    async def case(nc: Client, name: str) -> dict[str, Any]:
        await _fill(nc, name)
        before = await _look(nc, name)
        events: list[tuple[str, list[str]]] = []

        async def on_event(msg: Any) -> None:
            body = json.loads(msg.data)
            events.append((msg.subject, sorted(k for k in body if k != "client")))

        adv = await nc.subscribe(f"$JS.EVENT.ADVISORY.STREAM.*.{name}", cb=on_event)
        taken = await snapshot(nc, name, {"chunk_size": 1024})
        await api(nc, f"STREAM.DELETE.{name}")
        restored = await restore(nc, name, taken.answer["config"], taken.archive)
        after = await _look(nc, name)
        await nc.flush()
        await asyncio.sleep(0.2)
        await adv.unsubscribe()
        js = nc.jetstream()
        published = [(await js.publish(f"{name}.new", b"n")).seq for _ in range(2)]
        sub = await js.pull_subscribe_bind("C", name)
        more = [
            (m.metadata.sequence.stream, m.metadata.sequence.consumer) for m in await sub.fetch(2, timeout=2)
        ]
        return {
            "snapshot": scrub(taken.answer),
            "protocol": taken.shape(),
            "chunks": len(taken.chunks) > 2,
            "restore": _restored(restored),
            "same state": scrub(after["state"]) == scrub(before["state"]),
            "same config": after["config"] == before["config"],
            "same messages": after["messages"] == before["messages"],
            "same consumers": after["consumers"] == before["consumers"],
            "consumers": after["consumers"],
            "state": scrub(after["state"]),
            "published": published,
            "next delivered": more,
            "advisories": sorted(events),
        }

    out = await assert_same(targets, case, unique)
    assert out["same state"]
    assert out["same messages"]
    assert out["same consumers"]
    assert out["chunks"]
    assert out["protocol"]["closing"] == {"Status": "204"}
    assert out["state"]["num_deleted"] == 2
    assert out["state"]["last_seq"] == 12
    assert out["published"] == [13, 14]
    assert out["next delivered"] == [(13, 12), (14, 13)]
    assert out["consumers"]["C"]["num_ack_pending"] == 8
    assert out["consumers"]["C"]["num_redelivered"] == 1


@pytest.mark.parametrize("retention", ["interest", "workqueue"])
async def test_retention_streams_keep_what_their_consumers_hold(
    targets: dict[str, str], unique: str, retention: str
) -> None:
    """An interest or work-queue stream restores with the messages its consumer had not acked
    (an interest stream without consumers would keep nothing) and the consumer's state."""

    async def case(nc: Client, name: str) -> dict[str, Any]:
        await api(
            nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{name}.>"], "retention": retention}
        )
        config = {"durable_name": "C", "ack_policy": "explicit"}
        await api(nc, f"CONSUMER.CREATE.{name}.C", {"stream_name": name, "config": config})
        js = nc.jetstream()
        for i in range(5):
            await js.publish(f"{name}.a", b"m%d" % i)
        sub = await js.pull_subscribe_bind("C", name)
        got = await sub.fetch(2, timeout=2)
        await got[0].ack_sync()
        await sub.unsubscribe()
        before = await api(nc, f"STREAM.INFO.{name}")
        taken = await snapshot(nc, name)
        await api(nc, f"STREAM.DELETE.{name}")
        restored = await restore(nc, name, taken.answer["config"], taken.archive)
        after = await api(nc, f"STREAM.INFO.{name}")
        return {
            "before": before["state"],
            "after": after["state"],
            "final": restored.final,
            "consumer": await api(nc, f"CONSUMER.INFO.{name}.C"),
            "messages": await _messages(nc, name, after["state"]["last_seq"]),
        }

    out = await assert_same(targets, case, unique)
    assert out["after"] == out["before"]
    assert out["after"]["messages"] == 4
    assert out["consumer"]["num_pending"] == 3


async def test_restored_headers_still_count(targets: dict[str, str], unique: str) -> None:
    """What stored headers ask after a restore: a ``Nats-TTL`` message still expires; the
    duplicate window starts empty (a ``Nats-Msg-Id`` stored before is not a duplicate), as the
    server's restore leaves it."""

    async def case(nc: Client, name: str) -> dict[str, Any]:
        config = {"name": name, "subjects": [f"{name}.>"], "allow_msg_ttl": True}
        await api(nc, f"STREAM.CREATE.{name}", config)
        js = nc.jetstream()
        await js.publish(f"{name}.ttl", b"short", headers={"Nats-TTL": "2s"})
        await js.publish(f"{name}.id", b"once", headers={"Nats-Msg-Id": "m1"})
        taken = await snapshot(nc, name)
        await api(nc, f"STREAM.DELETE.{name}")
        await restore(nc, name, taken.answer["config"], taken.archive)
        again = await js.publish(f"{name}.id", b"once", headers={"Nats-Msg-Id": "m1"})
        await asyncio.sleep(3)
        return {
            "duplicate": (again.seq, again.duplicate),
            "left": await _messages(nc, name, 2),
        }

    out = await assert_same(targets, case, unique)
    assert out["duplicate"] == (3, None)
    assert out["left"][0] == 10037  # expired: no message found


async def test_small_archive_has_no_reply_and_no_status(targets: dict[str, str], unique: str) -> None:
    """An archive shorter than one chunk goes out as one chunk without a reply subject, and the
    closing empty message then carries no status at all (the server sets 204 only once a full
    chunk went out); it restores to the same empty stream, its sequences where they were, and
    without its consumer (``no_consumers``)."""

    async def case(nc: Client, name: str) -> dict[str, Any]:
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{name}.>"]})
        js = nc.jetstream()
        for _ in range(3):
            await js.publish(f"{name}.a", b"")
        await api(nc, f"STREAM.PURGE.{name}")
        await api(nc, f"CONSUMER.CREATE.{name}.D", {"stream_name": name, "config": {"durable_name": "D"}})
        taken = await snapshot(nc, name, {"no_consumers": True})
        await api(nc, f"STREAM.DELETE.{name}")
        restored = await restore(nc, name, taken.answer["config"], taken.archive)
        ack = await js.publish(f"{name}.a", b"x")
        return {
            "chunks": [reply for _, reply in taken.chunks],
            "closing": taken.closing,
            "restore": _restored(restored),
            "consumers": (await api(nc, f"CONSUMER.NAMES.{name}"))["consumers"],
            "next seq": ack.seq,
        }

    out = await assert_same(targets, case, unique)
    assert out["chunks"] == [""]
    assert out["closing"] == {}
    assert out["next seq"] == 4
    assert out["consumers"] == []


async def test_unacked_chunks_end_in_no_flow_response(targets: dict[str, str], unique: str) -> None:
    """Flow control: with a window of one chunk and a client that never acks, one chunk goes out
    and after 5 s the snapshot ends with ``408 No Flow Response``."""

    async def case(nc: Client, name: str) -> dict[str, Any]:
        await _random_messages(nc, name)
        taken = await snapshot(nc, name, {"chunk_size": 1024, "window_size": 1024}, ack=False)
        return {"chunks": len(taken.chunks), "closing": taken.closing}

    assert await assert_same(targets, case, unique) == (
        {
            "chunks": 1,
            "closing": {"Status": "408", "Description": "No Flow Response"},
        }
    )


async def test_receiver_gone_ends_the_snapshot(targets: dict[str, str], unique: str) -> None:
    """A receiver that unsubscribes with a chunk unacknowledged ends the snapshot at once with
    ``408 No Interest`` (not the 5 s flow time-out): the snapshot's complete advisory says so."""

    async def case(nc: Client, name: str) -> dict[str, Any]:
        await _random_messages(nc, name)
        adv = await nc.subscribe(f"$JS.EVENT.ADVISORY.STREAM.SNAPSHOT_COMPLETE.{name}")
        inbox = nc.new_inbox()
        receiver = await nc.subscribe(inbox)
        request = {"deliver_subject": inbox, "chunk_size": 1024, "window_size": 1024}
        await api(nc, f"STREAM.SNAPSHOT.{name}", request)
        first = await receiver.next_msg(timeout=2)
        await receiver.unsubscribe()
        started = asyncio.get_running_loop().time()
        done = json.loads((await adv.next_msg(timeout=10)).data)
        return {
            "first chunk": (len(first.data), bool(first.reply)),
            "error": done.get("error"),
            "at once": asyncio.get_running_loop().time() - started < 2,
        }

    assert await assert_same(targets, case, unique) == (
        {
            "first chunk": (1024, True),
            "error": "no interest",
            "at once": True,
        }
    )


async def test_restore_errors(targets: dict[str, str], unique: str) -> None:
    """A restore refused: into an existing stream (10130, before any chunk), an archive that is
    not the server's own (500/10062, and nothing is created), an empty archive (10062). (A memory
    stream is snapshotted as a file one is, on the server too.)"""

    async def case(nc: Client, name: str) -> dict[str, Any]:
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{name}.>"]})
        existing = await restore(nc, name, {"subjects": ["elsewhere.>"]}, b"")
        config = {"name": f"R{name}", "subjects": [f"R{name}.>"]}
        garbage = await restore(nc, f"R{name}", config, b"garbage garbage garbage" * 10)
        empty = await restore(nc, f"R{name}", config, b"")
        names = await api(nc, "STREAM.NAMES", {"subject": f"R{name}.>"})
        await api(
            nc,
            f"STREAM.CREATE.M{name}",
            {"name": f"M{name}", "subjects": [f"M{name}.>"], "storage": "memory"},
        )
        memory = await snapshot(nc, f"M{name}")
        last = garbage.chunk_replies[-1] if isinstance(garbage.chunk_replies[-1], dict) else garbage.final
        assert last is not None
        assert empty.final is not None
        return {
            "existing": existing.answer,
            "garbage": (last["type"], last["error"]["code"], last["error"]["err_code"]),
            "empty": (empty.final["type"], empty.final["error"]["code"], empty.final["error"]["err_code"]),
            "streams made": names["streams"],
            "memory snapshot": memory.answer,
        }

    out = await assert_same(targets, case, unique)
    assert out["existing"]["error"]["err_code"] == 10130
    assert out["garbage"] == ("io.nats.jetstream.api.v1.stream_create_response", 500, 10062)
    assert out["streams made"] is None
    assert out["memory snapshot"]["config"]["storage"] == "memory"


async def test_a_stalled_restore_is_given_up(targets: dict[str, str], unique: str) -> None:
    """A restore that hears nothing for 5 s is given up: its subject is gone (a late chunk finds
    no responders), nothing is created, no completion advisory is published."""

    async def case(nc: Client, name: str) -> dict[str, Any]:
        adv = await nc.subscribe(f"$JS.EVENT.ADVISORY.STREAM.RESTORE_COMPLETE.{name}")
        answer = await api(nc, f"STREAM.RESTORE.{name}", {"config": {"subjects": [f"{name}.>"]}})
        subject = answer["deliver_subject"]
        first = await nc.request(subject, b"JLKARCH1", timeout=2)
        await asyncio.sleep(6)
        try:
            late: Any = (await nc.request(subject, b"", timeout=2)).data
        except NoRespondersError:
            late = "no responders"
        await nc.flush()
        return {
            "first": first.data,
            "late": late,
            "streams": (await api(nc, "STREAM.NAMES", {"subject": f"{name}.>"}))["streams"],
            "advisories": adv.pending_msgs,
        }

    assert await assert_same(targets, case, unique) == {
        "first": b"",
        "late": "no responders",
        "streams": None,
        "advisories": 0,
    }


async def test_a_copy_is_not_restored(targets: dict[str, str], unique: str) -> None:
    """Not the same as the server: a mirror or a stream with sources is refused at once (500/10062)
    where the server takes its chunks; a copy's position lives in the commits that stored its
    rows, which an archive does not carry."""
    answers = {}
    for target, url in targets.items():
        nc = await nats.connect(url)
        try:
            await api(nc, f"STREAM.CREATE.{unique}", {"name": unique, "subjects": [f"{unique}.>"]})
            for kind, config in (
                ("mirror", {"mirror": {"name": unique}}),
                ("sources", {"sources": [{"name": unique}]}),
            ):
                answers[target, kind] = await api(nc, f"STREAM.RESTORE.{kind}{unique}", {"config": config})
        finally:
            await nc.close()
    for kind in ("mirror", "sources"):
        assert answers["jetstream", kind]["deliver_subject"].startswith(
            f"$JS.SNAPSHOT.RESTORE.{kind}{unique}."
        )
        assert answers["jetlake", kind]["error"] == {
            "code": 500,
            "err_code": 10062,
            "description": "restore failed: jetlake does not restore a mirror or a stream with sources",
        }


async def test_another_servers_archive_is_refused_at_its_first_chunk(
    targets: dict[str, str], unique: str
) -> None:
    """The real server's archive (its file store's format) restored into jetlake: the first chunk
    is answered at once with 500/10062 and a reason, nothing waits for a time-out, nothing is
    created; jetlake's own archive is refused by the real server likewise (after its last chunk)."""
    taken: dict[str, Snapshot] = {}
    for target, url in targets.items():
        nc = await nats.connect(url)
        try:
            await api(nc, f"STREAM.CREATE.{unique}", {"name": unique, "subjects": [f"{unique}.>"]})
            await nc.jetstream().publish(f"{unique}.a", b"x" * 5000)
            taken[target] = await snapshot(nc, unique)
        finally:
            await nc.close()
    crossed: dict[str, Restored] = {}
    for target, other in (("jetlake", "jetstream"), ("jetstream", "jetlake")):
        nc = await nats.connect(targets[target])
        try:
            config = {"name": f"X{unique}", "subjects": [f"X{unique}.>"]}
            crossed[target] = await restore(nc, f"X{unique}", config, taken[other].archive, chunk=1024)
            names = await api(nc, "STREAM.NAMES", {"subject": f"X{unique}.>"})
            assert names["streams"] is None
        finally:
            await nc.close()
    mine = crossed["jetlake"]
    assert mine.chunk_replies == [
        {
            "type": "io.nats.jetstream.api.v1.stream_create_response",
            "error": {
                "code": 500,
                "err_code": 10062,
                "description": "restore failed: not a jetlake stream archive",
            },
        }
    ]
    theirs = crossed["jetstream"]
    refusal = theirs.chunk_replies[-1] if isinstance(theirs.chunk_replies[-1], dict) else theirs.final
    assert refusal is not None
    assert refusal["error"]["err_code"] == 10062


async def test_restored_stream_survives_a_restart(own_jetlake: Jetlake, unique: str) -> None:
    """A restore is answered once it is durable: after a ``kill -9`` right after the answer the
    stream, its messages and its consumers come back the same."""
    nc = await nats.connect(own_jetlake.url)
    try:
        await _fill(nc, unique)
        before = await _look(nc, unique)
        taken = await snapshot(nc, unique)
        await api(nc, f"STREAM.DELETE.{unique}")
        restored = await restore(nc, unique, taken.answer["config"], taken.archive)
        assert restored.final is not None
        assert "error" not in restored.final
    finally:
        await nc.close()
    await asyncio.to_thread(own_jetlake.kill_gateway)
    await asyncio.to_thread(own_jetlake.start_gateway)
    nc = await nats.connect(own_jetlake.url)
    try:
        after = await _look(nc, unique)
    finally:
        await nc.close()
    assert scrub(after["state"]) == scrub(before["state"])
    assert after["messages"] == before["messages"]
    assert after["consumers"] == before["consumers"]
