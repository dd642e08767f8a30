"""``sync_interval`` and the helpers that put a commit on stable storage
(``storage_delta/commit/durable.py``). That the syncs are where they must be is shown by the power-cut
test (``tests/test_power_loss.py``), which drops every write that was not synced."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.runtime.settings import LOADER
from storage_delta.commit.durable import make_dirs, sync_interval_seconds
from storage_delta.format.settings import SettingsError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("always", None),
        ("ALWAYS", None),
        ("2m", 120.0),
        ("30s", 30.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("1.5s", 1.5),
        ("250us", 0.00025),
    ],
)
def test_sync_interval_is_always_or_a_go_duration(text: str, seconds: float | None) -> None:
    assert sync_interval_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "2", "2x", "-1s", "0s", "s", "1m2", "never"])
def test_other_sync_intervals_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="always"):
        sync_interval_seconds(text)


def test_the_gateway_setting_defaults_to_always_and_refuses_a_bad_duration() -> None:
    assert LOADER.load(environ={}).sync_seconds is None
    assert LOADER.load(environ={"JETLAKE_SYNC_INTERVAL": "2m"}).sync_seconds == 120.0
    with pytest.raises(SettingsError, match=r"sync_interval.*'2 minutes'"):
        LOADER.load(environ={"JETLAKE_SYNC_INTERVAL": "2 minutes"})


def test_make_dirs_names_the_directories_that_got_a_new_entry(tmp_path: Path) -> None:
    leaf = tmp_path / "t" / "stream=A" / "block=0"
    assert make_dirs(str(leaf)) == [str(leaf.parent), str(leaf.parent.parent), str(tmp_path)]
    assert leaf.is_dir()
    assert make_dirs(str(leaf)) == []
    assert make_dirs(str(leaf.parent / "block=1")) == [str(leaf.parent)]
