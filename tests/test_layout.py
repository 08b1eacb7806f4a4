"""The package's layers, read from its source: data flow one way through them, no module reaches
into another's private names, plugins see dpppl only through ``dpppl`` and ``dpppl.plugin``, and
their tests only through those, ``dpppl.testing`` and ``dpppl.datasets``.

Imports inside functions and under ``TYPE_CHECKING`` count: a circle through them is still a
circle for whoever reads or refactors the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The layers, lowest first.  A module may import its own layer and those below it.
LAYERS = (
    ("dpppl.errors", "dpppl.user_cache", "dpppl.version", "dpppl.lazy", "dpppl.progress"),
    ("dpppl.threads",),
    ("dpppl.model",),
    ("dpppl.privacy",),
    ("dpppl.plugin",),
    ("dpppl.engine", "dpppl.ledger"),
    ("dpppl.results",),
    ("dpppl.diagnostics",),
    ("dpppl.sampling", "dpppl.predictive"),
    ("dpppl.app", "dpppl.datasets"),
    ("dpppl.testing",),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted((ROOT / "dpppl").rglob("*.py"))}


def imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for every ``import module`` and ``from module import name`` in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.module, alias.name) for alias in node.names]
    return found


def targets(path: Path) -> set[str]:
    """The dpppl modules a file imports (a submodule imported by name counts as itself)."""
    found = set()
    for module, name in imports(path):
        if module.split(".")[0] != "dpppl":
            continue
        found.add(f"{module}.{name}" if f"{module}.{name}" in MODULES else module)
    return found


def layer(module: str) -> int:
    for index, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise LookupError(module)


def test_every_module_has_a_layer():
    unplaced = []
    for module in MODULES:
        if module == "dpppl":
            continue
        try:
            layer(module)
        except LookupError:
            unplaced.append(module)
    assert unplaced == []


@pytest.mark.parametrize("module", sorted(set(MODULES) - {"dpppl"}))
def test_a_module_imports_only_its_own_layer_and_those_below(module):
    upward = {t for t in targets(MODULES[module]) - {"dpppl"} if layer(t) > layer(module)}
    assert upward == set(), f"{module} (layer {layer(module)}) imports higher layers"
    if layer(module) < layer("dpppl.app"):
        # The front re-exports the layers up to the API: only front ends and the test kit use it.
        assert "dpppl" not in targets(MODULES[module]), f"{module} imports the package front"


def test_there_are_no_import_circles():
    graph = {m: targets(p) & set(MODULES) - {m} for m, p in MODULES.items()}
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                raise AssertionError(" -> ".join([*path[path.index(nxt) :], nxt]))
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])


def private_imports(paths: list[Path]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}: {module}.{name}"
        for path in paths
        for module, name in imports(path)
        if module.split(".")[0] == "dpppl"
        and name is not None
        and name.startswith("_")
        and not (name.startswith("__") and name.endswith("__"))
    ]


def test_no_module_imports_another_modules_private_names():
    tests = sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "plugins").rglob("*.py"))
    assert private_imports(list(MODULES.values()) + tests) == []


PLUGIN_CODE = sorted(
    p
    for pattern in ("plugins/*/dpppl_*/*.py", "tutorials/plugin_*/**/dpppl_*/*.py")
    for p in ROOT.glob(pattern)
)


def test_the_plugins_are_found():
    assert len({p.parent for p in PLUGIN_CODE}) == 7  # five built in, the template, the example


@pytest.mark.parametrize("path", PLUGIN_CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_plugin_code_sees_dpppl_only_through_its_author_face(path):
    used = {module for module, _ in imports(path) if module.split(".")[0] == "dpppl"}
    assert used <= {"dpppl", "dpppl.plugin"}


PLUGIN_TESTS = sorted(
    {
        p
        for pattern in ("plugins/*/tests/**/*.py", "tutorials/plugin_*/**/tests/**/*.py")
        for p in ROOT.glob(pattern)
    }
)

#: What a plugin's tests may use of dpppl: the user's face, the author's, the test kit and the
#: data sets.
PUBLIC = {"dpppl", "dpppl.plugin", "dpppl.testing", "dpppl.datasets"}


def used_modules(path: Path) -> set[str]:
    """The dpppl modules a file imports or reaches as attributes (``dpppl.engine.x``)."""
    found = targets(path)
    for node in ast.walk(ast.parse(path.read_text())):
        dotted = []
        while isinstance(node, ast.Attribute):
            dotted.insert(0, node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id == "dpppl" and dotted:
            found.add(f"dpppl.{'.'.join(dotted)}")
    return found & set(MODULES)


def test_the_plugin_tests_are_found():
    assert len({p.parent for p in PLUGIN_TESTS}) == 7  # five built in, the template, the example


@pytest.mark.parametrize("path", PLUGIN_TESTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_plugin_tests_see_dpppl_only_through_its_public_faces(path):
    """A plugin's tests use dpppl as a third party's would: a name they need that these modules
    do not export belongs in ``dpppl.plugin`` (or ``dpppl.testing``), not in an import from an
    internal module."""
    assert used_modules(path) <= PUBLIC
