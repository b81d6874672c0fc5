"""The rules with a fixed tolerance, each elementwise: `Bitwise` (and `OpByOp`, bitwise
unless proved op by op), `Ulp`, `Close` and `RelativeToMax` (what every rule shares:
`parity.judge._rule_base`; the rules whose bound is measured or propagated:
`parity.judge._measured_rules`; every rule by its kind: `parity.judge._registry`).

This module imports numpy, and ml_dtypes for a dtype numpy does not know.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from parity.judge._rule_base import (
    Elements,
    Judgement,
    Rule,
    Scale,
    Unit,
    check_nonneg,
    judge_within,
)
from parity.judge._ulp import spacing_at

__all__ = ["Bitwise", "Close", "OpByOp", "RelativeToMax", "Ulp"]


@dataclass(frozen=True)
class Bitwise(Rule):
    """Same dtype, shape and bytes: NaN payloads count and -0.0 differs from +0.0."""

    kind: ClassVar[str] = "bitwise"
    elementwise: ClassVar[bool] = True
    tolerant: ClassVar[bool] = False

    def describe(self) -> str:
        return "bitwise"

    def needs_scale(self) -> bool:
        return False

    def bound(self, scale: Scale) -> float:
        return 0.0

    def judge(self, e: Elements, scale: Scale) -> Judgement:
        return Judgement(e.differ, None, None)


@dataclass(frozen=True)
class OpByOp(Bitwise):
    """Bitwise, unless proved op by op: an array whose bits differ passes where both
    programs, run operation by operation on the same inputs, compute it from values equal
    bit for bit to the old program's, and compute it equal to the old program's same key
    (docs/design.md, "Proved op by op"). Compared alone, it fails as `Bitwise` does; the
    proof is made by whoever holds the programs (`parity.origin._proof`)."""

    kind: ClassVar[str] = "op_by_op"
    proves: ClassVar[bool] = True

    def describe(self) -> str:
        return "bitwise, or proved op by op"


@dataclass(frozen=True)
class UpToRounding(OpByOp):
    """Bitwise, unless proved op by op, or else proved up to rounding: each operation of the
    new program, computed again on the base's own values, gives the base's value bit for
    bit or within that one operation's rounding (docs/design.md, "Proved up to rounding").
    A separate rule so that `op_by_op` keeps meaning the same operations, bit for bit; this
    one admits a refactor that reorders arithmetic on purpose (a fused projection, a loss
    summed in another order), and says so in its note."""

    kind: ClassVar[str] = "up_to_rounding"
    rounds: ClassVar[bool] = True

    def describe(self) -> str:
        return "bitwise, or proved up to rounding"


@dataclass(frozen=True)
class Ulp(Rule):
    """Elementwise ulp distance at most `max_ulp` (an int >= 0)."""

    max_ulp: int
    kind: ClassVar[str] = "ulp"
    elementwise: ClassVar[bool] = True
    unit: ClassVar[Unit] = "ulp"

    def __post_init__(self) -> None:
        if isinstance(self.max_ulp, bool) or not isinstance(self.max_ulp, int | np.integer):
            raise ValueError(f"rule 'ulp': max_ulp must be an int, got {self.max_ulp!r}")
        if self.max_ulp < 0:
            raise ValueError(f"rule 'ulp': max_ulp must be >= 0, got {self.max_ulp!r}")
        object.__setattr__(self, "max_ulp", int(self.max_ulp))

    def describe(self) -> str:
        return f"ulp <= {self.max_ulp}"

    def needs_scale(self) -> bool:
        return False

    def bound(self, scale: Scale) -> float:
        return float(self.max_ulp)

    def judge(self, e: Elements, scale: Scale) -> Judgement:
        violating = (e.finite & (e.ulp > self.max_ulp)) | e.special
        return Judgement(violating, e.ulp.astype(np.float64), float(self.max_ulp))


@dataclass(frozen=True)
class Close(Rule):
    """`|a - b| <= atol + rtol*|b|`, `b` the expected value.

    `atol_ulps`, when set, replaces `atol` (which must then be 0): the absolute tolerance
    is that many ulps of the expected array's largest finite magnitude, in its dtype.
    """

    atol: float = 0.0
    rtol: float = 0.0
    atol_ulps: float | None = None
    kind: ClassVar[str] = "close"
    elementwise: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_nonneg("close", "atol", self.atol)
        check_nonneg("close", "rtol", self.rtol)
        if self.atol_ulps is not None:
            check_nonneg("close", "atol_ulps", self.atol_ulps)
            if self.atol != 0:
                raise ValueError(
                    f"rule 'close': set atol or atol_ulps, not both (got atol={self.atol!r}, "
                    f"atol_ulps={self.atol_ulps!r})"
                )
            object.__setattr__(self, "atol_ulps", float(self.atol_ulps))
        object.__setattr__(self, "atol", float(self.atol))
        object.__setattr__(self, "rtol", float(self.rtol))

    def describe(self) -> str:
        atol = f"{self.atol:g}" if self.atol_ulps is None else f"{self.atol_ulps:g} ulp(max|b|)"
        return f"|a-b| <= {atol} + {self.rtol:g}*|b|"

    def needs_scale(self) -> bool:
        return self.rtol != 0 or self.atol_ulps is not None

    def judge_needs_scale(self) -> bool:
        return self.atol_ulps is not None  # rtol scales each element by its own |b|

    def effective_atol(self, scale: Scale) -> float:
        """`atol`, or `atol_ulps` ulps of the expected array's largest finite magnitude."""
        if self.atol_ulps is None:
            return self.atol
        return self.atol_ulps * spacing_at(scale.max_abs, scale.dtype)

    def bound(self, scale: Scale) -> float:
        return self.effective_atol(scale) + self.rtol * scale.max_abs

    def judge(self, e: Elements, scale: Scale) -> Judgement:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            allowed = self.effective_atol(scale) + self.rtol * e.abs_expected
            # `not <=` rather than `>` so that a NaN difference (inf - inf) is a violation.
            violating = (e.finite & ~(e.diff <= allowed)) | e.special
            score = np.where(e.diff == 0, 0.0, e.diff / allowed)
        return Judgement(violating, score, allowed)


@dataclass(frozen=True)
class RelativeToMax(Rule):
    """`|a - b| <= k * max|b|`: a bound relative to the expected array's largest finite
    magnitude.

    For arrays whose scale varies from case to case (random configurations, tied heads
    with large logits), where fp32 reassociation error grows with the magnitudes summed,
    not with each element's own size.
    """

    k: float
    kind: ClassVar[str] = "relative_to_max"
    elementwise: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_nonneg("relative_to_max", "k", self.k)
        object.__setattr__(self, "k", float(self.k))

    def describe(self) -> str:
        return f"|a-b| <= {self.k:g}*max|b|"

    def bound(self, scale: Scale) -> float:
        return self.k * scale.max_abs

    def judge(self, e: Elements, scale: Scale) -> Judgement:
        return judge_within(e, self.bound(scale))
