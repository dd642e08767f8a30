"""Reads of stored messages a consumer needs that the tail cache no longer holds.

A consumer far behind reads ahead a whole chunk of sequences in one Delta scan on the executor and
keeps it until it has moved past, so catching up costs one read per chunk, not one per message.
Once it is half-way through a chunk the next one is read in the background, so a consumer that
keeps going rarely waits for parquet. Chunks are large because a read decodes whole row groups
(64k rows): small chunks would decode the same row group again and again.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor

from gateway.engine.stream import Stream
from storage_delta.commit.writer import StoredMessage
from storage_delta.read.reader import MessageReader

CHUNK = 16384
KEEP_CHUNKS = 4

#: A chunk of a stream: its name, created time (a stream created again under the same name starts
#: its sequences over) and chunk number.
Key = tuple[str, int, int]
#: A chunk: the last sequence its read covered, and its messages by sequence.
Chunk = tuple[int, dict[int, StoredMessage]]


class ColdReader:
    def __init__(self, reader: MessageReader, executor: Executor) -> None:
        self.reader = reader
        self.executor = executor
        self._chunks: dict[Key, Chunk] = {}
        self._loading: dict[Key, asyncio.Future[Chunk]] = {}

    async def read(self, stream: Stream, seq: int) -> StoredMessage | None:
        """The stored message ``seq``, or None when it is gone (removed, or not stored)."""
        if not stream.is_live(seq):
            return None
        index = seq // CHUNK
        key = (stream.name, stream.created_ns, index)
        chunk = self._chunks.get(key)
        if chunk is None or (seq not in chunk[1] and seq > chunk[0]):
            loading = self._loading.pop(key, None)
            chunk = await (loading if loading is not None else self._load(stream, index))
            if seq not in chunk[1] and seq > chunk[0]:  # read ahead before seq was stored
                chunk = await self._load(stream, index)
            self._chunks[key] = chunk
            while len(self._chunks) > KEEP_CHUNKS:
                self._chunks.pop(next(iter(self._chunks)))
        if seq % CHUNK >= CHUNK // 2:
            self._read_ahead(stream, index + 1)
        return chunk[1].get(seq)

    def held(self, stream: Stream, seq: int) -> StoredMessage | None:
        """The stored message ``seq`` if a chunk read already holds it (None: ask :meth:`read`),
        so that a consumer catching up takes what is read in runs."""
        chunk = self._chunks.get((stream.name, stream.created_ns, seq // CHUNK))
        msg = chunk[1].get(seq) if chunk is not None and stream.is_live(seq) else None
        if msg is not None and seq % CHUNK >= CHUNK // 2:
            self._read_ahead(stream, seq // CHUNK + 1)
        return msg

    def _load(self, stream: Stream, index: int) -> asyncio.Future[Chunk]:
        first = max(index * CHUNK, 1)
        last = min(index * CHUNK + CHUNK - 1, stream.durable_last_seq)
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(
            self.executor, self._read_chunk, stream.name, first, last, stream.block_size, stream.created_ns
        )

    def _read_chunk(self, name: str, first: int, last: int, block_size: int, created_ns: int) -> Chunk:
        """On the executor: one scan, and the messages built from its columns."""
        table = self.reader.read_range(name, first, last, block_size, created_ns)
        cols = [table.column(c).to_pylist() for c in ("seq", "ts", "subject", "hdrs", "data")]
        msgs = {
            seq: StoredMessage(name, block_size, seq, ts, subject, hdrs, data)
            for seq, ts, subject, hdrs, data in zip(*cols, strict=True)
        }
        return last, msgs

    def _read_ahead(self, stream: Stream, index: int) -> None:
        key = (stream.name, stream.created_ns, index)
        if key in self._chunks or key in self._loading or index * CHUNK > stream.durable_last_seq:
            return
        while len(self._loading) >= KEEP_CHUNKS:  # a read ahead nobody came for: forget the oldest
            self._loading.pop(next(iter(self._loading)))
        fut = self._load(stream, index)
        fut.add_done_callback(_retrieve)
        self._loading[key] = fut

    async def first_seq_at(self, stream: Stream, ts_ns: int) -> int | None:
        """The first stored sequence at or after ``ts_ns`` (``deliver_policy: by_start_time``)."""
        loop = asyncio.get_running_loop()
        rows = await loop.run_in_executor(
            self.executor, self.reader.scan_index, stream.name, stream.created_ns
        )
        for seq, ts, _subject, _size in rows:
            if ts >= ts_ns and stream.is_live(seq):
                return int(seq)
        for seq in range(stream.durable_last_seq + 1, stream.state.last_seq + 1):
            msg = stream.tail.get(seq)
            if msg is not None and msg.ts >= ts_ns:
                return seq
        return None


def _retrieve(fut: asyncio.Future[Chunk]) -> None:
    """A read ahead nobody awaited must not log its failure as never retrieved; a reader that
    awaits it gets the error."""
    if not fut.cancelled():
        fut.exception()
