"""Reads of stored messages a consumer needs that the tail cache no longer holds.

A consumer far behind reads ahead a whole chunk of sequences in one Delta scan on the executor and
keeps it until it has moved past, so catching up costs one read per chunk, not one per message.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor

from gateway.stream import Stream
from storage_delta.reader import MessageReader
from storage_delta.writer import StoredMessage

CHUNK = 2048
KEEP_CHUNKS = 8


class ColdReader:
    def __init__(self, reader: MessageReader, executor: Executor) -> None:
        self.reader = reader
        self.executor = executor
        self._chunks: dict[tuple[str, int], dict[int, StoredMessage]] = {}

    async def read(self, stream: Stream, seq: int) -> StoredMessage | None:
        """The stored message ``seq``, or None when it is gone (removed, or not stored)."""
        if not stream.is_live(seq):
            return None
        key = (stream.name, seq // CHUNK)
        chunk = self._chunks.get(key)
        if chunk is None or (seq not in chunk and seq > max(chunk, default=0)):
            chunk = await self._load(stream, key[1])
            self._chunks[key] = chunk
            while len(self._chunks) > KEEP_CHUNKS:
                self._chunks.pop(next(iter(self._chunks)))
        return chunk.get(seq)

    async def _load(self, stream: Stream, index: int) -> dict[int, StoredMessage]:
        first = index * CHUNK
        last = min(first + CHUNK - 1, stream.durable_last_seq)
        loop = asyncio.get_running_loop()
        table = await loop.run_in_executor(
            self.executor,
            self.reader.read_range,
            stream.name,
            max(first, 1),
            last,
            stream.block_size,
            stream.created_ns,
        )
        return {
            row["seq"]: StoredMessage(
                stream.name,
                stream.block_size,
                row["seq"],
                row["ts"],
                row["subject"],
                row["hdrs"],
                row["data"],
            )
            for row in table.to_pylist()
        }

    def forget_stream(self, name: str) -> None:
        for key in [k for k in self._chunks if k[0] == name]:
            del self._chunks[key]

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
