"""The leaf-node wire protocol as pure functions: frames in, bytes out, no I/O.

A leaf connection speaks a small protocol (INFO, CONNECT, PING/PONG, ``LS+``/``LS-``, ``LMSG``,
``HMSG``). The parser works on a whole buffer at a time and returns every complete frame in it,
which is what lets the ingest path keep up with a fast publisher.

The per-message work (the parser, the framing of deliveries and of PubAcks) comes compiled from
``gateway.wire._framing`` (Cython, built when the package is installed) unless
``JETLAKE_NO_EXTENSIONS`` is set or the extension was not built; then from
``gateway.wire.framing``, the same in Python. :data:`IMPLEMENTATION` says which is in use.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from gateway.wire.frames import CRLF as CRLF
from gateway.wire.frames import AckRun as AckRun
from gateway.wire.frames import Frame as Frame
from gateway.wire.frames import Info as Info
from gateway.wire.frames import Interest as Interest
from gateway.wire.frames import Msg as Msg
from gateway.wire.frames import Ping as Ping
from gateway.wire.frames import Pong as Pong
from gateway.wire.frames import ProtocolError as ProtocolError
from gateway.wire.frames import ServerError as ServerError
from gateway.wire.framing import msg_head

#: The environment variable that turns the compiled hot path off (as aiohttp's
#: ``AIOHTTP_NO_EXTENSIONS`` does): any non-empty value.
NO_EXTENSIONS_ENV = "JETLAKE_NO_EXTENSIONS"


def _compiled_wanted() -> bool:
    if os.environ.get(NO_EXTENSIONS_ENV):
        return False
    try:
        import gateway.wire._framing  # noqa: F401
    except ImportError:
        return False
    return True


if TYPE_CHECKING or not _compiled_wanted():
    from gateway.wire.framing import FrameParser as FrameParser
    from gateway.wire.framing import delivery_frames as delivery_frames
    from gateway.wire.framing import encode_msgs as encode_msgs
else:
    from gateway.wire._framing import FrameParser as FrameParser
    from gateway.wire._framing import delivery_frames as delivery_frames
    from gateway.wire._framing import encode_msgs as encode_msgs

#: ``"compiled"`` or ``"python"``: which implementation of the hot path this process runs.
IMPLEMENTATION = "compiled" if FrameParser.__module__ == "gateway.wire._framing" else "python"


def encode_connect(options: dict[str, Any]) -> bytes:
    return b"CONNECT " + json.dumps(options, separators=(",", ":")).encode() + CRLF


def encode_sub(subject: str, queue: str | None = None) -> bytes:
    return f"LS+ {subject} {queue} 1\r\n".encode() if queue else f"LS+ {subject}\r\n".encode()


def encode_unsub(subject: str, queue: str | None = None) -> bytes:
    return f"LS- {subject} {queue}\r\n".encode() if queue else f"LS- {subject}\r\n".encode()


def encode_msg(
    subject: str, reply: str, data: bytes, hdrs: bytes | None = None, queues: tuple[str, ...] = ()
) -> bytes:
    """An ``LMSG`` (or ``HMSG`` with headers) from the gateway to the server."""
    if hdrs:
        return b"".join((msg_head(subject, reply, len(data), len(hdrs), queues), hdrs, data, CRLF))
    return b"".join((msg_head(subject, reply, len(data), 0, queues), data, CRLF))
