"""jetlake's stream archive format (storage_delta/format/archive.py): what it writes reads back,
and what is not one is refused with a reason, never half read."""

from __future__ import annotations

import io
import json
from typing import Any

import pyarrow as pa
import pytest

from storage_delta.format import archive

HEADER: dict[str, Any] = {
    "stream": "S",
    "config": {"name": "S"},
    "state": {"first_seq": 1, "last_seq": 9},
    "consumers": [],
}


def _rows(first: int, n: int) -> pa.Table:
    return pa.table(
        {
            "seq": pa.array(range(first, first + n), pa.int64()),
            "ts": pa.array(range(n), pa.int64()),
            "subject": [f"s.{i}" for i in range(n)],
            "hdrs": pa.array([b"NATS/1.0\r\nK: v\r\n\r\n" if i % 2 else None for i in range(n)], pa.binary()),
            "data": [bytes([i]) * i for i in range(n)],
        }
    )


def _encoded(header: dict[str, Any], batches: list[pa.Table]) -> bytes:
    return b"".join(archive.encode(header, batches))


def test_round_trip_batch_by_batch() -> None:
    raw = _encoded(HEADER, [_rows(1, 5), _rows(7, 3)])
    assert raw.startswith(archive.MAGIC)
    f = io.BytesIO(raw)
    assert archive.read_header(f) == {**HEADER, "version": archive.VERSION}
    batches = list(archive.read_batches(f))
    assert [b.num_rows for b in batches] == [5, 3]
    got = pa.Table.from_batches(batches)
    want = pa.concat_tables([_rows(1, 5), _rows(7, 3)]).cast(archive.ARCHIVE_SCHEMA)
    assert got.equals(want)


def test_an_empty_stream_has_a_header_and_no_batches() -> None:
    f = io.BytesIO(_encoded(HEADER, []))
    archive.read_header(f)
    assert list(archive.read_batches(f)) == []


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"", "not a jetlake stream archive"),
        (b"\xff\x06\x00\x00sNaPpY", "not a jetlake stream archive"),  # an s2 stream, as the server's
        (archive.MAGIC + (100).to_bytes(8, "big") + b"{}", "ends inside its header"),
        (archive.MAGIC + (3).to_bytes(8, "big") + b"{x}", "does not parse"),
        (archive.MAGIC + (2).to_bytes(8, "big") + b"[]", "not an object"),
    ],
)
def test_what_is_not_an_archive_is_refused(raw: bytes, why: str) -> None:
    with pytest.raises(archive.NotAnArchive, match=why):
        archive.read_header(io.BytesIO(raw))


@pytest.mark.parametrize(
    ("header", "why"),
    [
        ({**HEADER, "version": 2}, "version"),
        ({**{k: v for k, v in HEADER.items() if k != "config"}, "version": 1}, "no config"),
        ({**HEADER, "state": {}, "version": 1}, "no last sequence"),
    ],
)
def test_a_header_it_cannot_restore_is_refused(header: dict[str, Any], why: str) -> None:
    head = json.dumps(header).encode()
    raw = archive.MAGIC + len(head).to_bytes(8, "big") + head
    with pytest.raises(archive.NotAnArchive, match=why):
        archive.read_header(io.BytesIO(raw))


def test_damaged_messages_are_refused() -> None:
    raw = _encoded(HEADER, [_rows(1, 50)])
    f = io.BytesIO(raw[: len(raw) - 40])
    archive.read_header(f)
    with pytest.raises(archive.NotAnArchive, match="do not parse"):
        list(archive.read_batches(f))


def test_the_magic_is_checked_on_a_first_chunk_of_any_length() -> None:
    archive.check_magic(archive.MAGIC[:3])  # so far so good: the rest may come in the next chunk
    with pytest.raises(archive.NotAnArchive):
        archive.check_magic(b"JLX")
