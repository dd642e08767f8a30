"""The pure wire functions: leaf frames, ack tokens and bodies, subjects."""

from __future__ import annotations

import pytest

from gateway import acks
from gateway import protocol as proto
from gateway.subjects import is_valid_subject, subject_matches, subjects_overlap


def test_parser_handles_frames_split_anywhere() -> None:
    wire = (
        b"LS+ _INBOX.abc.*\r\nLMSG orders.new _INBOX.r1 5\r\nhello\r\n"
        b"HMSG orders.x _INBOX.r2 12 15\r\nNATS/1.0\r\n\r\nabc\r\nPING\r\nLS- _INBOX.abc.*\r\n"
    )
    for cut in range(1, len(wire)):
        parser = proto.FrameParser()
        frames = parser.feed(wire[:cut]) + parser.feed(wire[cut:])
        assert frames == [
            proto.Interest(True, "_INBOX.abc.*", None),
            proto.Msg("orders.new", "_INBOX.r1", None, b"hello"),
            proto.Msg("orders.x", "_INBOX.r2", b"NATS/1.0\r\n\r\n", b"abc"),
            proto.Ping(),
            proto.Interest(False, "_INBOX.abc.*", None),
        ]


@pytest.mark.parametrize(
    ("line", "reply"),
    [
        (b"LMSG a.b 3\r\nxyz\r\n", ""),  # no reply
        (b"LMSG a.b r.1 3\r\nxyz\r\n", "r.1"),  # plain reply
        (b"LMSG a.b + r.1 q1 q2 3\r\nxyz\r\n", "r.1"),  # reply and queue groups
        (b"LMSG a.b | q1 3\r\nxyz\r\n", ""),  # queue groups, no reply
    ],
)
def test_message_line_forms(line: bytes, reply: str) -> None:
    (frame,) = proto.FrameParser().feed(line)
    assert frame == proto.Msg("a.b", reply, None, b"xyz")


def test_encode_round_trips_through_parser() -> None:
    wire = proto.encode_msg("inbox.1", "$JS.ACK.S.C.1.2.3.4.5@orders.x", b"data", b"NATS/1.0\r\nA: b\r\n\r\n")
    (frame,) = proto.FrameParser().feed(wire)
    assert frame == proto.Msg(
        "inbox.1", "$JS.ACK.S.C.1.2.3.4.5@orders.x", b"NATS/1.0\r\nA: b\r\n\r\n", b"data"
    )


def test_unknown_operation_is_an_error() -> None:
    with pytest.raises(proto.ProtocolError):
        proto.FrameParser().feed(b"BOGUS x\r\n")


@pytest.mark.parametrize(
    ("subject", "token"),
    [
        # the 9-token form nats-server 2.15 sends without a domain
        (
            "$JS.ACK.ORD.dur.2.10.12.1700000000000000000.5",
            acks.AckToken("ORD", "dur", 2, 10, 12, 1700000000000000000, 5),
        ),
        # the newer form with domain, account hash and a random suffix
        ("$JS.ACK.hub.ACC.ORD.dur.1.3.3.17.0.xyz", acks.AckToken("ORD", "dur", 1, 3, 3, 17, 0)),
        ("$JS.ACK.ORD.dur.x.1.1.1.1", None),  # not a number
        ("$JS.API.INFO", None),  # not an ack subject
    ],
)
def test_parse_ack_subject(subject: str, token: acks.AckToken | None) -> None:
    assert acks.parse_ack_subject(subject) == token


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b"", acks.AckKind("ack")),  # an empty body is an ack
        (b"+ACK", acks.AckKind("ack")),
        (b"-NAK", acks.AckKind("nak")),
        (b'-NAK {"delay": 2000000000}', acks.AckKind("nak", delay_ns=2_000_000_000)),
        (b"+WPI", acks.AckKind("wpi")),
        (b"+TERM", acks.AckKind("term")),
        (b"+TERM bad payload", acks.AckKind("term", reason="bad payload")),
        (b"+OK", acks.AckKind("ack")),  # the legacy form
        (b"+NXT", acks.AckKind("next")),  # the rest is a pull request body, empty: batch 1
        (b"+NXT 5", acks.AckKind("next", next_request=b"5")),
        (b'+NXT {"batch": 3}', acks.AckKind("next", next_request=b'{"batch": 3}')),
        (b"whatever", None),  # ignored, as the server ignores it
    ],
)
def test_parse_ack_body(body: bytes, kind: acks.AckKind | None) -> None:
    assert acks.parse_ack_body(body) == kind


@pytest.mark.parametrize(
    ("flt", "subject", "match"),
    [
        ("orders.>", "orders.new", True),
        ("orders.>", "orders", False),  # > needs at least one token
        ("orders.*", "orders.new.eu", False),
        ("orders.*.eu", "orders.new.eu", True),
        ("*", "a", True),
        (">", "a.b.c", True),
    ],
)
def test_subject_matches(flt: str, subject: str, match: bool) -> None:
    assert subject_matches(flt, subject) is match


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("orders.>", "orders.new", True),
        ("orders.*", "orders.new.eu", False),
        ("orders.*.eu", "orders.new.*", True),
        ("a.b", "a.c", False),
        (">", "x.y", True),
    ],
)
def test_subjects_overlap(a: str, b: str, overlap: bool) -> None:
    assert subjects_overlap(a, b) is overlap
    assert subjects_overlap(b, a) is overlap


@pytest.mark.parametrize(
    ("subject", "valid"),
    [
        ("a.b", True),
        ("a.*.c", True),
        ("a.>", True),
        ("a..b", False),
        ("a.>.b", False),
        ("a b", False),
        ("", False),
    ],
)
def test_valid_subject(subject: str, valid: bool) -> None:
    assert is_valid_subject(subject) is valid
