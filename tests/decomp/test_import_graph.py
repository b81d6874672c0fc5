"""decomp's modules import one another without a circle, as a reader sees the imports: those
inside functions and those under `if TYPE_CHECKING:` count too (issue 38: `model -> config ->
ci_function -> stacked -> model` ran through a config module that imported a compute module).

The sources are read with `ast`; nothing of decomp (nor jax) is imported.
"""

from __future__ import annotations

import graphlib
import importlib.util
from pathlib import Path

from _source_imports import module_name, source_imports

_SPEC = importlib.util.find_spec("decomp")
assert _SPEC is not None and _SPEC.submodule_search_locations
ROOT = Path(next(iter(_SPEC.submodule_search_locations)))


def _module_name(path: Path) -> str:
    return module_name(path, ROOT.parent)


def _imports(path: Path, known: set[str]) -> set[str]:
    """The decomp modules `path` imports anywhere in its body, `if TYPE_CHECKING:` included.
    `from decomp import nn` is an import of `decomp.nn` alone: a module's packages run
    before it whatever it imports, so they are no edge of their own."""
    return source_imports(path, ROOT.parent, known, anywhere=True, type_checking=True,
                          packages=False)  # fmt: skip


def _import_graph() -> dict[str, set[str]]:
    paths = sorted(ROOT.rglob("*.py"))
    known = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, known) for p in paths}


def _a_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of `graph` (its first module repeated at the end), or `[]` if there is none."""
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        # The sorter names the cycle against the edges' direction (a module after what it imports).
        return list(reversed(error.args[1]))
    return []


def test_the_cycle_finder_finds_a_cycle_and_its_direction() -> None:
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) in (
        ["a", "b", "c", "a"],
        ["b", "c", "a", "b"],
        ["c", "a", "b", "c"],
    )
    assert _a_cycle({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_imports_in_functions_and_under_type_checking() -> None:
    graph = _import_graph()
    assert "decomp.config" in graph and "decomp.targets.glu_transformer" in graph
    # `from decomp import nn` imports the submodule, not the package.
    assert "decomp.nn" in graph["decomp.ci_function"]
    assert "decomp" not in graph["decomp.ci_function"]
    # `losses` names `DecomposedModel` under `if TYPE_CHECKING:` only.
    assert "decomp.model" in graph["decomp.losses"]


def test_the_config_module_imports_no_compute_module() -> None:
    assert _import_graph()["decomp.config"] == set()


def test_decomp_modules_import_one_another_without_a_cycle() -> None:
    cycle = _a_cycle(_import_graph())
    assert cycle == [], "decomp imports in a circle: " + " -> ".join(cycle)
