"""parity: differential equivalence testing for JAX model refactors.

`parity.assert_equivalent(actual, expected, class_map=...)` compares any two pytrees;
`parity.check_group` / `parity.check_live` are the core that the CLI and the pytest plugin
share. Tolerance classes as data (rules as objects, `parity.rules`), comparison of arrays
and pytrees with a finding per key and the first divergence named, an HDF5 golden store
with provenance and checksums, repin at a git base commit, compile statistics, reports, a
CLI (`python -m parity`) and a pytest plugin. `import parity` does not import jax.
"""

from parity.assertions import assert_equivalent
from parity.check import CheckError, CheckResult, GoldenDir, check_group, check_live
from parity.compare import Comparison, Finding, compare_arrays, compare_trees, flatten
from parity.provenance import bitwise_policy, collect_provenance, drift
from parity.report import format_table, to_json, write_html, write_json
from parity.rules import RULES, Bitwise, Close, RelativeToMax, Rule, Ulp
from parity.store import GoldenFile, GoldenStoreError, open_goldens, write_goldens
from parity.tolerance import REGISTRY, ClassMap, ToleranceClass, get_class, ulp_distance

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
