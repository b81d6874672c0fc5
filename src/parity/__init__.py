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
    from parity.check import CheckError, CheckResult, GoldenDir, check_group, check_live
    from parity.judge.compare import Comparison, Finding, compare_arrays, compare_trees, flatten
    from parity.judge.rules import RULES, Bitwise, Close, RelativeToMax, Rule, Ulp
    from parity.judge.tolerance import REGISTRY, ClassMap, ToleranceClass, get_class, ulp_distance
    from parity.report import format_table, to_json, write_html, write_json
    from parity.store import GoldenFile, GoldenStoreError, open_goldens, write_goldens
    from parity.store.provenance import bitwise_policy, collect_provenance, drift

#: Public name -> the module defining it, imported on first access (PEP 562), so that
#: `python -m parity diff` pays only for the modules it uses.
_LAZY = {
    "Bitwise": "parity.judge.rules",
    "CheckError": "parity.check",
    "CheckResult": "parity.check",
    "ClassMap": "parity.judge.tolerance",
    "Close": "parity.judge.rules",
    "Comparison": "parity.judge.compare",
    "Finding": "parity.judge.compare",
    "GoldenDir": "parity.check",
    "GoldenFile": "parity.store",
    "GoldenStoreError": "parity.store",
    "REGISTRY": "parity.judge.tolerance",
    "RULES": "parity.judge.rules",
    "RelativeToMax": "parity.judge.rules",
    "Rule": "parity.judge.rules",
    "ToleranceClass": "parity.judge.tolerance",
    "Ulp": "parity.judge.rules",
    "assert_equivalent": "parity.assertions",
    "bitwise_policy": "parity.store.provenance",
    "check_group": "parity.check",
    "check_live": "parity.check",
    "collect_provenance": "parity.store.provenance",
    "compare_arrays": "parity.judge.compare",
    "compare_trees": "parity.judge.compare",
    "drift": "parity.store.provenance",
    "flatten": "parity.judge.compare",
    "format_table": "parity.report",
    "get_class": "parity.judge.tolerance",
    "open_goldens": "parity.store",
    "to_json": "parity.report",
    "ulp_distance": "parity.judge.tolerance",
    "write_goldens": "parity.store",
    "write_html": "parity.report",
    "write_json": "parity.report",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'parity' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "REGISTRY",
    "RULES",
    "Bitwise",
    "CheckError",
    "CheckResult",
    "ClassMap",
    "Close",
    "Comparison",
    "Finding",
    "GoldenDir",
    "GoldenFile",
    "GoldenStoreError",
    "RelativeToMax",
    "Rule",
    "ToleranceClass",
    "Ulp",
    "assert_equivalent",
    "bitwise_policy",
    "check_group",
    "check_live",
    "collect_provenance",
    "compare_arrays",
    "compare_trees",
    "drift",
    "flatten",
    "format_table",
    "get_class",
    "open_goldens",
    "to_json",
    "ulp_distance",
    "write_goldens",
    "write_html",
    "write_json",
]
