"""``CheckedRows``: a claim's read back kept from one read to the next gives what a fresh checked
read of the table gives, after appends and after a swap, on a local root and on S3 (moto), and
fetches only the files added since its last read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from storage_delta.commit.store import (
    CheckedRows,
    StoreRoot,
    commit_adds,
    create_table,
    open_existing,
    read_checked,
    write_data_file,
)
from storage_delta.format import schema as sch
from storage_delta.maintenance.files import removes_of, swap_actions
from tests.harness import moto_s3, s3_options

SCHEMA = sch.REMOVALS_SCHEMA


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_s3() as endpoint:
        yield endpoint


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> StoreRoot:
    if request.param == "local":
        return StoreRoot(str(tmp_path / "store"))
    endpoint = request.getfixturevalue("s3_endpoint")
    return StoreRoot(f"s3://lake/{tmp_path.name}", s3_options(endpoint))


def rows(stream: str, first: int) -> pa.Table:
    return pa.table(
        {"stream": [stream], "created": [1], "first": [first], "last": [first], "ts": [first]},
        schema=SCHEMA,
    )


def append(root: StoreRoot, table: pa.Table) -> str:
    """One commit of one file holding ``table``; its path."""
    dt = open_existing(root, "t")
    assert dt is not None
    add = write_data_file(root, "t", {}, table)
    commit_adds(dt, [add], SCHEMA, [])
    return str(add.path)


def sorted_rows(table: pa.Table) -> list[tuple[object, ...]]:
    return sorted(zip(*table.to_pydict().values(), strict=True))


def fresh(root: StoreRoot) -> pa.Table:
    dt = open_existing(root, "t")
    assert dt is not None
    return read_checked(root, dt, "t", SCHEMA)[0]


def test_kept_rows_are_a_fresh_reads_and_only_new_files_are_fetched(root: StoreRoot) -> None:
    kept = CheckedRows(root, "t", SCHEMA)
    assert kept.read() == (SCHEMA.empty_table(), [])  # no table yet
    opts = dict(root.storage_options) if root.storage_options else None
    create_table(root.table_uri("t"), SCHEMA, [], opts)
    paths = [append(root, rows("A", i)) for i in range(3)]
    got, damaged = kept.read()
    assert not damaged
    assert sorted_rows(got) == sorted_rows(fresh(root))
    assert got.num_rows == 3

    # the first file goes from the store behind the log's back: a fresh read finds it damaged,
    # the kept rows do not fetch it again
    fs, base = root.filesystem()
    fs.delete_file(f"{base}/t/{paths[0]}")
    assert len(read_checked(root, open_existing(root, "t"), "t", SCHEMA)[1]) == 1  # type: ignore[arg-type]
    paths += [append(root, rows("B", i)) for i in range(2)]
    got, damaged = kept.read()
    assert not damaged
    assert sorted_rows(got) == [("A", 1, i, i, i) for i in range(3)] + [("B", 1, i, i, i) for i in range(2)]

    # a swap (the first two files' rows merged into one, and its damaged one dropped): the rows
    # are read again from the new snapshot, none twice
    dt = open_existing(root, "t")
    assert dt is not None
    files = pa.table(dt.get_add_actions(flatten=True))
    swapped = files.filter(pc.is_in(files["path"], pa.array(paths[:2])))
    merged = write_data_file(root, "t", {}, pa.concat_tables([rows("A", 0), rows("A", 1)]))
    assert swap_actions(root, "t", SCHEMA, [], removes_of(swapped), [merged])
    got, damaged = kept.read()
    assert not damaged
    assert sorted_rows(got) == sorted_rows(fresh(root))
    assert sorted_rows(got) == [("A", 1, i, i, i) for i in range(3)] + [("B", 1, i, i, i) for i in range(2)]
