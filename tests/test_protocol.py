"""The pure wire functions: leaf frames, ack tokens and bodies, subjects. The per-message ones
run on both implementations, the Python one (``gateway.wire.framing``) and the compiled one
(``gateway.wire._framing``), which must give the same frames and bytes."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import pytest

from gateway.wire import _framing, acks, framing
from gateway.wire import protocol as proto
from gateway.wire.leaf import Interest
from storage_delta.format.nats import is_valid_subject, subject_matches, subjects_overlap

IMPLEMENTATIONS = [pytest.param(framing, id="python"), pytest.param(_framing, id="compiled")]


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> ModuleType:
    """One implementation of the hot path (a test that takes it runs on both)."""
    module: ModuleType = request.param
    return module


def test_the_compiled_hot_path_is_the_one_in_use() -> None:
    """An install builds the extension (setup.py) and the gateway runs it; CI fails if it is
    missing. ``JETLAKE_NO_EXTENSIONS`` turns it off."""
    if os.environ.get(proto.NO_EXTENSIONS_ENV):
        assert proto.IMPLEMENTATION == "python"
        used: tuple[object, ...] = (framing.FrameParser, framing.delivery_frames, framing.encode_msgs)
    else:
        assert proto.IMPLEMENTATION == "compiled"
        used = (_framing.FrameParser, _framing.delivery_frames, _framing.encode_msgs)
    assert (proto.FrameParser, proto.delivery_frames, proto.encode_msgs) == used
    assert _framing.__file__.endswith(".so")  # the built module, not a source file beside it


def test_the_variable_selects_the_python_hot_path() -> None:
    code = "from gateway.wire import protocol as p; print(p.IMPLEMENTATION, p.FrameParser.__module__)"
    env = {**os.environ, proto.NO_EXTENSIONS_ENV: "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["python", "gateway.wire.framing"]


def test_parser_handles_frames_split_anywhere(impl: ModuleType) -> None:
    wire = (
        b"LS+ _INBOX.abc.*\r\nLMSG orders.new _INBOX.r1 5\r\nhello\r\n"
        b"HMSG orders.x _INBOX.r2 12 15\r\nNATS/1.0\r\n\r\nabc\r\nPING\r\nLS- _INBOX.abc.*\r\n"
    )
    for cut in range(1, len(wire)):
        parser = impl.FrameParser()
        frames = parser.feed(wire[:cut]) + parser.feed(wire[cut:])
        assert frames == [
            proto.Interest(True, "_INBOX.abc.*", None),
            proto.Msg("orders.new", "_INBOX.r1", None, b"hello"),
            proto.Msg("orders.x", "_INBOX.r2", b"NATS/1.0\r\n\r\n", b"abc"),
            proto.Ping(),
            proto.Interest(False, "_INBOX.abc.*", None),
        ]


def test_interest_follows_the_hubs_updates_and_binds_as_the_server_does() -> None:
    # the hub sends LS+ with a queue group at every change of the group's weight and one LS- when
    # it is empty: an entry, not a count; a push consumer binds to its exact subject and group only
    interest = Interest()
    for line in (b"LS+ d.x q 1\r\n", b"LS+ d.x q 2\r\n", b"LS+ d.x q 1\r\n", b"LS+ d.*\r\n"):
        (frame,) = proto.FrameParser().feed(line)
        assert isinstance(frame, proto.Interest)
        interest.add(frame.subject, frame.queue)
    assert interest.has("d.x")
    assert interest.bound("d.x", "q")
    assert not interest.bound("d.x", "")
    assert not interest.bound("d.x", "other")
    assert interest.has("d.y")
    assert not interest.bound("d.y", "")
    interest.remove("d.x", "q")
    assert interest.has("d.x")
    assert not interest.bound("d.x", "q")
    interest.remove("d.*")
    assert not interest.has("d.x")
    interest.add("d.x")
    assert interest.bound("d.x", "")
    assert not interest.bound("d.x", "q")


@pytest.mark.parametrize(
    ("line", "reply"),
    [
        (b"LMSG a.b 3\r\nxyz\r\n", ""),  # no reply
        (b"LMSG a.b r.1 3\r\nxyz\r\n", "r.1"),  # plain reply
        (b"LMSG a.b + r.1 q1 q2 3\r\nxyz\r\n", "r.1"),  # reply and queue groups
        (b"LMSG a.b | q1 3\r\nxyz\r\n", ""),  # queue groups, no reply
    ],
)
def test_message_line_forms(impl: ModuleType, line: bytes, reply: str) -> None:
    (frame,) = impl.FrameParser().feed(line)
    assert frame == proto.Msg("a.b", reply, None, b"xyz")


def test_encode_round_trips_through_parser(impl: ModuleType) -> None:
    wire = proto.encode_msg("inbox.1", "$JS.ACK.S.C.1.2.3.4.5@orders.x", b"data", b"NATS/1.0\r\nA: b\r\n\r\n")
    (frame,) = impl.FrameParser().feed(wire)
    assert frame == proto.Msg(
        "inbox.1", "$JS.ACK.S.C.1.2.3.4.5@orders.x", b"NATS/1.0\r\nA: b\r\n\r\n", b"data"
    )


@pytest.mark.parametrize(
    "line", [b"BOGUS x\r\n", b"LMSG\r\n", b"HMSG a 3\r\n", b"LMSG a x\r\n", b"LMSG a 1_\r\n"]
)
def test_unknown_operation_or_bad_line_is_an_error(impl: ModuleType, line: bytes) -> None:
    with pytest.raises(proto.ProtocolError):
        impl.FrameParser().feed(line)


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


def _plain_acks(frames: list[proto.Frame]) -> list[object]:
    """Frames with every plain ack (a message without reply to an ack subject, body ``+ACK`` or
    none, whose subject parses) as (subject, stream, consumer, seq); other frames as they are."""
    out: list[object] = []
    for f in frames:
        if isinstance(f, proto.AckRun):
            out.extend(f.acks)
            continue
        token = acks.parse_ack_subject(f.subject) if isinstance(f, proto.Msg) else None
        if isinstance(f, proto.Msg) and token and not f.reply and not f.hdrs and f.data in (b"", b"+ACK"):
            fields = (f.subject, token.stream, token.consumer, str(token.seq))
            out.append(tuple(field.encode() for field in fields))
        else:
            out.append(f)
    return out


def test_ack_runs_are_the_plain_acks_among_the_frames(impl: ModuleType) -> None:
    """Cut into runs of plain acks or not, and split across reads anywhere, the parser gives the
    same frames; what a run does not take (another body, a reply, headers, another subject form,
    lowercase) comes as a message."""
    rng = random.Random(3)
    shapes: list[Callable[[int], bytes]] = [
        lambda i: b"LMSG $JS.ACK.S.c.1.%d.%d.1700000000000000000.%d 4\r\n+ACK\r\n" % (i, i, i),
        lambda i: b"LMSG $JS.ACK.S2.d.2.%d.%d.17.0 0\r\n\r\n" % (i, i),
        lambda i: b"LMSG $JS.ACK.S.c.1.%d.%d.17.0 4\r\n-NAK\r\n" % (i, i),
        lambda i: b"LMSG $JS.ACK.S.c.1.%d.%d.17.0 _INBOX.r 4\r\n+ACK\r\n" % (i, i),
        lambda i: b"HMSG $JS.ACK.S.c.1.%d.%d.17.0 12 16\r\nNATS/1.0\r\n\r\n+ACK\r\n" % (i, i),
        lambda i: b"LMSG $JS.ACK.hub.ACC.S.c.1.%d.%d.17.0.xyz 4\r\n+ACK\r\n" % (i, i),
        lambda i: b"LMSG $JS.ACK.S.c.x.%d.1.17.0 4\r\n+ACK\r\n" % i,
        lambda i: b"lmsg $JS.ACK.S.c.1.%d.%d.17.0 4\r\n+ACK\r\n" % (i, i),
        lambda i: b"LMSG orders.new %d\r\n%s\r\n" % (len(str(i)), str(i).encode()),
        lambda i: b"PING\r\n",
    ]
    for _ in range(200):
        picked = [rng.choice(shapes[:2] * 4 + shapes) for _ in range(rng.randint(1, 30))]
        wire = b"".join(shape(i) for i, shape in enumerate(picked))
        expected = _plain_acks(impl.FrameParser().feed(wire))
        parser = impl.FrameParser(ack_runs=True)
        cuts = sorted(rng.sample(range(len(wire)), min(3, len(wire))))
        frames: list[proto.Frame] = []
        for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
            frames += parser.feed(wire[a:b])
        assert _plain_acks(frames) == expected
        in_runs = sum(len(f.acks) for f in frames if isinstance(f, proto.AckRun))
        assert in_runs == sum(shape in shapes[:2] for shape in picked)  # every one of the common form


def _random_wire(rng: random.Random, count: int) -> bytes:
    """A stream of frames of every form the hub sends (and some it does not), in random order."""
    subjects = ["orders.new", "$JS.jetlake.API.STREAM.INFO.S", "é.ü", "a"]
    out = []
    for i in range(count):
        subject, body = rng.choice(subjects), rng.randbytes(rng.randint(0, 40)).replace(b"\r\n", b"xx")
        hdrs = b"NATS/1.0\r\nK: %d\r\n\r\n" % i
        out.append(
            rng.choice(
                [
                    b"LMSG %s %d\r\n%s\r\n" % (subject.encode(), len(body), body),
                    b"LMSG %s _INBOX.r.%d %d\r\n%s\r\n" % (subject.encode(), i, len(body), body),
                    b"HMSG %s _INBOX.r %d %d\r\n%s%s\r\n"
                    % (subject.encode(), len(hdrs), len(hdrs) + len(body), hdrs, body),
                    b"HMSG %s %d %d\r\n%s%s\r\n"
                    % (subject.encode(), len(hdrs), len(hdrs) + len(body), hdrs, body),
                    b"LMSG %s + _INBOX.q q1 q2 %d\r\n%s\r\n" % (subject.encode(), len(body), body),
                    b"LMSG %s | q1 q2 q3 q4 q5 %d\r\n%s\r\n" % (subject.encode(), len(body), body),
                    b"lmsg %s\t%d\r\n%s\r\n" % (subject.encode(), len(body), body),
                    b"LMSG $JS.ACK.S.c.1.%d.%d.17.0 4\r\n+ACK\r\n" % (i, i),
                    b"LMSG $JS.ACK.S.c.1.%d.%d.17.0 0\r\n\r\n" % (i, i),
                    b"LMSG $JS.ACK.S.c.1.%d..17.0 0\r\n\r\n" % i,
                    b"LMSG $JS.ACK.S.c.1.%d.%d.17.0 5\r\n+ACK \r\n" % (i, i),
                    b"LS+ d.%d q 1\r\nLS- d.%d\r\nPING\r\nPONG\r\n+OK\r\n\r\n" % (i, i),
                    b'INFO {"server_id":"x","n":%d}\r\n' % i,
                ]
            )
        )
    return b"".join(out)


@pytest.mark.parametrize("ack_runs", [False, True])
def test_both_parsers_read_the_same_frames_split_anywhere(ack_runs: bool) -> None:
    rng = random.Random(11)
    kinds: set[type] = set()
    for _ in range(150):
        wire = _random_wire(rng, rng.randint(1, 25))
        cuts = sorted(rng.sample(range(len(wire)), min(rng.randint(0, 6), len(wire))))
        results = []
        for module in (framing, _framing):
            parser = module.FrameParser(ack_runs=ack_runs)
            frames: list[proto.Frame] = []
            for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
                frames += parser.feed(wire[a:b])
            results.append(frames)
        assert results[0] == results[1]
        kinds |= {type(f) for f in results[0]}
    assert kinds == {proto.Msg, proto.Interest, proto.Ping, proto.Pong, proto.Info} | (
        {proto.AckRun} if ack_runs else set()
    )


@dataclass
class _Stored:
    subject: str
    hdrs: bytes | None
    data: bytes
    ts: int


@dataclass
class _Delivered:
    seq: int
    cseq: int
    deliveries: int
    pending: int


@pytest.mark.parametrize("queues", [(), ("grp",)])
@pytest.mark.parametrize(("headers_only", "pin"), [(False, None), (True, None), (False, "PIN1")])
def test_both_frame_deliveries_alike(queues: tuple[str, ...], headers_only: bool, pin: str | None) -> None:
    """The same buffer and ``max_bytes`` size from both, and it parses back into the deliveries
    (stored subject after the ``@``, the ack numbers, headers and payload)."""
    rng = random.Random(5)
    run = [
        (
            _Stored(
                rng.choice(["orders.new", "é.ü", "$KV.b.k"]),
                rng.choice([None, b"", b"NATS/1.0\r\nA: b\r\n\r\n"]),
                rng.randbytes(rng.randint(0, 30)),
                rng.choice([0, 17, 1_700_000_000_123_456_789]),
            ),
            _Delivered(rng.randint(1, 10**12), i + 1, rng.randint(1, 3), rng.choice([0, 9, 2**40])),
        )
        for i in range(40)
    ]
    args = ("_INBOX.x.y", "ORDERS", "dür", queues, run, headers_only, pin)
    wire, size = framing.delivery_frames(*args)
    assert _framing.delivery_frames(*args) == (wire, size)
    frames = framing.FrameParser().feed(wire)
    assert len(frames) == len(run)
    for frame, (stored, d) in zip(frames, run, strict=True):
        assert isinstance(frame, proto.Msg)
        assert frame.subject == "_INBOX.x.y"
        token = f"$JS.ACK.ORDERS.dür.{d.deliveries}.{d.seq}.{d.cseq}.{stored.ts}.{d.pending}"
        assert frame.reply == f"{token}@{stored.subject}"
        assert frame.data == (b"" if headers_only else stored.data)
    if not headers_only and pin is None:
        assert [f.hdrs or None for f in frames if isinstance(f, proto.Msg)] == [
            s.hdrs or None for s, _ in run
        ]
        expected = sum(
            len(s.subject)
            + len(f"$JS.ACK.ORDERS.dür.{d.deliveries}.{d.seq}.{d.cseq}.{s.ts}.{d.pending}")
            + len(s.data)
            + len(s.hdrs or b"")
            for s, d in run
        )
        assert size == expected


def test_both_frame_pub_acks_alike() -> None:
    frames = [(f"_INBOX.r.{i}", b'{"stream":"S","seq":%d}' % i) for i in range(50)] + [("é", b"")]
    assert _framing.encode_msgs(frames) == framing.encode_msgs(frames)
    assert _framing.encode_msgs([]) == framing.encode_msgs([]) == b""
    parsed = framing.FrameParser().feed(framing.encode_msgs(frames))
    assert [(f.subject, f.data) for f in parsed if isinstance(f, proto.Msg)] == frames


def test_neither_frames_what_is_not_bytes(impl: ModuleType) -> None:
    """A payload that is not bytes is a TypeError in both (the compiled one reads no memory it
    was not given)."""
    with pytest.raises(TypeError):
        impl.encode_msgs([("a", None)])
    with pytest.raises(TypeError):
        impl.delivery_frames("i", "S", "c", (), [(_Stored("a", None, None, 1), _Delivered(1, 1, 1, 0))])  # type: ignore[arg-type]
