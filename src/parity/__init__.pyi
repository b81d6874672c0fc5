"""parity's public surface, written once: type checkers read this file in place of
`__init__.py`, and `__init__.py` hands it to `lazy_loader.attach_stub`, which reads these
imports (only `from .module import name as name`) to load each name's module on first use.
The modules that define them are private (`parity.judge._compare`, ...): what else one
holds imports (`parity.judge._compare.compare_trees`) but is not public. The public
surface is this stub and each subpackage's `__init__` (`parity.store.write_goldens`,
...). Every type a public function returns or raises is public too
(`tests/parity/test_public_api.py` holds it)."""

# ruff: noqa: I001 (the names stand in groups by what a user does with them, not by module)

# what `__init__.py` defines itself, or `attach_stub` gives it (`__all__`: every name below)
__version__: str
__all__: list[str]

# the assertion, for any test framework
from ._assertions import NotEquivalent as NotEquivalent
from ._assertions import assert_equivalent as assert_equivalent

# the checks the pytest plugin's fixtures run, for a harness of one's own
from .check import (
    GoldenDir as GoldenDir,
    check_group as check_group,
    check_live as check_live,
)
from ._results import (
    CheckError as CheckError,
    CheckHeader as CheckHeader,
    CheckResult as CheckResult,
)

# the root of every error a user can meet
from ._errors import ParityError as ParityError

# what a check compares and hands back, and its table
from .judge._compare import Comparison as Comparison, Finding as Finding
from .report import format_table as format_table

# walking a jitted function's outputs in the order the program computed them
from .judge._dataflow import (
    Dataflow as Dataflow,
    DataflowError as DataflowError,
)

# the first operation of a new program that computes what the old one never did
from .origin._api import localise as localise
from .origin._localisation import Localisation as Localisation
from .origin._align import Origin as Origin
from .origin._record import LocaliseError as LocaliseError
from .origin._record import dataflow_order as dataflow_order
from .origin._record import in_dataflow_order as in_dataflow_order

# tolerance classes and their rules
from .judge._classes import REGISTRY as REGISTRY, ToleranceClass as ToleranceClass
from .judge._tolerance import (
    ClassMap as ClassMap,
    UnknownClassError as UnknownClassError,
    get_class as get_class,
)
from .judge._rule_base import Rule as Rule
from .judge._fixed_rules import (
    Bitwise as Bitwise,
    Close as Close,
    OpByOp as OpByOp,
    RelativeToMax as RelativeToMax,
    Ulp as Ulp,
)
from .judge._measured_rules import (
    Budget as Budget,
    Calibrated as Calibrated,
    LogitKL as LogitKL,
    Reduction as Reduction,
)

# the golden store's reader, what a golden records of its environment (`GoldenFile.provenance`,
# a check's `current_provenance`), and the refusals `open_goldens` raises
from .store import (
    GoldenFile as GoldenFile,
    GoldenFormatError as GoldenFormatError,
    GoldenMissingError as GoldenMissingError,
    GoldenSchemaError as GoldenSchemaError,
    GoldenStoreError as GoldenStoreError,
    GoldenUnsafeError as GoldenUnsafeError,
    Provenance as Provenance,
    open_goldens as open_goldens,
)
