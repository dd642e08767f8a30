"""``storage_delta.commit.txns.app_version`` answers what delta-rs's ``transaction_version`` answers
(which replays the log from its checkpoint at every call), on a local root and on S3 (moto), for
handles that move on commit by commit, past a checkpoint, from a checkpoint, and for an older
handle; and it reads each entry once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import CommitProperties, Transaction

from storage_delta.commit.store import StoreRoot, catch_up
from storage_delta.commit.txns import AppVersions, app_version
from tests.harness import moto_s3, s3_options

APPS = ("a", "b", "jetlake-owner-S")


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_s3() as endpoint:
        yield endpoint


def commit(uri: str, opts: dict[str, str] | None, n: int) -> None:
    """Version ``n``: a row, app ``a`` at ``n``, ``b`` at ``n // 3`` every third, the owner's at
    ``n // 7`` every seventh (apps that move at different paces, and some versions without)."""
    txns = [Transaction(app_id="a", version=n)]
    if n % 3 == 0:
        txns.append(Transaction(app_id="b", version=n // 3))
    if n % 7 == 0:
        txns.append(Transaction(app_id="jetlake-owner-S", version=n // 7))
    write_deltalake(
        uri,
        pa.table({"x": [n]}),
        mode="append",
        storage_options=opts,
        commit_properties=CommitProperties(app_transactions=txns),
    )


def check(root: StoreRoot, dt: DeltaTable) -> None:
    for app in (*APPS, "never"):
        assert app_version(root, "t", dt, app) == (dt.transaction_version(app) or 0), (dt.version(), app)


def scenario(root: StoreRoot) -> None:
    uri, opts = root.table_uri("t"), dict(root.storage_options) if root.storage_options else None
    write_deltalake(uri, pa.table({"x": [0]}), storage_options=opts)
    follower = DeltaTable(uri, storage_options=opts)
    for n in range(1, 16):
        commit(uri, opts, n)
        catch_up(follower)
        check(root, follower)  # brought forward one entry at a time
    follower.create_checkpoint()
    for n in range(16, 24):
        commit(uri, opts, n)
    catch_up(follower)
    check(root, follower)  # past the checkpoint, several entries at once
    fresh = DeltaTable(uri, storage_options=opts)
    check(root, fresh)  # from the checkpoint (its txn column) and the entries since
    older = DeltaTable(uri, version=9, storage_options=opts)
    check(root, older)  # below the checkpoint: delta-rs's own replay


def test_app_versions_agree_with_delta_rs_on_a_local_root(tmp_path: Path) -> None:
    scenario(StoreRoot(str(tmp_path / "root")))


def test_app_versions_agree_with_delta_rs_on_s3(s3_endpoint: str) -> None:
    scenario(StoreRoot("s3://lake/app-versions", s3_options(s3_endpoint)))


def test_each_entry_is_read_once(tmp_path: Path) -> None:
    """Asked again and again as the handle moves on, the reader opens each new entry once (what
    delta-rs's catch-up reads too), not the log since the checkpoint at each ask."""
    root = StoreRoot(str(tmp_path / "root"))
    uri = root.table_uri("t")
    write_deltalake(uri, pa.table({"x": [0]}))
    dt = DeltaTable(uri)
    versions = AppVersions(root, "t")
    opened: list[str] = []
    fs = versions._fs
    real = fs.open_input_stream

    class Counting:
        def open_input_stream(self, path: str) -> object:
            opened.append(os.path.basename(path))
            return real(path)

    versions._fs = Counting()
    for n in range(1, 30):
        commit(uri, None, n)
        catch_up(dt)
        for app in APPS:
            assert versions.of(dt, app) == (dt.transaction_version(app) or 0)
    entries = [name for name in opened if name.endswith(".json")]
    assert sorted(entries) == [f"{v:020d}.json" for v in range(30)]
