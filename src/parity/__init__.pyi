"""parity's public surface, written once: type checkers read this file in place of
`__init__.py`, and `__init__.py` hands it to `lazy_loader.attach_stub`, which reads these
imports (only `from .module import name as name`) to load each name's module on first use.
Everything else is importable from its own module (`parity.judge.compare.compare_trees`,
`parity.store.write_goldens`, ...) but not advertised here. Every type a public function
returns or raises is public too (`tests/parity/test_public_api.py` holds it)."""

# ruff: noqa: I001 (the names stand in groups by what a user does with them, not by module)

# what `__init__.py` defines itself, or `attach_stub` gives it (`__all__`: every name below)
__version__: str
__all__: list[str]

# the assertion, for any test framework
from .assertions import NotEquivalent as NotEquivalent
from .assertions import assert_equivalent as assert_equivalent

# the checks the pytest plugin's fixtures run, for a harness of one's own
from .check import (
    GoldenDir as GoldenDir,
    check_group as check_group,
    check_live as check_live,
)
from .results import (
    CheckError as CheckError,
    CheckHeader as CheckHeader,
    CheckResult as CheckResult,
)

# the root of every error a user can meet
from .errors import ParityError as ParityError

# what a check compares and hands back, and its table
from .judge.compare import Comparison as Comparison, Finding as Finding
from .report import format_table as format_table

# walking a jitted function's outputs in the order the program computed them
from .judge.dataflow import (
    Dataflow as Dataflow,
    DataflowError as DataflowError,
)

# the first operation of a new program that computes what the old one never did
from .origin.api import localise as localise
from .origin.localisation import Localisation as Localisation
from .origin.align import Origin as Origin
from .origin.record import LocaliseError as LocaliseError
from .origin.record import dataflow_order as dataflow_order
from .origin.record import in_dataflow_order as in_dataflow_order

# tolerance classes and their rules
from .judge.classes import REGISTRY as REGISTRY, ToleranceClass as ToleranceClass
from .judge.tolerance import (
    ClassMap as ClassMap,
    UnknownClassError as UnknownClassError,
    get_class as get_class,
)
from .judge.rule_base import Rule as Rule
from .judge.fixed_rules import (
    Bitwise as Bitwise,
    Close as Close,
    OpByOp as OpByOp,
    RelativeToMax as RelativeToMax,
    Ulp as Ulp,
)
from .judge.measured_rules import (
    Budget as Budget,
    Calibrated as Calibrated,
    LogitKL as LogitKL,
    Reduction as Reduction,
)

# the golden store's reader, and the refusals `open_goldens` raises
from .store import (
    GoldenFile as GoldenFile,
    GoldenFormatError as GoldenFormatError,
    GoldenMissingError as GoldenMissingError,
    GoldenSchemaError as GoldenSchemaError,
    GoldenStoreError as GoldenStoreError,
    GoldenUnsafeError as GoldenUnsafeError,
    open_goldens as open_goldens,
)
