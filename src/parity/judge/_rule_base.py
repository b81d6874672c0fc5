"""What every rule shares. A rule says how far a float array may move from its expected one,
one object per rule: it measures the violations of one pair of arrays and states its own
bound. It is the only place that knows its arithmetic: `parity.judge._compare` walks every
array the same way and asks the rule three things:

- `bound(scale)`: the largest allowed deviation for an array of that scale, in the rule's
  `unit` (`"abs"` for `|a-b|`, `"ulp"` for ulp distance); reports plot errors against it.
- `judge(e, scale)`: for the elements of `e` (an `Elements`), which break the rule and how
  badly (a score; the worst element is the one with the largest score). `parity.judge._compare`
  hands a rule only the elements whose bits differ (elements with equal bits pass every
  rule), a chunk at a time for large arrays, when the rule is `elementwise`; other rules
  see every element of the whole array at once.
- `describe()`: the rule in words, for reports and messages.

Most rules judge element by element on `|a-b|` or the ulp distance. `Elements` also carries
both arrays (flattened, float64) and the array's shape, for rules that need the sign of a
difference (`Budget`: only growth fails) or a whole row at once (`LogitKL`: a distribution
per position along the last axis). A rule may attach a figure in its own unit
(`Judgement.figure`, e.g. the largest KL) and a note for a passing array
(`Judgement.note`, e.g. "below budget").

`scale` is a `Scale`, the facts about the whole expected array a rule may need before judging
single elements (its largest finite magnitude). Splitting the two is what lets a caller
judge an array chunk by chunk and still get the bound of the whole array.

Rules only judge *finite float* elements. What every class shares is handled by the
caller, never by a rule: dtypes and shapes are strict, NaN and ±inf must sit at the same
positions, and integer and bool arrays are compared exactly.

Here: the `Rule` base, the `Scale` of an expected array, the `Elements` a rule judges and the
`Judgement` it returns, and two helpers of the rules: `check_nonneg` (a parameter is a
finite number >= 0) and `judge_within` (one bound on `|a-b|` for the whole array). The
rules themselves are its subclasses: those with a fixed tolerance in
`parity.judge._fixed_rules`, those with a measured or propagated bound in
`parity.judge._measured_rules`; `parity.judge._registry` names them all by their `kind`.

This module imports numpy only.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from parity.judge._floats import largest_finite_abs, sig

__all__ = ["Elements", "Judgement", "Rule", "Scale", "Unit", "check_nonneg", "judge_within"]

Unit = Literal["abs", "ulp", "kl"]


@dataclass(frozen=True)
class Scale:
    """Facts about a whole expected array that a rule may need before judging its elements.

    **Fields:**

    - `dtype`: the expected array's dtype.
    - `max_abs`: its largest finite magnitude, 0.0 when it has no finite element.
    """

    dtype: np.dtype[Any]
    max_abs: float

    @classmethod
    def of(cls, expected: np.ndarray, e64: np.ndarray | None = None) -> Scale:
        """The scale of `expected` (`e64`: the same array as float64, if the caller has it)."""
        x64 = e64 if e64 is not None else expected.astype(np.float64)
        return cls(expected.dtype, largest_finite_abs(x64))


@dataclass(frozen=True)
class Elements:
    """The elements of one pair of float arrays, flattened, as the rules see them.

    **Fields:**

    - `differ`: the bits differ.
    - `finite`: both values are finite.
    - `special`: a NaN or ±inf sits in one array only (or the infs differ in sign).
    - `diff`: `|a-b|` in float64 where both are finite, else 0.
    - `abs_expected`: `|b|` in float64 where both are finite, else 0.
    - `ulp`: ulp distance where both are finite, else 0 (uint64).
    - `actual`, `expected`: the judged elements of both arrays as float64, flattened (for an
      `elementwise` rule only those whose bits differ; `None` where a caller builds
      elements without them; the rules that need them say so).
    - `shape`: the arrays' shape for a rule judging whole arrays, for rules that judge
      rows; `(n,)` for the `n` elements an elementwise rule is handed (`None` likewise).
    """

    differ: np.ndarray
    finite: np.ndarray
    special: np.ndarray
    diff: np.ndarray
    abs_expected: np.ndarray
    ulp: np.ndarray
    actual: np.ndarray | None = None
    expected: np.ndarray | None = None
    shape: tuple[int, ...] | None = None

    def both(self, rule: str) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
        """`actual`, `expected` and `shape`; `ValueError` naming `rule` if absent."""
        if self.actual is None or self.expected is None or self.shape is None:
            raise ValueError(
                f"rule {rule!r} needs both arrays and their shape in Elements (actual, expected, "
                "shape); build Elements as parity.judge._compare does"
            )
        return self.actual, self.expected, self.shape


@dataclass(frozen=True)
class Judgement:
    """What a rule makes of some elements.

    **Fields:**

    - `violating`: the elements that break the rule.
    - `score`: how badly each element fares, larger is worse (a figure divided by what is
      allowed there, or the ulp distance); `None` for rules without degrees (bitwise),
      where the worst element is the first that differs.
    - `allowed`: what was allowed per element, in the rule's unit (for messages), or `None`.
    - `figure`: the array's worst figure in the rule's own unit, for rules whose unit is
      neither `|a-b|` nor ulps (`LogitKL`: the largest per-position KL); `None` otherwise.
    - `note`: a line to report even when the array passes (`Budget`: below budget), or "".
    """

    violating: np.ndarray
    score: np.ndarray | None
    allowed: np.ndarray | float | None
    figure: float | None = None
    note: str = ""


def check_nonneg(rule: str, field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(
            f"rule {rule!r}: {field} must be a number, got {value!r} ({type(value).__name__})"
        )
    if not math.isfinite(float(value)) or value < 0:
        raise ValueError(f"rule {rule!r}: {field} must be finite and >= 0, got {value!r}")


def judge_within(e: Elements, bound: float) -> Judgement:
    """`|a-b| <= bound` for every element, one bound for the whole array."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        # `not <=` rather than `>` so that a NaN difference (inf - inf) is a violation.
        violating = (e.finite & ~(e.diff <= bound)) | e.special
        score = np.where(e.diff == 0, 0.0, e.diff / bound)
    return Judgement(violating, score, bound)


class Rule:
    """Base of every rule; see the module docstring for what each method means."""

    kind: ClassVar[str]
    unit: ClassVar[Unit] = "abs"
    #: Whether the rule tolerates some difference (False only for bitwise): decides whether
    #: a NaN/inf misplacement is the worst element and how a failure is worded.
    tolerant: ClassVar[bool] = True
    #: Whether each element is judged on its own (its verdict and score depend on that
    #: element and the `Scale` only). Such a rule sees only elements whose bits differ, a
    #: chunk at a time; a rule that is not (a median, a per-row statistic) sees every
    #: element of the whole array in one call, so the array is read whole. False unless a
    #: rule says otherwise, so that a rule written elsewhere keeps whole-array semantics.
    elementwise: ClassVar[bool] = False
    #: Whether an array this rule fails may still pass, proved op by op (`OpByOp`): both
    #: programs recorded operation by operation compute it from equal values (docs/design.md,
    #: "Proved op by op"). The comparator judges such a rule's arrays as it judges any;
    #: whoever holds the programs (`parity.origin._proof`) settles its failures.
    proves: ClassVar[bool] = False
    #: Whether a proof may go on, where op by op fails, to a proof up to rounding
    #: (`UpToRounding`): each operation of the new program computed again on the base's
    #: values, within that operation's own rounding (docs/design.md, "Proved up to
    #: rounding"; `parity.origin._shadow`).
    rounds: ClassVar[bool] = False

    def describe(self) -> str:
        raise NotImplementedError

    def needs_scale(self) -> bool:
        """Whether `bound` and `judge` read the expected array's `Scale`; when not, callers
        skip the pass over the expected array that measures it."""
        return True

    def judge_needs_scale(self) -> bool:
        """Whether `judge` itself reads the `Scale` (not only `bound`): then a chunked
        comparison measures the expected array's scale in a pass of its own before judging."""
        return self.needs_scale()

    def bound(self, scale: Scale) -> float:
        raise NotImplementedError

    def missing(self) -> list[str]:
        """Parameters the rule needs but has not been given (a `Reduction` without `K`):
        a class whose rule misses some can only be used with them set in the class map
        (`"name[K=512]"`)."""
        return []

    def judge(self, e: Elements, scale: Scale) -> Judgement:
        raise NotImplementedError

    def detail(self, j: Judgement, e: Elements, i: int) -> str:
        """The worst element's figure against what was allowed, for a failure's reason."""
        if j.allowed is None:
            return ""
        allowed = float(j.allowed) if np.ndim(j.allowed) == 0 else float(np.asarray(j.allowed)[i])
        if self.unit == "ulp":
            return f", {int(e.ulp[i])} ulp vs allowed {allowed:g}"
        return f", |a-b| {sig(float(e.diff[i]))} vs allowed {sig(allowed)}"

    def params(self) -> dict[str, Any]:
        """The rule's parameters, JSON-safe (`rule_from_dict` reads them back)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # pyright: ignore[reportArgumentType]
