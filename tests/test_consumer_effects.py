"""The consumer's answers as effects (no servers): what an ack, a pull request and a timer run ask
the delivery adapter to do, in order. The same cases run end to end against the real server in the
differential consumer tests; these pin the decisions on their own."""

from __future__ import annotations

import json

from gateway.engine import consumer_effects as ce
from gateway.engine.consumer import Consumer
from gateway.engine.flow_control import WINDOW, FlowControl
from gateway.wire import acks
from gateway.wire.leaf import Interest
from storage_delta.tables import acklog as al
from tests.test_consumer_model import NS, _consumer, _stream, _take


def _token(c: Consumer, seq: int, deliveries: int = 1) -> acks.AckToken:
    p = c.pending[seq]
    return acks.AckToken(c.stream.name, c.name, deliveries, seq, p.cseq, 0, 0)


def _kinds(effects: list[ce.Effect]) -> list[str]:
    return [type(e).__name__ for e in effects]


def _event_type(effect: ce.Effect) -> str:
    assert isinstance(effect, ce.Advisory)
    return str(json.loads(effect.payload)["type"])


def _listening(*subjects: str) -> Interest:
    """The leaf's view of the server's subscriptions: plain subscribers on ``subjects``."""
    interest = Interest()
    for subject in subjects:
        interest.add(subject)
    return interest


NOBODY = Interest()


def test_ack_with_reply_records_a_row_answered_once_durable() -> None:
    # AckSync: one ack row carrying the reply; nothing else is due (no listener)
    c = _consumer(_stream(2))
    _take(c)
    effects = ce.ack(c, [c], _token(c, 1), acks.PLAIN_ACK, "_INBOX.r", 5)
    assert effects == [ce.RecordAck(al.ACK, 1, True, "_INBOX.r")]
    # a second ack of the same message changes nothing, but its reply still waits for durability
    again = ce.ack(c, [c], acks.AckToken("M", "c", 1, 1, 1, 0, 0), acks.PLAIN_ACK, "_INBOX.s", 6)
    assert again == [ce.RecordAck(al.ACK, 1, False, "_INBOX.s")]


def test_nak_with_delay_sends_the_advisory_records_the_delay_and_wakes_the_timer() -> None:
    # -NAK {"delay": …}: MSG_NAKED advisory, a nak row with the delay, the timer due at the delay
    c = _consumer(_stream(1), ack_wait=30 * NS)
    _take(c)
    effects = ce.ack(c, [c], _token(c, 1), acks.AckKind("nak", delay_ns=2 * NS), "", NS)
    assert _kinds(effects) == ["Advisory", "RecordAck", "WakeBy"]
    assert _event_type(effects[0]) == "io.nats.jetstream.advisory.v1.nak"
    assert effects[1:] == [ce.RecordAck(al.NAK, 1, True, "", 2 * NS), ce.WakeBy(3 * NS)]


def test_term_sends_the_reason_and_acks_underneath() -> None:
    # +TERM reason: MSG_TERMINATED with the reason; the message is settled like an ack
    c = _consumer(_stream(2))
    _take(c)
    effects = ce.ack(c, [c], _token(c, 1), acks.AckKind("term", reason="bad"), "", 7)
    assert _kinds(effects) == ["Advisory", "RecordAck"]
    assert json.loads(effects[0].payload)["reason"] == "bad"  # type: ignore[union-attr]
    assert effects[1] == ce.RecordAck(al.TERM, 1, True)
    assert 1 not in c.pending


def test_ack_next_records_without_reply_and_takes_the_request() -> None:
    # +NXT: the ack row is not a sync ack; the reply becomes a pull request for the body
    c = _consumer(_stream(3))
    _take(c)
    effects = ce.ack(c, [c], _token(c, 1), acks.AckKind("next", next_request=b"2"), "_INBOX.n", 1)
    assert effects == [ce.RecordAck(al.ACK, 1, True), ce.TakeRequest("_INBOX.n", b"2")]


def test_an_ack_that_frees_work_for_a_waiting_request_serves() -> None:
    # max_ack_pending 1: the ack frees the next message for the waiting request
    c = _consumer(_stream(2), max_ack_pending=1)
    _take(c)
    assert ce.pull_request(c, "_INBOX.p", b'{"batch":1,"expires":5000000000}', None, 0)[-1] == ce.SERVE
    effects = ce.ack(c, [c], _token(c, 1), acks.PLAIN_ACK, "", 1)
    assert effects == [ce.RecordAck(al.ACK, 1, True), ce.SERVE]


def test_ack_run_records_the_settled_rows_up_to_the_room() -> None:
    # plain acks in one run: as many as the ack log has room for are taken
    c = _consumer(_stream(3))
    for _ in range(3):
        _take(c)
    effects = ce.ack_run(c, [c], [1, 2, 3], 2, 9)
    assert effects == [ce.RecordAckRun([(1, 1, 1), (2, 2, 2)])]
    assert sorted(c.pending) == [3]


def test_pull_request_refusals_are_the_servers_statuses() -> None:
    # a push consumer refuses pulls (409); no_wait on nothing is 404; a bad body is 400
    push = _consumer(_stream(1), deliver_subject="d")
    (refused,) = ce.pull_request(push, "_INBOX.a", b"", None, 0)
    assert isinstance(refused, ce.SendStatus)
    assert (refused.status.code, refused.status.text) == (409, "Consumer is push based")
    c = _consumer(_stream(0))
    (empty,) = ce.pull_request(c, "_INBOX.b", b'{"batch":1,"no_wait":true}', None, 0)
    assert isinstance(empty, ce.SendStatus)
    assert empty.status.code == 404
    (bad,) = ce.pull_request(c, "_INBOX.c", b'{"batch":"x"}', None, 0)
    assert isinstance(bad, ce.SendStatus)
    assert bad.status.code == 400
    assert len(c.waiting) == 0


def test_tick_expires_requests_drops_exhausted_messages_and_removes_the_inactive() -> None:
    # a request past its expiry hears 408; a message out of deliveries is dropped with the
    # MAX_DELIVERIES advisory; once unseen past inactive_threshold the consumer is removed
    c = _consumer(_stream(1), ack_wait=NS, max_deliver=1, inactive_threshold=10 * NS)
    ce.pull_request(c, "_INBOX.t", b'{"batch":5,"expires":1000000000}', None, 0)
    _take(c)
    effects = ce.tick(c, _listening("_INBOX.t"), 2 * NS)
    assert _kinds(effects) == ["SendStatus", "RecordDrop", "Advisory"]
    assert effects[0].status.code == 408  # type: ignore[union-attr]
    assert effects[1] == ce.RecordDrop(1)
    assert _event_type(effects[2]) == "io.nats.jetstream.advisory.v1.max_deliver"
    assert ce.next_due(c, 2 * NS) == 2 * NS + 10 * NS + 1  # inactivity counts from the last look
    assert ce.tick(c, NOBODY, 5 * NS) == []
    assert ce.tick(c, NOBODY, 13 * NS) == [ce.REMOVE]


def test_pull_consumer_is_not_inactive_before_its_last_ack_wait_runs_out() -> None:
    # a message waiting for its ack keeps a pull consumer past its inactive_threshold: it counts as
    # seen until that ack wait is over, and goes a threshold later
    c = _consumer(_stream(1), ack_wait=30 * NS, inactive_threshold=2 * NS)
    _take(c)
    assert ce.tick(c, NOBODY, 0) == []
    assert ce.tick(c, NOBODY, 3 * NS) == []
    assert ce.next_due(c, 3 * NS) == 30 * NS  # the ack wait: the redelivery is queued
    assert ce.tick(c, NOBODY, 30 * NS) == []
    assert ce.next_due(c, 30 * NS) == 32 * NS + 1
    assert ce.tick(c, NOBODY, 32 * NS + 1) == [ce.REMOVE]


def test_push_heartbeat_while_listening_names_an_unanswered_flow_control_request() -> None:
    # idle_heartbeat on a push consumer: due a heartbeat after the last send while a subscriber listens
    c = _consumer(_stream(0), deliver_subject="d", idle_heartbeat=NS, flow_control=True)
    assert ce.tick(c, _listening("d"), 0) == []
    assert ce.next_due(c, 0) == NS
    assert ce.tick(c, _listening("d"), NS) == [ce.Heartbeat("d")]
    assert ce.tick(c, NOBODY, 3 * NS) == []  # nobody listens: no heartbeat
    flow = FlowControl("M", "c")
    request = flow.sent(WINDOW)
    beat = ce.heartbeat(c, "d", flow)
    assert (beat.status.code, beat.status.headers) == (
        100,
        {"Nats-Last-Consumer": "0", "Nats-Last-Stream": "0", "Nats-Consumer-Stalled": request},
    )


# ---- priority groups (ADR-42) -----------------------------------------------------------------

PINNED = {"priority_policy": "pinned_client", "priority_groups": ["A"], "priority_timeout": 10 * NS}


def _pull(c: Consumer, inbox: str, now: int, **fields: object) -> list[ce.Effect]:
    return ce.pull_request(c, inbox, json.dumps({"batch": 1, **fields}).encode(), None, now)


def _statuses(effects: list[ce.Effect]) -> list[tuple[str, int, str]]:
    return [(e.status.inbox, e.status.code, e.status.text) for e in effects if isinstance(e, ce.SendStatus)]


def test_the_first_puller_of_a_group_gets_the_pin_and_its_lapse_is_the_timers() -> None:
    # pinned_client: the request without an id is chosen and pinned (PINNED advisory, the timer
    # woken for the pin's lapse); a later request naming another id is refused on arrival
    c = _consumer(_stream(2), **PINNED)
    assert _pull(c, "_INBOX.a", NS, group="A") == [ce.SERVE]
    req, effects = ce.choose_request(c, NS)
    assert req is not None
    assert req.reply == "_INBOX.a"
    assert c.pin is not None
    assert _kinds(effects) == ["Advisory", "WakeBy"]
    assert _event_type(effects[0]) == "io.nats.jetstream.advisory.v1.consumer_group_pinned"
    assert effects[1] == ce.WakeBy(11 * NS)
    assert ce.next_due(c, NS) == 11 * NS
    assert _statuses(_pull(c, "_INBOX.b", 2 * NS, group="A", id="other")) == [
        ("_INBOX.b", 423, "Nats-Pin-Id mismatch")
    ]


def test_while_pinned_others_wait_and_a_stale_id_is_refused_when_a_message_is_due() -> None:
    # the holder's request is chosen over an older one without an id; a request that named a pin
    # before there was one is refused with the pending counts once a message is due
    c = _consumer(_stream(3), **PINNED)
    _pull(c, "_INBOX.stale", 0, group="A", id="gone", batch=2)
    _pull(c, "_INBOX.first", 0, group="A")
    req, effects = ce.choose_request(c, 0)
    assert req is not None
    assert req.reply == "_INBOX.first"
    assert c.pin is not None
    assert _statuses(effects) == [("_INBOX.stale", 423, "Nats-Wrong-Pin-Id")]
    c.waiting.finish(req)
    _pull(c, "_INBOX.nopin", NS, group="A")
    _pull(c, "_INBOX.holder", NS, group="A", id=c.pin.id)
    req, _ = ce.choose_request(c, NS)
    assert req is not None
    assert req.reply == "_INBOX.holder"


def test_a_pin_lapses_after_the_timeout_unless_its_holder_pulls() -> None:
    # a pull naming the pin keeps it another priority_timeout; without one it lapses (UNPINNED)
    c = _consumer(_stream(2), **PINNED)
    _pull(c, "_INBOX.a", 0, group="A")
    ce.choose_request(c, 0)
    assert c.pin is not None
    _pull(c, "_INBOX.a2", 5 * NS, group="A", id=c.pin.id)
    assert not [e for e in ce.tick(c, _listening("_INBOX.a2"), 12 * NS) if isinstance(e, ce.Advisory)]
    lapsed = [e for e in ce.tick(c, _listening("_INBOX.a2"), 15 * NS) if isinstance(e, ce.Advisory)]
    assert [json.loads(e.payload)["reason"] for e in lapsed] == ["timeout"]
    assert c.pin is None


def test_overflow_waits_until_enough_is_pending() -> None:
    # overflow: min_pending above num_pending passes the request over; at it, it is served
    c = _consumer(_stream(3), priority_policy="overflow", priority_groups=["A"])
    _pull(c, "_INBOX.four", 0, group="A", min_pending=4)
    assert ce.choose_request(c, 0) == (None, [])
    _pull(c, "_INBOX.three", 0, group="A", min_pending=3)
    req, _ = ce.choose_request(c, 0)
    assert req is not None
    assert req.reply == "_INBOX.three"


def test_prioritized_requests_queue_by_priority() -> None:
    # prioritized: 0 first, the oldest first within a priority, a request without a group last
    c = _consumer(_stream(0), priority_policy="prioritized", priority_groups=["A"])
    for inbox, prio in (("_INBOX.p5", 5), ("_INBOX.p1", 1), ("_INBOX.p1b", 1)):
        _pull(c, inbox, 0, group="A", priority=prio, expires=NS)
    ce.pull_request(c, "_INBOX.bare", b"1", None, 0)
    _pull(c, "_INBOX.p0", 0, group="A", expires=NS)
    assert [r.reply for r in c.waiting] == [
        "_INBOX.p0",
        "_INBOX.p1",
        "_INBOX.p1b",
        "_INBOX.p5",
        "_INBOX.bare",
    ]
