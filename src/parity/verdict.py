"""The typed values a golden check's stages hand each other (docs/design.md, "One pass"):
the two class registries a check judges by (`Registries`), what it is asked
(`CheckRequest`), its first verdict (`FirstVerdict`, made by
`parity.check.first_verdict`) and what comparing with the baseline found (`BaseJudgement`,
made by `parity.exactness.against_baseline`). Each is built by keyword; a stage takes the
one value the stage before it made, not its fields spread over ten parameters.

This module imports the core's lower rooms only (`results`, `calibrated`, the judge, the
store's types); nothing here runs anything.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from parity.calibrated.bounds import KeyClasses
from parity.judge.chunks import DEFAULT_BUDGET
from parity.judge.classes import REGISTRY, ToleranceClass
from parity.judge.compare import Comparison, Order
from parity.judge.fixed_rules import Ulp
from parity.judge.tolerance import ClassMapLike, Overrides
from parity.results import BaselineUnavailable

if TYPE_CHECKING:
    from parity.environment import EnvironmentDifference, PolicyDecision, PolicyMode
    from parity.store import GoldenFile

__all__ = [
    "BaseJudgement",
    "BaselineRequest",
    "CheckRequest",
    "FileOptions",
    "FirstVerdict",
    "GroupOptions",
    "Registries",
]

#: What a check's first verdict asks of a `parity.baseline.BaselineSource`: `(group, pinned
#: provenance, current provenance)` (`FirstVerdict.baseline_request`).
BaselineRequest = tuple[str, Mapping[str, Any], Mapping[str, Any]]


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
    (`parity.check.first_verdict`) takes it, the last (`parity.exactness.conclude`) reads
    what the result needs of it.

    **Fields:** `current` (the provenance of the environment the tree was produced in),
    `difference` (how it differs from the pin's; None: decided from `current`),
    `class_map`, `overrides`, `registry` (each key's class, by the one precedence),
    `order` (the forward order; None: the golden's pinned one, or `dataflow_order`),
    `drift_mode`, `name` and `node` (for reports; `name` None: the group), `produce_s`
    (seconds the caller spent producing), `save_actual` (where a failing check's arrays
    go), `keys` (the golden keys to check; None: all), `require_baseline`, `budget` (bytes
    one array comparison may hold), `golden_source` (key -> the golden's array or
    `Source`; None: the file's), `dataflow_order` (the keys in the order the programs that
    produced them computed them), `host_computed` (no jax program computed them).
    """

    current: Mapping[str, Any]
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


class GroupOptions(TypedDict, total=False):
    """The options of a check of a golden group but its environment and its baseline, as
    `parity.check.check_group` takes them (the fields of `CheckRequest` they set)."""

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


class FileOptions(GroupOptions, total=False):
    """`parity.check.check_file`'s options besides `current` and `baseline`."""

    difference: EnvironmentDifference | None
    budget: int
    golden_source: Callable[[str], Any] | None


@dataclass(frozen=True, kw_only=True)
class FirstVerdict:
    """A golden check's first verdict: the tree compared with its goldens, once, before any
    baseline (`parity.check.first_verdict`); `parity.exactness.conclude` turns it into the
    `CheckResult`.

    **Fields:** `gf` (the golden file), `current` (the provenance `actual` was produced
    in), `difference` (how it differs from the pin's, decided once), `classes` (the classes
    of the golden's keys), `keys` (the golden keys checked), `flat_a` (`actual`, flattened
    once: every later judgement reads it), `forward` (the forward order), `comparison`
    (against the goldens, under the drift policy's classes), `registries`, `request` (what
    the check was asked), `started`, `load_s`, `compare_s` (timing), `order_source`
    (`dataflow` where `forward` was read from the programs that produced `flat_a`, `host`
    where no jax program computed them, else None: the golden's pinned order).
    """

    gf: GoldenFile
    current: Mapping[str, Any]
    difference: EnvironmentDifference
    classes: KeyClasses
    keys: tuple[str, ...]
    flat_a: dict[str, Any]
    forward: Order
    comparison: Comparison
    registries: Registries
    request: CheckRequest
    started: float
    load_s: float
    compare_s: float
    order_source: str | None = None

    @property
    def group(self) -> str:
        """The golden group (the file's name)."""
        return self.gf.path.stem

    @property
    def name(self) -> str:
        """The check's name in reports: the one asked for, else the group."""
        return self.request.name or self.group

    @property
    def wants_baseline(self) -> bool:
        """Whether the baseline should be the reference: on another backend than the pin's,
        always (the goldens' noise is no ruler there); else where the environment differs
        from the pin's in a way that can move bits and some key fails its pinned class."""
        if self.difference.across_backends:
            return True
        return self.difference.moves_bits and not self.comparison.passed

    def baseline_request(self) -> BaselineRequest:
        """What re-produces this group's baseline: `(group, pinned provenance, current)`."""
        return self.group, self.gf.provenance, self.current


@dataclass(frozen=True, kw_only=True)
class BaseJudgement:
    """What comparing a first verdict with its baseline found
    (`parity.exactness.against_baseline`).

    **Fields:** `comparison`, the tree against the baseline (None where there is no
    baseline: the calibrated comparison with the goldens then stands); `reference`, the
    header's line naming the reference; `path`, the baseline's file (`""` where none);
    `why`, why there is no baseline (None where there is one).
    """

    comparison: Comparison | None
    reference: str
    path: str = ""
    why: BaselineUnavailable | None = None
