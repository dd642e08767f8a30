"""jetlake's stream archive: what ``$JS.API.STREAM.SNAPSHOT`` streams out and ``STREAM.RESTORE``
takes back (docs/storage.md, *Stream archives*).

The file store's archive (an s2-compressed tar of its blocks) means nothing to a Delta store, so
jetlake writes its own: an 8-byte magic, the header's length (8 bytes, big-endian), the header
(JSON: the stream's config, state and consumers' configs and positions) and the stream's live
messages as one Arrow IPC stream (zstd-compressed batches of ``seq``, ``ts``, ``subject``,
``hdrs``, ``data``). The magic comes first so a restore can refuse another archive at its first
chunk. Pure encoding: no I/O beyond the file object a reader is given.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator
from typing import IO, Any

import pyarrow as pa

MAGIC = b"JLKARCH1"
#: The format's version, in the header: a restore refuses one it does not know.
VERSION = 1
_LEN = 8

ARCHIVE_SCHEMA = pa.schema(
    [
        ("seq", pa.uint64()),
        ("ts", pa.int64()),
        ("subject", pa.string()),
        ("hdrs", pa.binary()),
        ("data", pa.binary()),
    ]
)


class NotAnArchive(ValueError):
    """The bytes are not a jetlake stream archive (another server's, or damaged)."""


class _Pieces(io.RawIOBase):
    """A write-only sink that keeps what was written until taken (the IPC writer's target)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.parts.append(bytes(b))
        return len(self.parts[-1])

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


def encode(header: dict[str, Any], batches: Iterable[pa.Table]) -> Iterator[bytes]:
    """The archive as successive pieces: the magic and header first, then each batch of messages
    as the IPC stream writes it (so a writer holds one batch at a time, never the whole stream)."""
    head = json.dumps({**header, "version": VERSION}, separators=(",", ":")).encode()
    yield MAGIC + len(head).to_bytes(_LEN, "big") + head
    sink = _Pieces()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), ARCHIVE_SCHEMA, options=options) as writer:
        for batch in batches:
            writer.write_table(batch.select(ARCHIVE_SCHEMA.names).cast(ARCHIVE_SCHEMA))
            if piece := sink.take():
                yield piece
    if piece := sink.take():
        yield piece


def check_magic(prefix: bytes) -> None:
    """Raise :class:`NotAnArchive` unless ``prefix`` (the archive's first bytes, at least
    ``len(MAGIC)`` of them or all there are) starts a jetlake archive."""
    if not MAGIC.startswith(prefix[: len(MAGIC)]) or not prefix:
        raise NotAnArchive("not a jetlake stream archive")


def read_header(f: IO[bytes]) -> dict[str, Any]:
    """The header of the archive ``f`` is positioned at the start of; ``f`` is left at the
    messages."""
    check_magic(f.read(len(MAGIC)))
    size = int.from_bytes(f.read(_LEN), "big")
    raw = f.read(size)
    if len(raw) != size:
        raise NotAnArchive("the archive ends inside its header")
    try:
        header: dict[str, Any] = json.loads(raw)
    except ValueError as exc:
        raise NotAnArchive(f"the archive's header does not parse: {exc}") from None
    if not isinstance(header, dict):
        raise NotAnArchive("the archive's header is not an object")
    if header.get("version") != VERSION:
        raise NotAnArchive(f"archive version {header.get('version')!r} is not {VERSION}")
    state, consumers = header.get("state"), header.get("consumers")
    if not isinstance(header.get("config"), dict) or not isinstance(consumers, list):
        raise NotAnArchive("the archive's header has no config or consumers")
    if not isinstance(state, dict) or not isinstance(state.get("last_seq"), int):
        raise NotAnArchive("the archive's header has no last sequence")
    return header


def read_batches(f: IO[bytes]) -> Iterator[pa.RecordBatch]:
    """The messages after the header, batch by batch."""
    try:
        reader = pa.ipc.open_stream(f)
    except (pa.ArrowInvalid, OSError) as exc:
        raise NotAnArchive(f"the archive's messages do not parse: {exc}") from None
    if not reader.schema.equals(ARCHIVE_SCHEMA):
        raise NotAnArchive("the archive's messages have another schema")
    while True:
        try:
            yield reader.read_next_batch()
        except StopIteration:
            return
        except (pa.ArrowInvalid, OSError) as exc:
            raise NotAnArchive(f"the archive's messages do not parse: {exc}") from None
