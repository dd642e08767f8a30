"""Session fixtures: one reference JetStream, one jetlake, one SparkSession for the whole run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import Jetlake, ReferenceJetStream, serving
from tests.monitor_fixtures import monitored, monitored_reference  # noqa: F401  (module fixtures)
from tests.spark_fixtures import spark  # noqa: F401  (session fixture)


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceJetStream]:
    yield from serving(ReferenceJetStream(Path(tmp_path_factory.mktemp("reference"))))


@pytest.fixture(scope="session")
def jetlake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jetlake]:
    yield from serving(Jetlake(Path(tmp_path_factory.mktemp("jetlake"))))


@pytest.fixture
def own_jetlake(tmp_path: Path) -> Iterator[Jetlake]:
    """A jetlake of the test's own, for tests that stop, restart or load it."""
    target = Jetlake(tmp_path)
    target.start()
    yield target
    target.stop()


@pytest.fixture(scope="session")
def targets(reference: ReferenceJetStream, jetlake: Jetlake) -> dict[str, str]:
    """Both servers by name: every differential case runs against each and compares."""
    return {"jetstream": reference.url, "jetlake": jetlake.url}


_names: dict[str, int] = {}


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> str:
    """A stream name no other test uses (tests share the session's servers)."""
    base = "".join(c for c in request.node.name.upper() if c.isalnum())[:40]
    _names[base] = _names.get(base, 0) + 1
    return f"{base}{_names[base]}"
