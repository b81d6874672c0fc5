"""What each layer of parity may import, held by tests: each subpackage's docstring says it in
prose, these tests in fresh processes; parity's modules import one another without a cycle,
and each layer only the layers below it (issue 23); so do its folders, as a reader sees
them, each at one height (issue 38)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _layers import LAYERS, floor_of, unit_of

import parity
from _source_imports import module_name, source_imports

SRC = Path(parity.__file__).resolve().parent

#: Each layer, and the top-level modules it must never load, with every module in it imported.
FORBIDDEN = {
    "parity": ("jax", "h5py", "matplotlib", "rich", "decomp"),
    "parity.judge": ("jax", "h5py", "decomp"),
    "parity.origin": ("jax", "h5py", "decomp"),
    "parity.store": ("jax", "decomp"),
    "parity.report": ("jax", "h5py", "decomp"),
    "parity.machinery": ("jax", "decomp"),
    "parity.run": ("jax", "decomp"),
    "parity.calibrated": ("jax", "h5py", "decomp"),
    "parity.check": ("jax", "decomp"),
    "parity.calibration": ("jax", "decomp"),
}


def _modules_of(package: str) -> list[str]:
    folder = SRC.joinpath(*package.split(".")[1:])
    if package == "parity":
        return ["parity"]
    names = [package]
    names += [f"{package}.{p.stem}" for p in sorted(folder.glob("*.py")) if p.stem != "__init__"]
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_layer_loads_none_of_what_its_docstring_forbids(package: str) -> None:
    modules = _modules_of(package)
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in {list(FORBIDDEN[package])!r} if m in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [], (package, modules)


def _module_name(path: Path) -> str:
    return module_name(path, SRC.parent)


def _imports(path: Path, known: set[str], *, anywhere: bool = False) -> set[str]:
    """The parity modules `path` imports at its top level (not inside a function, and not
    under `if TYPE_CHECKING:`), so importing it runs them first; with `anywhere`, inside
    functions and classes too (they run as soon as the function does), still never under
    `if TYPE_CHECKING:` (which never runs). `from parity.store import _writer as writer` imports the
    package and the submodule."""
    return source_imports(path, SRC.parent, known, anywhere=anywhere)


def test_each_layer_imports_only_the_layers_below_it() -> None:
    paths = sorted(SRC.rglob("*.py"))
    known = {_module_name(p) for p in paths}
    assert sorted(m for m in known if m != "parity" and unit_of(m) is None) == []
    imports = {_module_name(p): _imports(p, known, anywhere=True) for p in paths}
    # The reader sees an import inside a function, and skips one under TYPE_CHECKING.
    assert "parity.run._produced" in imports["parity.calibration._calibrate"]
    assert "parity._results" not in imports["parity.report._session"]
    upward = []
    for module, imported in sorted(imports.items()):
        unit = unit_of(module)
        for other in sorted(imported - {"parity"}):
            under = unit_of(other)
            if unit and under and under != unit and floor_of(other) >= floor_of(module):
                upward.append(f"{module} imports {other}")
    assert upward == []


def _import_graph() -> dict[str, set[str]]:
    """Each module's imports of parity's modules, inside functions too (they run as soon as
    the function does: a circle through one is a circle), never under `if TYPE_CHECKING:`."""
    paths = sorted(SRC.rglob("*.py"))
    known = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, known, anywhere=True) for p in paths}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_parity_modules_import_one_another_without_a_cycle() -> None:
    graph = _import_graph()
    assert "parity.store._reader" in graph and "parity.judge._compare" in graph
    assert _cycles(graph) == []


def test_the_check_s_stages_import_no_later_stage_even_for_their_types() -> None:
    """Issue 57: `against_baseline -> first -> request -> against_baseline` was a circle
    through an import under `TYPE_CHECKING` (the `BaselineSource` a request carries): the
    contracts the stages share live in `request`, which imports no stage."""
    paths = sorted((SRC / "check").glob("*.py"))
    known = {_module_name(p) for p in paths if p.stem != "__init__"}
    graph = {
        _module_name(p): source_imports(
            p, SRC.parent, known, anywhere=True, type_checking=True, packages=False
        )
        for p in paths
        if p.stem != "__init__"
    }
    assert "parity.check._first" in graph["parity.check._against_baseline"]
    assert _cycles(graph) == []
    assert graph["parity.check._request"] == set()


def _folder_of(module: str) -> str:
    """The node a reader sees `module` in: its subpackage folder of src/parity, or the
    top-level module itself (`parity.check`); `parity` for the package's `__init__`."""
    return ".".join(module.split(".")[:2])


def _folder_imports() -> dict[tuple[str, str], list[str]]:
    """Each import from one folder into another (`parity` itself aside), with the module
    imports that make it: inside functions too, never under `if TYPE_CHECKING:`."""
    paths = sorted(SRC.rglob("*.py"))
    known = {_module_name(p) for p in paths}
    edges: dict[tuple[str, str], list[str]] = {}
    for path in paths:
        module = _module_name(path)
        for other in sorted(_imports(path, known, anywhere=True)):
            edge = (_folder_of(module), _folder_of(other))
            if edge[0] != edge[1] and "parity" not in edge:
                edges.setdefault(edge, []).append(f"{module} -> {other}")
    return edges


def test_each_folder_sits_at_one_tier() -> None:
    """A folder is one room at one height: every module in it falls under the folder's own
    entry in `LAYERS`, and `LAYERS` names folders and top-level modules, each once, never a
    module inside a folder (which would hang part of a room at another height)."""
    modules = {_module_name(p) for p in SRC.rglob("*.py")} - {"parity"}
    tiers: dict[str, set[int]] = {}
    for module in modules:
        unit = unit_of(module)
        assert unit is not None, module
        tiers.setdefault(_folder_of(module), set()).add(floor_of(module))
    assert {f: sorted(t) for f, t in sorted(tiers.items()) if len(t) > 1} == {}
    units = [u for tier in LAYERS for u in tier]
    assert sorted(u for u in units if _folder_of(u) != u) == []
    assert sorted(units) == sorted(set(units)) == sorted(tiers)


def test_no_folder_imports_a_folder_of_its_own_tier_or_above() -> None:
    edges = _folder_imports()
    # An import inside a function counts: the calibrate command loads calibration when run.
    assert ("parity.commands", "parity.calibration") in edges
    assert ("parity.calibration", "parity.run") in edges
    upward = [
        f"{a} imports {b} ({', '.join(via)})"
        for (a, b), via in sorted(edges.items())
        if floor_of(b) >= floor_of(a)
    ]
    assert upward == []


def test_the_folders_import_one_another_without_a_cycle() -> None:
    graph: dict[str, set[str]] = {_folder_of(_module_name(p)): set() for p in SRC.rglob("*.py")}
    for a, b in _folder_imports():
        graph[a].add(b)
    assert "parity.check" in graph["parity.run"]
    assert _cycles(graph) == []
