"""The package layout's import rules (docs/architecture.md, "Layering"), read from the source with
``ast`` so a violation fails here rather than surfacing as a Spark job that needs the gateway."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OURS = {"gateway", "storage_delta", "spark_jobs", "bench", "tests", "notebooks"}

# package -> packages of ours it may import
ALLOWED = {
    "storage_delta": set(),
    "spark_jobs": {"storage_delta"},
    "gateway": {"storage_delta"},
}
# The one ``jetlake`` program dispatches ``jetlake jobs`` to the jobs' own command line.
ENTRY_POINT = ("gateway/cli.py", "spark_jobs")


def _imports(path: Path) -> set[str]:
    """Top-level package names a module imports, wherever in the module the import sits."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_the_layout_allows(package: str) -> None:
    bad = []
    for path in sorted((REPO / package).rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for name in _imports(path) & OURS - {package} - ALLOWED[package]:
            if (rel, name) != ENTRY_POINT:
                bad.append(f"{rel} imports {name}")
    assert bad == []


def test_only_storage_delta_imports_deltalake() -> None:
    bad = [
        path.relative_to(REPO).as_posix()
        for package in ("gateway", "spark_jobs", "bench")
        for path in sorted((REPO / package).rglob("*.py"))
        if "deltalake" in _imports(path)
    ]
    assert bad == []
