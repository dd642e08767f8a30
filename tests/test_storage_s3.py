"""The store root as an object-store URI: the messages table on S3 (moto's server on loopback)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage_delta.reader import MessageReader
from storage_delta.seal import seal_stream
from storage_delta.tables import StoreRoot
from storage_delta.writer import MessageTable, StoredMessage
from tests.harness import free_port, stop, wait_port


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A local S3 emulator with an empty bucket ``lake``."""
    port = free_port()
    server = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen(
        [str(server), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, proc)
        import boto3

        endpoint = f"http://127.0.0.1:{port}"
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="k",
            aws_secret_access_key="s",
            region_name="us-east-1",
        ).create_bucket(Bucket="lake")
        yield endpoint
    finally:
        stop(proc)


def s3_root(endpoint: str, prefix: str) -> StoreRoot:
    return StoreRoot(
        f"s3://lake/{prefix}",
        {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "k",
            "AWS_SECRET_ACCESS_KEY": "s",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        },
    )


def message(stream: str, seq: int) -> StoredMessage:
    return StoredMessage(
        stream, 10, seq, 1_700_000_000_000_000_000 + seq, f"{stream.lower()}.k{seq % 2}", None, b"d%d" % seq
    )


def test_write_read_and_resume_on_s3(s3_endpoint: str) -> None:
    root = s3_root(s3_endpoint, "resume")
    table = MessageTable(root)
    for version, seq in enumerate(range(1, 24, 2), 1):
        table.commit([message("S", seq), message("S", seq + 1)], version)
    table.close()
    reader = MessageReader(root)
    assert reader.read_range("S", 5, 9, 10).column("seq").to_pylist() == [5, 6, 7, 8, 9]
    assert reader.last_per_subject("S") == {"s.k0": 24, "s.k1": 23}
    assert reader.first_seq_at_time("S", 1_700_000_000_000_000_000 + 20) == 20
    # a new process resumes from the txn marker in the table
    assert MessageTable(root).last_txn_version() == 12


def test_append_after_another_writer_removed_files_on_s3(s3_endpoint: str) -> None:
    """On an object store the commit goes through delta-rs, whose append conflicts with a removal
    by another writer (#3890): the writer reloads, sees its txn absent, and commits again, once."""
    root = s3_root(s3_endpoint, "conflict")
    table = MessageTable(root)
    for seq in range(1, 4):
        table.commit([message("A", seq), message("B", seq)], seq)
    assert seal_stream(root, "B") == 1
    table.commit([message("A", 4)], 4)
    table.close()
    reader = MessageReader(root)
    assert reader.read_range("A", 1, 10, 10).column("seq").to_pylist() == [1, 2, 3, 4]
    assert reader.read_range("B", 1, 10, 10).column("seq").to_pylist() == [1, 2, 3]
    assert len(reader.stream_files("B")) == 1
    assert MessageTable(root).last_txn_version() == 4
