"""One message by sequence: from the stream's tail cache when it is there, else from Delta on the
executor (the event loop never waits on parquet)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor

from gateway.engine.stream import Stream
from storage_delta.commit.writer import StoredMessage
from storage_delta.read.reader import MessageReader


class MessageLoader:
    def __init__(self, reader: MessageReader, executor: Executor) -> None:
        self.reader = reader
        self.executor = executor

    async def load(self, stream: Stream, seq: int) -> StoredMessage | None:
        """The stored message, or None when it is not live (removed, or never stored)."""
        if not stream.is_live(seq):
            return None
        cached = stream.tail.get(seq)
        if cached is not None:
            return cached
        loop = asyncio.get_running_loop()
        table = await loop.run_in_executor(
            self.executor,
            self.reader.read_range,
            stream.name,
            seq,
            seq,
            stream.block_size,
            stream.created_ns,
        )
        if table.num_rows == 0:
            return None
        row = table.slice(0, 1).to_pylist()[0]
        return StoredMessage(
            stream.name, stream.block_size, row["seq"], row["ts"], row["subject"], row["hdrs"], row["data"]
        )
