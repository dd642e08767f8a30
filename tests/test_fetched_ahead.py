"""``integrity.fetched_ahead``: files fetched side by side (an object store's reads) come back in
the order asked, each with its bytes or the damage that kept it out, and no more than ``ahead``
are held at once."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pytest

from storage_delta.format.integrity import DamagedFile, fetched_ahead


@pytest.mark.parametrize("ahead", [1, 4])
def test_files_come_back_in_order_with_their_bytes_or_their_damage(tmp_path: Path, ahead: int) -> None:
    paths = []
    for i in range(20):
        path = tmp_path / f"f{i:02d}"
        if i != 7:  # the eighth is missing: unreadable
            path.write_bytes(f"file {i}".encode() * (i + 1))
        paths.append(str(path))
    got = list(fetched_ahead(pafs.LocalFileSystem(), paths, ahead))
    assert [p for p, _ in got] == paths
    for i, (_, buf) in enumerate(got):
        if i == 7:
            assert isinstance(buf, DamagedFile)
            assert "unreadable" in buf.reason
        else:
            assert not isinstance(buf, DamagedFile)
            assert buf.to_pybytes() == f"file {i}".encode() * (i + 1)


def test_no_more_than_ahead_files_are_fetched_before_the_first_is_taken(tmp_path: Path) -> None:
    opened: list[str] = []

    class Counting(pafs.LocalFileSystem):  # type: ignore[misc]
        def open_input_file(self, path: str) -> pafs.NativeFile:
            opened.append(path)
            return super().open_input_file(path)

    paths = []
    for i in range(30):
        (tmp_path / f"f{i:02d}").write_bytes(b"x")
        paths.append(str(tmp_path / f"f{i:02d}"))
    reading = fetched_ahead(Counting(), paths, 4)
    first = next(reading)
    assert first[0] == paths[0]
    assert len(opened) <= 4
    assert len(list(reading)) == 29
