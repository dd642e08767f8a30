"""Reads for a consumer far behind, from a real Delta table: one scan per chunk, the next chunk
read before the consumer gets there, removed messages gone, and a stream created again under the
same name never served the earlier stream's cached messages."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa

from gateway.adapters.coldread import CHUNK, ColdReader
from gateway.api.configs import StreamConfig
from gateway.engine.stream import Stream
from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import MessageTable, StoredMessage
from storage_delta.format.schema import stored_size
from storage_delta.read.reader import MessageReader


class CountingReader(MessageReader):
    """The real reader, counting its range scans."""

    def __init__(self, root: StoreRoot) -> None:
        super().__init__(root)
        self.scans: list[tuple[int, int]] = []

    def read_range(self, stream: str, first: int, last: int, block_size: int, min_ts: int = 0) -> pa.Table:
        self.scans.append((first, last))
        return super().read_range(stream, first, last, block_size, min_ts)


def _store(root: StoreRoot, created: int, count: int, tag: bytes, version: int) -> Stream:
    """``count`` messages of stream S in the table, and the stream state a restart rebuilds."""
    stream = Stream(StreamConfig("S", subjects=("s.>",)), created, 1 << 20)
    msgs = [
        StoredMessage("S", stream.block_size, s, created + s, "s.x", None, tag + b"%d" % s)
        for s in range(1, count + 1)
    ]
    table = MessageTable(root)
    try:
        table.commit(msgs, version)
    finally:
        table.close()
    for m in msgs:
        stream.restore(m.seq, m.ts, m.subject, stored_size(m.subject, m.hdrs, m.data))
    return stream


async def _until(check: Callable[[], bool], wait_s: float = 60) -> None:
    deadline = time.monotonic() + wait_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_chunks_read_ahead_removals_and_a_new_stream_of_the_same_name(tmp_path: Path) -> None:
    root = StoreRoot(str(tmp_path))
    count = 2 * CHUNK + 500
    stream = _store(root, 1_000, count, b"old-", 1)
    reader = CountingReader(root)
    executor = ThreadPoolExecutor(2)
    cold = ColdReader(reader, executor)
    try:
        for seq in range(1, CHUNK // 2):
            msg = await cold.read(stream, seq)
            assert msg is not None
            assert (msg.seq, msg.data) == (seq, b"old-%d" % seq)
        assert len(reader.scans) == 1
        # half-way through the first chunk the second is read without anyone asking for it yet
        assert await cold.read(stream, CHUNK // 2) is not None
        await _until(lambda: len(reader.scans) == 2)
        assert reader.scans[1][0] == CHUNK
        for seq in range(CHUNK // 2 + 1, count + 1):
            msg = await cold.read(stream, seq)
            assert msg is not None
            assert msg.data == b"old-%d" % seq
        assert len(reader.scans) == 3  # one scan per chunk, however many messages
        assert stream.remove(count - 1)
        assert await cold.read(stream, count - 1) is None

        # the stream is deleted and created again: same name, same sequences, other messages
        again = _store(root, 10**12, 10, b"new-", 2)
        msg = await cold.read(again, 3)
        assert msg is not None
        assert msg.data == b"new-3"
    finally:
        executor.shutdown()
