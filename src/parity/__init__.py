"""parity: differential equivalence testing for JAX model refactors.

`parity.assert_equivalent(actual, expected, class_map=...)` compares any two pytrees;
`parity.check_group` / `parity.check_live` are the core that the CLI and the pytest plugin
share. Tolerance classes as data (rules as objects, `parity.judge.rules`), comparison of arrays
and pytrees with a finding per key and the first divergence named, an HDF5 golden store
with provenance and checksums, repin at a git base commit, compile statistics, reports, a
CLI (`python -m parity`) and a pytest plugin. `import parity` does not import jax,
h5py, matplotlib or rich: the public names load their module on first use.
"""

import importlib
from typing import TYPE_CHECKING, Any

#: This package's version, for a source tree run without installing it (`parity --version`
#: prefers the installed distribution's); kept equal to pyproject.toml's by a test.
__version__ = "0.1.0"

if TYPE_CHECKING:
    from parity.assertions import assert_equivalent
    from parity.check import GoldenDir, check_group, check_live
    from parity.judge.classes import REGISTRY, ToleranceClass
    from parity.judge.compare import Comparison, Finding, compare_arrays, compare_trees, flatten
    from parity.judge.dataflow import Dataflow, dataflow_order, in_dataflow_order
    from parity.judge.rules import RULES, Bitwise, Close, RelativeToMax, Rule, Ulp
    from parity.judge.tolerance import ClassMap, get_class
    from parity.judge.ulp import ulp_distance
    from parity.report import format_table, to_json, write_html, write_json
    from parity.results import CheckError, CheckResult
    from parity.store import GoldenFile, GoldenStoreError, open_goldens, write_goldens
    from parity.store.provenance import collect_provenance

#: The public names, each loaded from its module on first use.
__all__ = [
    "REGISTRY",
    "RULES",
    "Bitwise",
    "CheckError",
    "CheckResult",
    "ClassMap",
    "Close",
    "Comparison",
    "Dataflow",
    "Finding",
    "GoldenDir",
    "GoldenFile",
    "GoldenStoreError",
    "RelativeToMax",
    "Rule",
    "ToleranceClass",
    "Ulp",
    "assert_equivalent",
    "check_group",
    "check_live",
    "collect_provenance",
    "compare_arrays",
    "compare_trees",
    "dataflow_order",
    "flatten",
    "format_table",
    "get_class",
    "in_dataflow_order",
    "open_goldens",
    "to_json",
    "ulp_distance",
    "write_goldens",
    "write_html",
    "write_json",
]

#: Public name -> its module, once a public name is first used.
_SOURCES: dict[str, str] | None = None


def _sources() -> dict[str, str]:
    """Public name -> the module defining it, read from the `if TYPE_CHECKING:` imports
    above (what type checkers see), so that `__all__` is the one list of the public names
    and where each comes from is written once too."""
    import ast
    from pathlib import Path

    found: dict[str, str] = {}
    for node in ast.parse(Path(__file__).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                if isinstance(imp, ast.ImportFrom) and imp.module:
                    found.update((alias.name, imp.module) for alias in imp.names)
    return found


def __getattr__(name: str) -> Any:
    """Each public name loads its module on first use (PEP 562), so that `python -m parity
    diff` pays only for the modules it uses."""
    if name not in __all__:
        raise AttributeError(f"module 'parity' has no attribute {name!r}")
    global _SOURCES
    if _SOURCES is None:
        _SOURCES = _sources()
    value = getattr(importlib.import_module(_SOURCES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
