"""The package layout's import rules (docs/architecture.md, "Layers"), read from the source with
``ast`` so a violation fails here rather than surfacing as a Spark job that needs the gateway or a
state machine that reaches for a socket."""

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
ENTRY_POINT = ("gateway/cli/main.py", "spark_jobs")

# Each package's layers from the bottom up: a module may import its own layer and those below.
LAYERS = {
    "gateway": ["runtime", "wire", "api", "engine", "adapters", "handlers", "service", "monitor", "cli"],
    "storage_delta": ["format", "commit", "maintenance", "tables", "read"],
}
MAX_MODULES_PER_FOLDER = 15


def _imports(path: Path) -> set[str]:
    """Dotted names a module imports (for ``from a.b import c``: ``a.b`` and ``a.b.c``), wherever in
    the module the import sits (``TYPE_CHECKING`` blocks and function bodies included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def _imported_modules(path: Path) -> set[str]:
    return {n for n in _imports(path) if n.split(".")[0] in OURS}


def _packages(path: Path) -> set[str]:
    return {n.split(".")[0] for n in _imported_modules(path)}


def _layer(package: str, dotted: str) -> int | None:
    parts = dotted.split(".")
    if parts[0] != package or len(parts) < 2 or parts[1] not in LAYERS[package]:
        return None
    return LAYERS[package].index(parts[1])


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_the_layout_allows(package: str) -> None:
    bad = []
    for path in sorted((REPO / package).rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for name in _packages(path) & OURS - {package} - ALLOWED[package]:
            if (rel, name) != ENTRY_POINT:
                bad.append(f"{rel} imports {name}")
    assert bad == []


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_a_layer_never_imports_one_above_it(package: str) -> None:
    bad = []
    for path in sorted((REPO / package).rglob("*.py")):
        rel = path.relative_to(REPO)
        own = _layer(package, ".".join(rel.with_suffix("").parts))
        if own is None:
            continue
        for name in sorted(_imported_modules(path)):
            other = _layer(package, name)
            if other is not None and other > own:
                bad.append(f"{rel.as_posix()} ({LAYERS[package][own]}) imports {name}")
    assert bad == []


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_every_module_sits_in_a_layer(package: str) -> None:
    loose = sorted(
        p.name for p in (REPO / package).glob("*.py") if p.name not in ("__init__.py", "__main__.py")
    )
    folders = sorted(p.name for p in (REPO / package).iterdir() if (p / "__init__.py").exists())
    assert loose == []
    assert folders == sorted(LAYERS[package])


def test_no_folder_holds_more_than_fifteen_modules() -> None:
    crowded = {
        folder.relative_to(REPO).as_posix(): n
        for package in ("gateway", "storage_delta", "spark_jobs", "bench")
        for folder in [REPO / package, *(REPO / package).rglob("*")]
        if folder.is_dir()
        and (n := len([p for p in folder.glob("*.py") if p.name != "__init__.py"])) > MAX_MODULES_PER_FOLDER
    }
    assert crowded == {}


def test_only_storage_delta_imports_deltalake() -> None:
    bad = [
        path.relative_to(REPO).as_posix()
        for package in ("gateway", "spark_jobs", "bench")
        for path in sorted((REPO / package).rglob("*.py"))
        if "deltalake" in {n.split(".")[0] for n in _imports(path)}
    ]
    assert bad == []
