"""Catalog changes (#23): the definitions of concurrent API requests share catalog commits (the
commit loop's group commit), a stream deleted with its consumers is one commit, and what a restart
reads is every change in order, the last of several to one entity in a commit included."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gateway.adapters.ack_recorder import AckRecorder
from gateway.adapters.registry import Registry
from gateway.api.configs import ConsumerConfig, StreamConfig
from storage_delta.commit.store import StoreRoot
from storage_delta.tables.acklog import AckLogTable, AckLogWriter
from storage_delta.tables.catalog import CatalogChange, CatalogTable
from tests.test_index_snapshot import CREATED, Subjects

STREAMS = 40


async def test_concurrent_creates_share_commits_and_a_delete_is_one(tmp_path: Path) -> None:
    root = StoreRoot(str(tmp_path))
    executor = ThreadPoolExecutor(2)
    try:
        acklog = AckLogWriter(AckLogTable(root), executor, 0, 0.1, 1000, 0)
        await acklog.start()
        registry = Registry(CatalogTable(root), executor, 1 << 20, AckRecorder(acklog), Subjects())
        await registry.start()
        configs = [StreamConfig(f"S{i}", subjects=(f"s{i}.>",)) for i in range(STREAMS)]
        streams = await asyncio.gather(*(registry.add_stream(c, CREATED + i) for i, c in enumerate(configs)))
        grouped = registry.catalog_loop.commits
        assert grouped < STREAMS  # while one commit was in flight the next requests gathered
        for name in ("A", "B", "C"):
            await registry.add_consumer(streams[0], ConsumerConfig(durable_name=name), CREATED, name, 0, [])
        before = registry.catalog_loop.commits
        await registry.remove_stream(streams[0])
        assert registry.catalog_loop.commits == before + 1  # the stream and its three consumers
        await registry.close()
        await acklog.close()
        entries = CatalogTable(root).load()
        assert [e.name for e in entries if e.kind == "stream"] == [f"S{i}" for i in range(1, STREAMS)]
        assert [e for e in entries if e.kind == "consumer"] == []
    finally:
        executor.shutdown()


def test_of_two_changes_to_one_entity_in_a_commit_the_later_is_read(tmp_path: Path) -> None:
    catalog = CatalogTable(StoreRoot(str(tmp_path)))
    body = {"config": {"name": "X"}, "created": CREATED}
    catalog.commit([CatalogChange("stream", "X", "X", body), CatalogChange("stream", "X", "X", None)], 1)
    catalog.commit([CatalogChange("stream", "Y", "Y", None), CatalogChange("stream", "Y", "Y", body)], 2)
    catalog.put("stream", "Z", "Z", body)  # a commit of its own, after the two
    assert [(e.name, e.kind) for e in CatalogTable(StoreRoot(str(tmp_path))).load()] == [
        ("Y", "stream"),
        ("Z", "stream"),
    ]
