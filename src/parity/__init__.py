"""parity: differential equivalence testing for JAX model refactors.

`parity.assert_equivalent(actual, expected, class_map=...)` compares any two pytrees;
`parity.check_group` / `parity.check_live` are the core that the CLI and the pytest plugin
share; `parity.localise(new_fn, old_fn, *args)` names the first operation of a new program
that computes what the old one never did, at its source line. Tolerance classes as data
(rules as objects, `parity.judge.fixed_rules` and `parity.judge.measured_rules`),
comparison of arrays and pytrees with a finding per key and the first divergence named, an
HDF5 golden store with provenance and checksums, repin at a git base commit, compile
statistics, reports, a CLI (`python -m parity`) and a pytest plugin. `import parity` does
not import jax, h5py, matplotlib or rich: the public names load their module on first use.
"""

import importlib
from typing import TYPE_CHECKING, Any

#: This package's version, for a source tree run without installing it (`parity --version`
#: prefers the installed distribution's); kept equal to pyproject.toml's by a test.
__version__ = "0.1.0"

if TYPE_CHECKING:
    from parity.assertions import assert_equivalent
    from parity.check import GoldenDir, check_group, check_live
    from parity.errors import ParityError
    from parity.judge.classes import REGISTRY, ToleranceClass
    from parity.judge.compare import Comparison, Finding
    from parity.judge.dataflow import dataflow_order, in_dataflow_order
    from parity.judge.fixed_rules import Bitwise, Close, OpByOp, RelativeToMax, Ulp
    from parity.judge.measured_rules import Budget, Calibrated, LogitKL, Reduction
    from parity.judge.rule_base import Rule
    from parity.judge.tolerance import ClassMap, get_class
    from parity.origin.align import Origin
    from parity.origin.api import localise
    from parity.origin.localisation import Localisation
    from parity.origin.record import LocaliseError
    from parity.report import format_table
    from parity.results import CheckError, CheckResult
    from parity.store import GoldenFile, GoldenStoreError, open_goldens

#: The public surface: what a user calls, name -> the module that defines it. Everything
#: else is importable from its own module (`parity.judge.compare.compare_trees`,
#: `parity.store.write_goldens`, ...) but not advertised here. The `if TYPE_CHECKING:`
#: imports above say the same for type checkers; a test holds the two equal.
_PUBLIC: dict[str, str] = {
    # the assertion, for any test framework
    "assert_equivalent": "parity.assertions",
    # the checks the pytest plugin's fixtures run, for a harness of one's own
    "check_group": "parity.check",
    "check_live": "parity.check",
    "GoldenDir": "parity.check",
    "CheckResult": "parity.results",
    "CheckError": "parity.results",
    # the root of every error a user can meet
    "ParityError": "parity.errors",
    "Comparison": "parity.judge.compare",
    "Finding": "parity.judge.compare",
    "format_table": "parity.report",
    # walking a jitted function's outputs in the order the program computed them
    "dataflow_order": "parity.judge.dataflow",
    "in_dataflow_order": "parity.judge.dataflow",
    # the first operation of a new program that computes what the old one never did
    "localise": "parity.origin.api",
    "Localisation": "parity.origin.localisation",
    "Origin": "parity.origin.align",
    "LocaliseError": "parity.origin.record",
    # tolerance classes and their rules
    "ToleranceClass": "parity.judge.classes",
    "REGISTRY": "parity.judge.classes",
    "ClassMap": "parity.judge.tolerance",
    "get_class": "parity.judge.tolerance",
    "Rule": "parity.judge.rule_base",
    "Bitwise": "parity.judge.fixed_rules",
    "OpByOp": "parity.judge.fixed_rules",
    "Ulp": "parity.judge.fixed_rules",
    "Close": "parity.judge.fixed_rules",
    "RelativeToMax": "parity.judge.fixed_rules",
    "Reduction": "parity.judge.measured_rules",
    "Calibrated": "parity.judge.measured_rules",
    "Budget": "parity.judge.measured_rules",
    "LogitKL": "parity.judge.measured_rules",
    # the golden store's reader
    "open_goldens": "parity.store",
    "GoldenFile": "parity.store",
    "GoldenStoreError": "parity.store",
}

#: The names `_PUBLIC` maps, written out for tools that read `__all__` statically.
__all__ = [
    "REGISTRY",
    "Bitwise",
    "Budget",
    "Calibrated",
    "CheckError",
    "CheckResult",
    "ClassMap",
    "Close",
    "Comparison",
    "Finding",
    "GoldenDir",
    "GoldenFile",
    "GoldenStoreError",
    "Localisation",
    "LocaliseError",
    "LogitKL",
    "OpByOp",
    "Origin",
    "ParityError",
    "Reduction",
    "RelativeToMax",
    "Rule",
    "ToleranceClass",
    "Ulp",
    "assert_equivalent",
    "check_group",
    "check_live",
    "dataflow_order",
    "format_table",
    "get_class",
    "in_dataflow_order",
    "localise",
    "open_goldens",
]


def __getattr__(name: str) -> Any:
    """Each public name loads its module on first use (PEP 562), so that `python -m parity
    diff` pays only for the modules it uses."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'parity' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
