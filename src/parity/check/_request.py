"""What a check is asked: the request its first stage takes (`CheckRequest`, built by
keyword), the options each door takes them as (`GroupOptions`, `FileOptions`,
`CheckOptions`, `LiveOptions`), the two class registries it judges by (`Registries`), and
what a face hands the check to settle its failures (`Settler`) and to re-produce its
baselines (`BaselineSource`, the `Baseline` it returns). Nothing here runs anything.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, runtime_checkable

from parity._results import BaselineUnavailable, CheckResult
from parity.judge._chunks import DEFAULT_BUDGET
from parity.judge._classes import REGISTRY, ToleranceClass
from parity.judge._compare import Order
from parity.judge._converting import Conversion
from parity.judge._fixed_rules import Ulp
from parity.judge._tolerance import ClassMapLike, Overrides
from parity.store import Provenance

if TYPE_CHECKING:
    from parity._environment import EnvironmentDifference, PolicyDecision, PolicyMode

__all__ = [
    "Baseline",
    "BaselineRequest",
    "BaselineSource",
    "BatchBaselineSource",
    "CheckOptions",
    "CheckRequest",
    "FileOptions",
    "GroupOptions",
    "LiveOptions",
    "Registries",
    "Settler",
    "refuse_unknown_options",
]


#: What a check's first verdict asks of a `BaselineSource`: `(group, pinned provenance,
#: current provenance)` (`parity.check._first.FirstVerdict.baseline_request`).
BaselineRequest = tuple[str, Provenance, Provenance]


@dataclass(frozen=True)
class Baseline:
    """A golden group re-produced at its base commit in this environment.

    **Fields:** `path` (a golden-format file), `sha` (the base commit), `cached` (found in
    the cache, as opposed to built by this call) and `seconds` (what building it took; 0
    when cached).
    """

    path: Path
    sha: str
    cached: bool
    seconds: float = 0.0


class BaselineSource(Protocol):
    """What re-produces a golden group at its base commit in a check's environment: its
    baseline."""

    def reproduce(self, group: str, pinned: Provenance, current: Provenance) -> Baseline:
        """The group re-produced at `pinned.base_sha` in the environment `current`
        describes (a provenance); raises `BaselineUnavailable` where it cannot be."""
        ...


@runtime_checkable
class BatchBaselineSource(BaselineSource, Protocol):
    """A `BaselineSource` that also re-produces several groups at once: the missing ones of
    each base commit and environment in one producer run
    (`parity.run._baseline.BaselineBuilder`). `prepare_baselines` uses it where the source
    has it."""

    def prepare(
        self, wanted: Sequence[BaselineRequest]
    ) -> Mapping[str, Baseline | BaselineUnavailable]:
        """Each group of `wanted` re-produced, or the `BaselineUnavailable` saying why not."""
        ...


@dataclass(frozen=True, kw_only=True)
class Registries:
    """The two class registries of a check.

    **Fields:** `exact`, the classes the tree is judged by; `policy`, the same under the
    drift policy's decision (`relax` makes `bitwise` an ulp rule), by which the tree is
    first held to the goldens and the baseline to the goldens.
    """

    exact: Mapping[str, ToleranceClass]
    policy: Mapping[str, ToleranceClass]

    @classmethod
    def under(cls, decision: PolicyDecision, exact: Mapping[str, ToleranceClass]) -> Registries:
        """`exact`, and `exact` under the drift policy's `decision`: under `relax` with a
        drift that can move bits, `bitwise` becomes an ulp rule."""
        policy = dict(exact)
        if decision.bitwise_max_ulp is not None:
            policy["bitwise"] = ToleranceClass(
                "bitwise",
                Ulp(max_ulp=decision.bitwise_max_ulp),
                meaning="bitwise, relaxed to ulp by the drift policy",
            )
        return cls(exact=exact, policy=policy)


@dataclass(frozen=True, kw_only=True)
class CheckRequest:
    """What a golden check is asked, but the tree and the golden file: the first stage
    (`parity.check._first.first_verdict`) takes it, the last
    (`parity.check._conclusion.conclude`) reads what the result needs of it.

    **Fields:** `current` (the provenance of the environment the tree was produced in),
    `difference` (how it differs from the pin's; None: decided from `current`),
    `class_map`, `overrides`, `registry` (each key's class, by the one precedence),
    `order` (the forward order; None: the golden's pinned one, or `dataflow_order`),
    `drift_mode`, `name` and `node` (for reports; `name` None: the group), `produce_s`
    (seconds the caller spent producing), `save_actual` (where a failing check's arrays
    go), `keys` (the golden keys to check; None: all), `require_baseline`, `budget` (bytes
    one array comparison may hold), `golden_source` (key -> the golden's array or
    `Source`; None: the file's), `dataflow_order` (the keys in the order the programs that
    produced them computed them), `host_computed` (no jax program computed them), `stack`
    (stack rules, `"blocks.{i}"`: a stacked key of the tree is compared row by row with the
    per-layer golden keys it replaces, `parity.judge._stacking`), `rename` (rename rules,
    `"encoder=backbone"`: a key of the tree under a moved prefix is compared with the
    golden key it replaces, `parity.judge._renames`), `convert` (what the producers'
    converter does to the group's goldens, `parity.judge._converting.Conversion`: the tree
    is read in the goldens' layout through it).
    """

    current: Provenance
    difference: EnvironmentDifference | None = None
    class_map: ClassMapLike = None
    overrides: Overrides = ()
    registry: Mapping[str, ToleranceClass] = field(default_factory=lambda: REGISTRY)
    order: Order | None = None
    drift_mode: PolicyMode = "warn"
    name: str | None = None
    node: str | None = None
    produce_s: float | None = None
    save_actual: str | os.PathLike[str] | None = None
    keys: Sequence[str] | None = None
    require_baseline: bool = False
    budget: int = DEFAULT_BUDGET
    golden_source: Callable[[str], Any] | None = None
    dataflow_order: Sequence[str] | None = None
    host_computed: bool = False
    stack: Sequence[str] | str | None = None
    rename: Sequence[str | Sequence[str]] | str | None = None
    convert: Conversion | None = None


class GroupOptions(TypedDict, total=False):
    """The options of a check of a golden group but its environment and its baseline, as
    `parity.check._flow.check_group` takes them (the fields of `CheckRequest` they set)."""

    class_map: ClassMapLike
    overrides: Overrides
    order: Order | None
    drift_mode: PolicyMode
    registry: Mapping[str, ToleranceClass]
    name: str | None
    node: str | None
    produce_s: float | None
    save_actual: str | os.PathLike[str] | None
    keys: Sequence[str] | None
    require_baseline: bool
    stack: Sequence[str] | str | None
    rename: Sequence[str | Sequence[str]] | str | None


class FileOptions(GroupOptions, total=False):
    """`parity.check._flow.check_file`'s options besides `current` and `baseline`."""

    difference: EnvironmentDifference | None
    budget: int
    golden_source: Callable[[str], Any] | None


class Settler(Protocol):
    """What settles a check's failures after its verdict, op by op: each key of a class
    that proves (`op_by_op`) proved or told why not, and the origin of what still fails
    named (`CheckResult.origin`). The check calls it once, with every result, where some
    fails; the face that runs the check provides it, since only the face knows how the
    programs behind the trees can be recorded: `parity.run._origins.FailureSettler` (the
    producers, here and at the base commit) for `parity check` and the pytest plugin,
    `parity._assertions`' for two functions in hand."""

    def settle(self, results: Sequence[CheckResult]) -> list[CheckResult]:
        """`results` in order, each failing one settled (a passing one as it is)."""
        ...


class CheckOptions(GroupOptions, total=False):
    """The options of a check of a golden group, as `parity.check._flow.check_group` takes them."""

    baseline: BaselineSource | None
    settle: Settler | None
    convert: Conversion | None


class LiveOptions(TypedDict, total=False):
    """The options of a live check (`parity.check._flow.check_live`); each as `CheckOptions`, but
    `class_map`, which defaults to `bitwise` there, `non_arrays` (see `check_live`), and
    `stack`, which splits a stacked key of either tree into the per-layer keys of the
    other, and `convert`, the user's converter of `expected`'s layout into `actual`'s
    (`parity.judge._converting`; or what it does, probed already): `actual` is read in
    `expected`'s layout through it."""

    class_map: ClassMapLike
    overrides: Overrides
    order: Order | None
    registry: Mapping[str, ToleranceClass]
    name: str
    node: str | None
    produce_s: float | None
    save_actual: str | os.PathLike[str] | None
    non_arrays: tuple[dict[str, Any], dict[str, Any]] | None
    settle: Settler | None
    stack: Sequence[str] | str | None
    rename: Sequence[str | Sequence[str]] | str | None
    convert: Callable[[dict[str, Any]], Any] | Conversion | None


def refuse_unknown_options(options: Mapping[str, Any], known: type, where: str) -> None:
    """Raise `TypeError` where `options` (a function's `**options`) holds a keyword that
    `known` (its `TypedDict`) does not declare, as Python does for a function whose
    parameters are spelled out: a misspelt option must not be ignored in silence."""
    unknown = sorted(set(options) - set(known.__annotations__))
    if unknown:
        raise TypeError(
            f"{where}() got an unexpected keyword argument {unknown[0]!r}; its options are "
            f"{', '.join(sorted(known.__annotations__))}"
        )
