"""Priority groups on pull consumers (ADR-42) on the real JetStream and on jetlake: the same config
answers, the same pull answers (status codes and words, deliveries and their ``Nats-Pin-Id``), the
same ``priority_groups`` in consumer info, the same CONSUMER.UNPIN answers and the same PINNED and
UNPINNED advisories, each case driven over the raw API with nats-py.

Pins are random on both servers, so a result names each pin by the order it was first seen
(``pin1``, ``pin2``, ...); a pull whose body has ``"id": "PIN"`` sends the pin seen last, ``"OLD"``
the one before it. Pin times are compared as "set" or Go's zero time.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from tests.differential import api, assert_same
from tests.harness import Jetlake, ReferenceJetStream, scrub

MS = 1_000_000
S = 1000 * MS
ZERO_TIME = "0001-01-01T00:00:00Z"

# ---- config: create answers ---------------------------------------------------------------------

CONFIGS: list[tuple[str, dict[str, Any]]] = [
    # pinned_client: groups echoed in order, the 2 min default timeout, info's first group unpinned
    ("pinned_default_timeout", {"priority_policy": "pinned_client", "priority_groups": ["A", "B"]}),
    # pinned_client with its own timeout
    (
        "pinned_timeout",
        {"priority_policy": "pinned_client", "priority_groups": ["A"], "priority_timeout": 5 * S},
    ),
    # a negative timeout is read as none, then the default
    (
        "pinned_negative_timeout",
        {"priority_policy": "pinned_client", "priority_groups": ["A"], "priority_timeout": -5},
    ),
    # pedantic refuses a negative timeout instead (10157)
    (
        "pinned_negative_pedantic",
        {
            "priority_policy": "pinned_client",
            "priority_groups": ["A"],
            "priority_timeout": -5,
            "pedantic": True,
        },
    ),
    # overflow: no timeout is set for it
    ("overflow", {"priority_policy": "overflow", "priority_groups": ["A"]}),
    # prioritized keeps a timeout it is given
    (
        "prioritized_timeout",
        {"priority_policy": "prioritized", "priority_groups": ["A"], "priority_timeout": S},
    ),
    # policy none is left out of the echo, as the zero value
    ("policy_none", {"priority_policy": "none"}),
    # groups without a policy: 10196
    ("groups_without_policy", {"priority_groups": ["A"]}),
    # a timeout without a policy: 10197
    ("timeout_without_policy", {"priority_timeout": S}),
    # a policy without groups (none, or an empty list): 10159
    ("policy_without_groups", {"priority_policy": "overflow"}),
    ("policy_empty_groups", {"priority_policy": "overflow", "priority_groups": []}),
    # an empty group name: 10161
    ("empty_group_name", {"priority_policy": "overflow", "priority_groups": ["A", ""]}),
    # a name with a dot, and one of 17 characters: 10162
    ("dotted_group_name", {"priority_policy": "overflow", "priority_groups": ["a.b"]}),
    ("long_group_name", {"priority_policy": "overflow", "priority_groups": ["x" * 17]}),
    # every allowed character, 16 of them
    ("group_name_charset", {"priority_policy": "overflow", "priority_groups": ["aZ09/_=-aZ09/_=-"]}),
    # the same group twice is accepted
    ("repeated_group", {"priority_policy": "pinned_client", "priority_groups": ["A", "A"]}),
    # a push consumer with a policy: 10178
    (
        "push_with_policy",
        {"priority_policy": "overflow", "priority_groups": ["A"], "deliver_subject": "pg.push"},
    ),
    # a push consumer with groups but no policy: 10196
    ("push_groups_no_policy", {"priority_groups": ["A"], "deliver_subject": "pg.push"}),
    # an unknown policy: the decoder's 10025
    ("unknown_policy", {"priority_policy": "pinned", "priority_groups": ["A"]}),
]


@pytest.mark.parametrize(("label", "extra"), CONFIGS, ids=[c[0] for c in CONFIGS])
async def test_priority_configs(
    targets: dict[str, str], unique: str, label: str, extra: dict[str, Any]
) -> None:
    async def case(nc: Client, name: str) -> Any:
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{name.lower()}.>"]})
        cfg = {"durable_name": "c", "ack_policy": "explicit", **extra}
        pedantic = cfg.pop("pedantic", False)
        body = {"stream_name": name, "config": cfg, **({"pedantic": True} if pedantic else {})}
        created = await api(nc, f"CONSUMER.CREATE.{name}.c", body)
        listed = await api(nc, f"CONSUMER.LIST.{name}")
        return [created, listed.get("consumers")]

    await assert_same(targets, case, unique)


# ---- config: updates ----------------------------------------------------------------------------

UPDATES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    # the policy and groups may change on an update; the req level follows
    ("none_to_overflow", {}, {"priority_policy": "overflow", "priority_groups": ["A"]}),
    # a pinned consumer becomes prioritized, keeping its timeout
    (
        "pinned_to_prioritized",
        {"priority_policy": "pinned_client", "priority_groups": ["A"]},
        {"priority_policy": "prioritized", "priority_groups": ["A", "B"], "priority_timeout": 120 * S},
    ),
    # and back to none
    ("overflow_to_none", {"priority_policy": "overflow", "priority_groups": ["A"]}, {}),
]


@pytest.mark.parametrize(("label", "first", "then"), UPDATES, ids=[u[0] for u in UPDATES])
async def test_priority_updates(
    targets: dict[str, str], unique: str, label: str, first: dict[str, Any], then: dict[str, Any]
) -> None:
    async def case(nc: Client, name: str) -> Any:
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{name.lower()}.>"]})
        out = []
        for extra in (first, then):
            cfg = {"durable_name": "c", "ack_policy": "explicit", **extra}
            out.append(await api(nc, f"CONSUMER.CREATE.{name}.c", {"stream_name": name, "config": cfg}))
        return out

    await assert_same(targets, case, unique)


# ---- pulls, pins, unpins ------------------------------------------------------------------------

PINNED = {"priority_policy": "pinned_client", "priority_groups": ["A", "B"]}
OVERFLOW = {"priority_policy": "overflow", "priority_groups": ["A"]}
PRIORITIZED = {"priority_policy": "prioritized", "priority_groups": ["A"]}


def pull(**fields: Any) -> dict[str, Any]:
    """A JSON pull request: batch 1 and half a second unless told."""
    return {"batch": 1, "expires": 500 * MS, **fields}


# A step: ("req", label, body) sends a pull request; ("got", label, n) waits for n messages (or a
# status) on it, 2 s at most; ("pull", body, n) is both at once; ("pub", n) stores n messages;
# ("unpin", group); ("info",) takes the consumer's numbers and priority groups; ("sleep", s).
Step = tuple[Any, ...]

PULLS: list[tuple[str, dict[str, Any], int, list[Step]]] = [
    # pinned: a JSON pull without a group, or with one the consumer lacks, is a 400
    ("pinned_group_missing", PINNED, 2, [("pull", pull(), 1), ("pull", pull(group="C"), 1), ("info",)]),
    # the policies' own fields on another policy, and a priority out of 0..9, are 400s
    (
        "fields_on_wrong_policy",
        PINNED,
        2,
        [
            ("pull", pull(group="A", min_pending=1), 1),
            ("pull", pull(group="A", min_ack_pending=1), 1),
            ("pull", pull(group="A", priority=10), 1),
            ("pull", pull(group="A", priority=-1), 1),
        ],
    ),
    # no policy: an id or min_pending is refused, a priority out of range too; group and priority
    # alone are served
    (
        "no_policy",
        {},
        3,
        [
            ("pull", pull(id="x"), 1),
            ("pull", pull(min_pending=1), 1),
            ("pull", pull(priority=10), 1),
            ("pull", pull(group="anything", priority=3), 1),
        ],
    ),
    # the first puller is pinned: its deliveries carry the pin, info shows it, PINNED is advised
    ("first_puller_pinned", PINNED, 3, [("pull", pull(group="A", batch=2), 2), ("info",)]),
    # the holder keeps getting messages when it names its pin, in either of the groups
    (
        "holder_served",
        PINNED,
        3,
        [
            ("pull", pull(group="A"), 1),
            ("pull", pull(group="A", id="PIN"), 1),
            ("pull", pull(group="B", id="PIN"), 1),
        ],
    ),
    # while pinned, another id is refused at once (423 Nats-Pin-Id mismatch), a pull without an id waits (408)
    (
        "others_while_pinned",
        PINNED,
        3,
        [
            ("pull", pull(group="A"), 1),
            ("pull", pull(group="A", id="other"), 1),
            ("pull", pull(group="B"), 1),
            ("info",),
        ],
    ),
    # a no_wait pull that must wait for the pin ends with 404 (without expires) or 408 (with)
    (
        "no_wait_while_pinned",
        PINNED,
        2,
        [
            ("pull", pull(group="A"), 1),
            ("pull", {"batch": 1, "group": "A", "no_wait": True}, 1),
            ("pull", pull(group="A", no_wait=True), 1),
            ("info",),
        ],
    ),
    # an id before any pin: 423 Nats-Wrong-Pin-Id with the pending counts, when a message is there to give
    ("id_before_any_pin", PINNED, 1, [("pull", pull(group="A", id="stale", batch=3), 1), ("info",)]),
    # a pull that is not JSON has no group: served with an empty Nats-Pin-Id, and no pin is given
    ("plain_pull_on_pinned", PINNED, 2, [("pull", b"1", 1), ("pull", b"", 1), ("info",)]),
    # a waiting holder is served when a message comes, a waiting puller without the pin is not
    (
        "waiting_holder_served",
        PINNED,
        1,
        [
            ("pull", pull(group="A"), 1),
            ("req", "other", pull(group="A", expires=S)),
            ("req", "holder", pull(group="A", id="PIN", expires=S)),
            ("sleep", 0.2),
            ("info",),
            ("pub", 1),
            ("got", "holder", 1),
            ("got", "other", 1),
        ],
    ),
    # max_bytes counts a delivery before its Nats-Pin-Id is added: two fit in 250 bytes, the third
    # ends the request with a 409
    ("pinned_max_bytes", PINNED, 3, [("pull", pull(group="A", batch=5, max_bytes=250), 4)]),
    # a request given the pin for a message too big for its max_bytes gets a 409 and gives the pin
    # back (no UNPINNED); the next puller gets a new one
    (
        "pinned_too_big_gives_pin_back",
        PINNED,
        2,
        [("pull", pull(group="A", max_bytes=10), 1), ("info",), ("pull", pull(group="A"), 1), ("info",)],
    ),
    # UNPIN: the pin goes (UNPINNED, reason admin); the old id is refused, the next puller gets a new pin
    (
        "unpin_moves_pin",
        PINNED,
        3,
        [
            ("pull", pull(group="A"), 1),
            ("unpin", "A"),
            ("info",),
            ("pull", pull(group="A", id="PIN"), 1),
            ("pull", pull(group="B"), 1),
            ("pull", pull(group="B", id="OLD"), 1),
            ("info",),
        ],
    ),
    # UNPIN of another of its groups unpins too; with no pin it is still answered and advised
    (
        "unpin_other_group",
        PINNED,
        1,
        [("unpin", "B"), ("pull", pull(group="A"), 1), ("unpin", "B"), ("info",)],
    ),
    # UNPIN of a group it lacks is 10160; an overflow consumer's group can be unpinned
    ("unpin_unknown_group", OVERFLOW, 0, [("unpin", "Z"), ("unpin", "A")]),
    # a waiting puller without an id is pinned as soon as UNPIN frees the pin
    (
        "unpin_pins_waiting",
        PINNED,
        2,
        [
            ("pull", pull(group="A"), 1),
            ("req", "next", pull(group="A", expires=2 * S)),
            ("sleep", 0.2),
            ("unpin", "A"),
            ("got", "next", 1),
            ("info",),
        ],
    ),
    # overflow: min_pending above what is pending waits (408), at it is served
    (
        "overflow_min_pending",
        OVERFLOW,
        3,
        [("pull", pull(group="A", min_pending=4), 1), ("pull", pull(group="A", min_pending=3), 1), ("info",)],
    ),
    # overflow: a no_wait pull whose limits are not met ends with 404 (without expires) or 408 (with)
    (
        "overflow_no_wait",
        OVERFLOW,
        2,
        [
            ("pull", {"batch": 1, "group": "A", "no_wait": True, "min_pending": 5}, 1),
            ("pull", pull(group="A", no_wait=True, min_ack_pending=5), 1),
        ],
    ),
    # overflow: a batch with min_pending is served only while enough stays pending, then times out
    ("overflow_batch_stops", OVERFLOW, 4, [("pull", pull(group="A", batch=4, min_pending=3), 3)]),
    # overflow: min_ack_pending is met once that many deliveries await their ack
    (
        "overflow_min_ack_pending",
        OVERFLOW,
        5,
        [
            ("pull", pull(group="A", min_ack_pending=1), 1),
            ("pull", pull(group="A", batch=2), 2),
            ("pull", pull(group="A", min_ack_pending=3), 1),
            ("pull", pull(group="A", min_ack_pending=2, min_pending=9), 1),
        ],
    ),
    # overflow without limits is served as a plain pull
    ("overflow_plain", OVERFLOW, 2, [("pull", pull(group="A", batch=2), 2)]),
    # prioritized: waiting requests are served by priority, 0 first, whatever their order of arrival
    (
        "prioritized_order",
        PRIORITIZED,
        0,
        [
            ("req", "p5", pull(group="A", priority=5, expires=2 * S)),
            ("req", "p1", pull(group="A", priority=1, expires=2 * S)),
            ("req", "p3", pull(group="A", priority=3, expires=2 * S)),
            ("sleep", 0.2),
            ("pub", 1),
            ("got", "p1", 1),
            ("pub", 1),
            ("got", "p3", 1),
            ("pub", 1),
            ("got", "p5", 1),
        ],
    ),
    # prioritized: requests of one priority take a message each in turn, before a lower priority
    (
        "prioritized_turns",
        PRIORITIZED,
        0,
        [
            ("req", "first", pull(group="A", priority=1, batch=2, expires=2 * S)),
            ("req", "second", pull(group="A", priority=1, batch=2, expires=2 * S)),
            ("req", "low", pull(group="A", priority=2, expires=2 * S)),
            ("sleep", 0.2),
            ("pub", 5),
            ("got", "first", 2),
            ("got", "second", 2),
            ("got", "low", 1),
        ],
    ),
    # prioritized: a JSON pull without a group is a 400; within a priority the oldest first; a
    # pull that is not JSON (no priority) after every priority
    (
        "prioritized_ties_and_plain",
        PRIORITIZED,
        0,
        [
            ("req", "nogroup", b'{"batch":1,"expires":2000000000}'),
            ("got", "nogroup", 1),
            ("req", "bare", b"1"),
            ("req", "first9", pull(group="A", priority=9, expires=2 * S)),
            ("req", "second9", pull(group="A", priority=9, expires=2 * S)),
            ("sleep", 0.2),
            ("pub", 1),
            ("got", "first9", 1),
            ("pub", 1),
            ("got", "second9", 1),
            ("pub", 1),
            ("got", "bare", 1),
        ],
    ),
]


class Run:
    """One case on one server: its pulls' inboxes, what arrived, the pins seen, the advisories."""

    def __init__(self, nc: Client, name: str) -> None:
        self.nc, self.name = nc, name
        self.inboxes: dict[str, asyncio.Queue[Msg]] = {}
        self.pins: list[str] = []
        self.published = 0
        self.events: list[dict[str, Any]] = []

    @classmethod
    async def start(cls, nc: Client, name: str, config: dict[str, Any], stored: int) -> Run:
        """A stream ``name`` with ``stored`` messages and consumer ``c`` with ``config``, its
        advisories followed."""
        run = cls(nc, name)
        await nc.subscribe(f"$JS.EVENT.ADVISORY.CONSUMER.*.{name}.c", cb=run.on_event)
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{name.lower()}.>"]})
        cfg = {"durable_name": "c", "ack_policy": "explicit", **config}
        created = await api(nc, f"CONSUMER.CREATE.{name}.c", {"stream_name": name, "config": cfg})
        assert "error" not in created, created
        await run.publish(stored)
        return run

    def pin_name(self, pin: str) -> str:
        if not pin:
            return ""
        if pin not in self.pins:
            self.pins.append(pin)
        return f"pin{self.pins.index(pin) + 1}"

    async def on_event(self, msg: Msg) -> None:
        body = json.loads(msg.data)
        seen = {"subject": msg.subject, **{k: v for k, v in body.items() if k not in ("id", "timestamp")}}
        if "pinned_id" in seen:
            seen["pinned_id"] = self.pin_name(seen["pinned_id"])
        self.events.append(seen)

    async def publish(self, n: int) -> None:
        for _ in range(n):
            self.published += 1
            await self.nc.request(f"{self.name.lower()}.m", str(self.published).encode(), timeout=5)

    async def request(self, label: str, body: dict[str, Any] | bytes) -> None:
        if isinstance(body, dict) and body.get("id") in ("PIN", "OLD"):
            body = {**body, "id": self.pins[-1 if body["id"] == "PIN" else -2]}
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        queue: asyncio.Queue[Msg] = asyncio.Queue()
        self.inboxes[label] = queue
        inbox = self.nc.new_inbox()

        async def on(msg: Msg) -> None:
            await queue.put(msg)

        await self.nc.subscribe(inbox, cb=on)
        await self.nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{self.name}.c", data, reply=inbox)

    async def got(self, label: str, n: int) -> list[Any]:
        """Up to ``n`` messages of a request (2 s at most each), ending at a status."""
        out: list[Any] = []
        queue = self.inboxes[label]
        while len(out) < n:
            try:
                msg = await asyncio.wait_for(queue.get(), 2)
            except TimeoutError:
                out.append("nothing")
                break
            hdrs = dict(msg.headers or {})
            if "Status" in hdrs:
                out.append({k: v for k, v in hdrs.items()})
                break
            pin = hdrs.pop("Nats-Pin-Id", None)
            out.append(
                {"data": msg.data.decode(), "pin": None if pin is None else self.pin_name(pin), **hdrs}
            )
        return out

    async def info(self) -> dict[str, Any]:
        info = await api(self.nc, f"CONSUMER.INFO.{self.name}.c")
        groups = info.get("priority_groups")
        for g in groups or []:
            if "pinned_client_id" in g:
                g["pinned_client_id"] = self.pin_name(g["pinned_client_id"])
            g["pinned_ts"] = "zero" if g["pinned_ts"] == ZERO_TIME else "set"
        return {k: info.get(k) for k in ("num_ack_pending", "num_waiting", "num_pending")} | {
            "groups": groups
        }

    async def step(self, step: Step) -> Any:
        kind, *args = step
        if kind == "pull":
            await self.request("pull", args[0])
            return await self.got("pull", args[1])
        if kind == "req":
            return await self.request(*args)
        if kind == "got":
            return await self.got(*args)
        if kind == "pub":
            return await self.publish(*args)
        if kind == "unpin":
            return await api(self.nc, f"CONSUMER.UNPIN.{self.name}.c", {"group": args[0]})
        if kind == "info":
            return await self.info()
        assert kind == "sleep"
        return await asyncio.sleep(args[0])


@pytest.mark.parametrize(("label", "config", "stored", "steps"), PULLS, ids=[p[0] for p in PULLS])
async def test_priority_pulls(
    targets: dict[str, str], unique: str, label: str, config: dict[str, Any], stored: int, steps: list[Step]
) -> None:
    async def case(nc: Client, name: str) -> Any:
        run = await Run.start(nc, name, config, stored)
        seen = [await run.step(step) for step in steps]
        await nc.flush()
        await asyncio.sleep(0.1)  # the last advisories
        return [seen, run.events]

    await assert_same(targets, case, unique)


# ---- waiting out priority_timeout ---------------------------------------------------------------


@pytest.mark.waits
async def test_pin_lapses_after_priority_timeout(targets: dict[str, str], unique: str) -> None:
    """A pin its holder does not pull on within ``priority_timeout`` lapses (UNPINNED, reason
    timeout); a pull by the holder before then keeps it another timeout; after the lapse the old id
    is refused and the next puller gets a new pin."""

    async def case(nc: Client, name: str) -> Any:
        run = await Run.start(nc, name, {**PINNED, "priority_timeout": S}, 4)
        seen = [await run.step(("pull", pull(group="A", expires=100 * MS), 1))]
        await asyncio.sleep(0.7)
        seen.append(await run.step(("pull", pull(group="A", id="PIN", expires=100 * MS), 1)))
        await asyncio.sleep(0.7)  # 1.4 s after the pin was given, 0.7 s after the holder's pull
        seen.append(await run.info())
        await asyncio.sleep(0.8)
        seen.append(await run.info())
        seen.append(await run.step(("pull", pull(group="A", id="PIN"), 1)))
        seen.append(await run.step(("pull", pull(group="A"), 1)))
        await asyncio.sleep(0.1)
        return [seen, run.events]

    out = await assert_same(targets, case, unique)
    assert [e["subject"].split(".")[4] for e in out[1]] == ["CREATED", "PINNED", "UNPINNED", "PINNED"]


# ---- restarts -----------------------------------------------------------------------------------


async def test_pins_do_not_outlive_a_restart(tmp_path: Path, own_jetlake: Jetlake) -> None:
    """The real server keeps a pin in memory only: after a restart (file storage) the consumer has
    none, the old id gets 423 Nats-Wrong-Pin-Id and the next puller a new pin. jetlake's gateway
    restart does the same."""
    reference = ReferenceJetStream(tmp_path / "reference")
    reference.start()
    try:
        servers: dict[str, ReferenceJetStream | Jetlake] = {"jetstream": reference, "jetlake": own_jetlake}
        results: dict[str, Any] = {}
        for target, server in servers.items():
            nc = await nats.connect(server.url)
            run = await Run.start(nc, "RESTART", PINNED, 3)
            before = [await run.step(("pull", pull(group="A"), 1)), await run.info()]
            await nc.close()
            if isinstance(server, Jetlake):
                await asyncio.to_thread(server.stop_gateway)
                await asyncio.to_thread(server.start_gateway)
            else:
                await asyncio.to_thread(server.stop)
                await asyncio.to_thread(server.start)
            nc = await nats.connect(server.url)
            run.nc = nc
            after = [
                await run.info(),
                await run.step(("pull", pull(group="A", id="PIN"), 1)),
                await run.step(("pull", pull(group="A"), 1)),
                await run.info(),
            ]
            await nc.close()
            results[target] = scrub([before, after])
        assert results["jetlake"] == results["jetstream"], results
        assert results["jetstream"][1][1][0]["Description"] == "Nats-Wrong-Pin-Id"
    finally:
        reference.stop()
