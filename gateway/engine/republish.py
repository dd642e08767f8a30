"""``republish``: a stored message published again on another subject once it is committed, with
headers that say where it is stored, so a plain subscriber can follow a stream (and see gaps) without
a consumer. The header lines and their order are nats-server's (``processJetStreamMsg``)."""

from __future__ import annotations

from gateway.api.timefmt import rfc3339
from gateway.engine.stream import Stream
from storage_delta.commit.writer import StoredMessage
from storage_delta.format.nats import is_valid_subject

#: (subject, header block, payload) of a message to publish.
Republished = tuple[str, bytes, bytes]


def republished(stream: Stream, msg: StoredMessage, previous: int) -> Republished | None:
    """The copy of ``msg`` its stream's ``republish`` asks for, or None (no directive, another
    subject, or a destination that is not a subject a client may publish to, which the server
    skips). ``previous`` is the sequence of the message before it on its subject (0: none).

    Not into the stream's own subjects: a config can point there only through an update with an
    empty destination (which the server turns into ``>``, past its cycle check), and the copy would
    be stored and republished again without end."""
    transform = stream.republish
    if transform is None:
        return None
    target = transform.match(msg.subject)
    if not target or not is_valid_subject(target, allow_wildcards=False) or stream.captures(target):
        return None
    lines = (
        f"Nats-Stream: {stream.name}\r\nNats-Subject: {msg.subject}\r\nNats-Sequence: {msg.seq}\r\n"
        f"Nats-Time-Stamp: {rfc3339(msg.ts)}\r\nNats-Last-Sequence: {previous}\r\n"
    )
    data = msg.data
    if stream.republish_headers_only:
        lines += f"Nats-Msg-Size: {len(data)}\r\n"
        data = b""
    head = msg.hdrs[:-2] if msg.hdrs else b"NATS/1.0\r\n"  # an existing block keeps its lines first
    return target, head + lines.encode() + b"\r\n", data
