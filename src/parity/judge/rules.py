"""Rules: how far a float array may move from its golden, one object per rule.

A rule measures the violations of one pair of arrays and states its own bound. It is the
only place that knows its arithmetic: `parity.judge.compare` walks every array the same way and
asks the rule three things:

- `bound(scale)`: the largest allowed deviation for an array of that scale, in the rule's
  `unit` (`"abs"` for `|a-b|`, `"ulp"` for ulp distance); reports plot errors against it.
- `judge(e, scale)`: for the elements of `e` (an `Elements`), which break the rule and how
  badly (a score; the worst element is the one with the largest score). `parity.judge.compare`
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

`scale` is a `Scale`, the facts about the whole golden array a rule may need before judging
single elements (its largest finite magnitude). Splitting the two is what lets a caller
judge an array chunk by chunk and still get the bound of the whole array.

Rules only judge *finite float* elements. What every class shares is handled by the
caller, never by a rule: dtypes and shapes are strict, NaN and ±inf must sit at the same
positions, and integer and bool arrays are compared exactly.

Adding a rule is one class here, registered in `RULES` under its `kind`, so that
`ToleranceClass.from_dict` (and the golden files' JSON) can name it.

This module imports numpy and ml_dtypes only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from parity.judge.floats import largest_finite_abs
from parity.judge.ulp import spacing_at

__all__ = [
    "RULES",
    "Bitwise",
    "Budget",
    "Calibrated",
    "Close",
    "Elements",
    "Judgement",
    "LogitKL",
    "Reduction",
    "RelativeToMax",
    "Rule",
    "Scale",
    "Ulp",
    "rule_from_dict",
    "unit_roundoff",
]

Unit = Literal["abs", "ulp", "kl"]


@dataclass(frozen=True)
class Scale:
    """Facts about a whole golden array that a rule may need before judging its elements.

    **Fields:**

    - `dtype`: the golden's dtype.
    - `max_abs`: its largest finite magnitude, 0.0 when it has no finite element.
    """

    dtype: np.dtype[Any]
    max_abs: float

    @classmethod
    def for_rule(cls, rule: Rule, golden: np.ndarray, g64: np.ndarray | None = None) -> Scale:
        """`Scale.of(golden)` if `rule` needs it, else a placeholder without the pass."""
        return cls.of(golden, g64) if rule.needs_scale() else cls(golden.dtype, 0.0)

    @classmethod
    def of(cls, golden: np.ndarray, g64: np.ndarray | None = None) -> Scale:
        """The scale of `golden` (`g64`: the same array as float64, if the caller has it)."""
        x64 = g64 if g64 is not None else golden.astype(np.float64)
        return cls(golden.dtype, largest_finite_abs(x64))


@dataclass(frozen=True)
class Elements:
    """The elements of one pair of float arrays, flattened, as the rules see them.

    **Fields:**

    - `differ`: the bits differ.
    - `finite`: both values are finite.
    - `special`: a NaN or ±inf sits in one array only (or the infs differ in sign).
    - `diff`: `|a-b|` in float64 where both are finite, else 0.
    - `abs_golden`: `|b|` in float64 where both are finite, else 0.
    - `ulp`: ulp distance where both are finite, else 0 (uint64).
    - `actual`, `golden`: the judged elements of both arrays as float64, flattened (for an
      `elementwise` rule only those whose bits differ; `None` where a caller builds
      elements without them; the rules that need them say so).
    - `shape`: the arrays' shape for a rule judging whole arrays, for rules that judge
      rows; `(n,)` for the `n` elements an elementwise rule is handed (`None` likewise).
    """

    differ: np.ndarray
    finite: np.ndarray
    special: np.ndarray
    diff: np.ndarray
    abs_golden: np.ndarray
    ulp: np.ndarray
    actual: np.ndarray | None = None
    golden: np.ndarray | None = None
    shape: tuple[int, ...] | None = None

    def both(self, rule: str) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
        """`actual`, `golden` and `shape`; `ValueError` naming `rule` if absent."""
        if self.actual is None or self.golden is None or self.shape is None:
            raise ValueError(
                f"rule {rule!r} needs both arrays and their shape in Elements (actual, golden, "
                "shape); build Elements as parity.judge.compare does"
            )
        return self.actual, self.golden, self.shape


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


def _check_nonneg(rule: str, field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(
            f"rule {rule!r}: {field} must be a number, got {value!r} ({type(value).__name__})"
        )
    if not math.isfinite(float(value)) or value < 0:
        raise ValueError(f"rule {rule!r}: {field} must be finite and >= 0, got {value!r}")


def _judge_within(e: Elements, bound: float) -> Judgement:
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

    def describe(self) -> str:
        raise NotImplementedError

    def needs_scale(self) -> bool:
        """Whether `bound` and `judge` read the golden's `Scale`; when not, callers skip the
        pass over the golden that measures it."""
        return True

    def judge_needs_scale(self) -> bool:
        """Whether `judge` itself reads the `Scale` (not only `bound`): then a chunked
        comparison measures the golden's scale in a pass of its own before judging."""
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
        return f", |a-b| {float(e.diff[i]):.3g} vs allowed {allowed:.3g}"

    def params(self) -> dict[str, Any]:
        """The rule's parameters, JSON-safe (`rule_from_dict` reads them back)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # pyright: ignore[reportArgumentType]


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
    """`|a - b| <= atol + rtol*|b|`, `b` the golden.

    `atol_ulps`, when set, replaces `atol` (which must then be 0): the absolute tolerance
    is that many ulps of the golden's largest finite magnitude, in the golden's dtype.
    """

    atol: float = 0.0
    rtol: float = 0.0
    atol_ulps: float | None = None
    kind: ClassVar[str] = "close"
    elementwise: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_nonneg("close", "atol", self.atol)
        _check_nonneg("close", "rtol", self.rtol)
        if self.atol_ulps is not None:
            _check_nonneg("close", "atol_ulps", self.atol_ulps)
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
        """`atol`, or `atol_ulps` ulps of the golden's largest finite magnitude."""
        if self.atol_ulps is None:
            return self.atol
        return self.atol_ulps * spacing_at(scale.max_abs, scale.dtype)

    def bound(self, scale: Scale) -> float:
        return self.effective_atol(scale) + self.rtol * scale.max_abs

    def judge(self, e: Elements, scale: Scale) -> Judgement:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            allowed = self.effective_atol(scale) + self.rtol * e.abs_golden
            # `not <=` rather than `>` so that a NaN difference (inf - inf) is a violation.
            violating = (e.finite & ~(e.diff <= allowed)) | e.special
            score = np.where(e.diff == 0, 0.0, e.diff / allowed)
        return Judgement(violating, score, allowed)


@dataclass(frozen=True)
class RelativeToMax(Rule):
    """`|a - b| <= k * max|b|`: a bound relative to the golden's largest finite magnitude.

    For arrays whose scale varies from case to case (random configurations, tied heads
    with large logits), where fp32 reassociation error grows with the magnitudes summed,
    not with each element's own size.
    """

    k: float
    kind: ClassVar[str] = "relative_to_max"
    elementwise: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_nonneg("relative_to_max", "k", self.k)
        object.__setattr__(self, "k", float(self.k))

    def describe(self) -> str:
        return f"|a-b| <= {self.k:g}*max|b|"

    def bound(self, scale: Scale) -> float:
        return self.k * scale.max_abs

    def judge(self, e: Elements, scale: Scale) -> Judgement:
        return _judge_within(e, self.bound(scale))


def unit_roundoff(dtype: Any) -> float:
    """The unit roundoff `u` of a float dtype: half its machine epsilon (2**-24 for
    float32, 2**-8 for bfloat16, 2**-53 for float64), the largest relative error of one
    correctly rounded operation."""
    dt = np.dtype(dtype)
    if dt.kind == "f":  # numpy's own floats: no import of ml_dtypes for them
        return float(np.finfo(dt).eps) / 2
    import ml_dtypes

    return float(ml_dtypes.finfo(dt).eps) / 2


@dataclass(frozen=True)
class Reduction(Rule):
    """`|a - b| <= k * sqrt(K) * u * max|b|`: the error of a length-`K` reduction.

    `u` is the unit roundoff of the golden's dtype (`unit_roundoff`), `max|b|` the golden's
    largest finite magnitude and `K` the reduction length, declared per key in the class
    map as a class parameter (`"reduction[K=512]"`); `k` is a safety factor set by
    measurement.

    **Where it is a bound.** Reordering a sum of `K` terms moves the result by at most
    about `K * u * sum|x_i|` (the worst case, every rounding error aligned); when the
    rounding errors are independent and of random sign, the error grows like
    `sqrt(K) * u * sum|x_i|` with high probability (Higham and Mary, "A new approach to
    probabilistic rounding error analysis", 2019), which is what reassociation across
    instruction sets, tilings and device splits gives in practice. `max|b|` stands for
    `sum|x_i|`: the two agree up to a constant when the terms are of one sign or the
    result is not a small remainder of larger terms, and `k` absorbs that constant and the
    few reductions in sequence (matmul, then norm, then the next matmul).

    **Where it is not.** Heavy cancellation (a result much smaller than its terms: a
    residual, a difference of two cross-entropies) can exceed it by `sum|x_i| / max|b|`;
    aligned errors (constant inputs, a long bf16 accumulation that rounds the same way)
    grow like `K`, not `sqrt(K)`; many reductions composed through a deep network
    compound; and differences that are not reassociation (another `exp` or `rsqrt`
    approximation, a changed algorithm) are outside its model altogether.
    """

    k: float
    K: int | None = None
    kind: ClassVar[str] = "reduction"
    elementwise: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_nonneg("reduction", "k", self.k)
        object.__setattr__(self, "k", float(self.k))
        if self.K is not None:
            if isinstance(self.K, bool) or not isinstance(self.K, int | np.integer) or self.K < 1:
                raise ValueError(
                    f"rule 'reduction': K (the reduction length) must be an int >= 1, "
                    f"got {self.K!r}"
                )
            object.__setattr__(self, "K", int(self.K))

    def missing(self) -> list[str]:
        return [] if self.K is not None else ["K"]

    def describe(self) -> str:
        K = "K" if self.K is None else str(self.K)
        return f"|a-b| <= {self.k:g}*sqrt({K})*u*max|b|"

    def bound(self, scale: Scale) -> float:
        if self.K is None:
            raise ValueError(
                "rule 'reduction' has no reduction length K; declare it in the class map, "
                "e.g. ('taps.*', 'reduction[K=512]')"
            )
        return self.k * math.sqrt(self.K) * unit_roundoff(scale.dtype) * scale.max_abs

    def judge(self, e: Elements, scale: Scale) -> Judgement:
        return _judge_within(e, self.bound(scale))


@dataclass(frozen=True)
class Calibrated(Rule):
    """`|a - b| <= max(floor_ulps * ulp(max|b|), k * spread)`: the key's own measured noise
    as its bound.

    `spread` is the largest `|a-b|` that benign perturbations of the environment (other
    ISA caps, device counts, process layouts, a repeat) moved this key from its golden,
    as `parity calibrate --write` recorded it in the golden file; `parity.check` sets it
    per key (`"calibrated[k=4,spread=3.1e-06]"`), so the class map names the class alone.
    `k` is the margin over the measured noise; the floor, in ulps of the golden's largest
    finite magnitude, keeps a key whose noise measured zero from being held to bitwise
    where the next environment may move its last bit. The choice of both is argued in
    docs/design.md ("Tolerance from measured noise").
    """

    k: float
    floor_ulps: float = 0.0
    spread: float | None = None
    kind: ClassVar[str] = "calibrated"
    elementwise: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_nonneg("calibrated", "k", self.k)
        _check_nonneg("calibrated", "floor_ulps", self.floor_ulps)
        object.__setattr__(self, "k", float(self.k))
        object.__setattr__(self, "floor_ulps", float(self.floor_ulps))
        if self.spread is not None:
            _check_nonneg("calibrated", "spread", self.spread)
            object.__setattr__(self, "spread", float(self.spread))

    def missing(self) -> list[str]:
        return [] if self.spread is not None else ["spread"]

    def describe(self) -> str:
        spread = "spread" if self.spread is None else f"{self.spread:.3g}"
        return f"|a-b| <= max({self.floor_ulps:g} ulp(max|b|), {self.k:g}*{spread})"

    def needs_scale(self) -> bool:
        return self.floor_ulps != 0

    def bound(self, scale: Scale) -> float:
        if self.spread is None:
            raise ValueError(
                "rule 'calibrated' has no recorded spread for this key; record one with "
                "parity calibrate --write"
            )
        floor = self.floor_ulps * spacing_at(scale.max_abs, scale.dtype) if self.floor_ulps else 0.0
        return max(floor, self.k * self.spread)

    def judge(self, e: Elements, scale: Scale) -> Judgement:
        return _judge_within(e, self.bound(scale))


@dataclass(frozen=True)
class Budget(Rule):
    """`a <= b + rtol*|b|`: a one-sided budget (HLO bytes, instruction counts).

    Growth beyond the budget fails; any shrink passes, with the note "below budget: repin
    to ratchet it down", so that a refactor that makes the program smaller is not failed
    like one that bloats it, and the smaller figure becomes the new budget once repinned.
    """

    rtol: float
    kind: ClassVar[str] = "budget"
    # Judged whole: its note counts and ranks the shrunk elements of the whole array
    # (budgets are a few scalars, so nothing is lost).
    elementwise: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _check_nonneg("budget", "rtol", self.rtol)
        object.__setattr__(self, "rtol", float(self.rtol))

    def describe(self) -> str:
        return f"a <= b + {self.rtol:g}*|b| (growth only)"

    def bound(self, scale: Scale) -> float:
        return self.rtol * scale.max_abs

    def judge(self, e: Elements, scale: Scale) -> Judgement:
        a, g, _ = e.both("budget")
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            allowed = self.rtol * e.abs_golden
            growth = np.where(e.finite, a - g, 0.0)
            violating = (e.finite & ~(growth <= allowed)) | e.special
            score = np.where(growth <= 0, 0.0, growth / allowed)
        below = e.finite & (a < g)
        note = ""
        if below.any():
            i = int(np.argmax(np.where(below, (g - a) / np.maximum(e.abs_golden, 1e-300), 0)))
            note = (
                f"below budget: repin to ratchet it down ({int(np.count_nonzero(below))} "
                f"element(s) shrank, most {g[i]:.6g} -> {a[i]:.6g}, "
                f"{100 * (g[i] - a[i]) / abs(g[i]):.3g}% smaller)"
            )
        return Judgement(violating, score, allowed, note=note)

    def detail(self, j: Judgement, e: Elements, i: int) -> str:
        a, g, _ = e.both("budget")
        allowed = float(np.asarray(j.allowed).reshape(-1)[i]) if j.allowed is not None else 0.0
        return f", grew by {a[i] - g[i]:.6g} vs allowed {allowed:.6g}"


def _log_softmax(x: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 along the last axis (rows of -inf stay -inf)."""
    top = np.max(x, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = x - top
        return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


def _top_k(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the `k` largest entries per row, ties broken by the lower index."""
    order = np.lexsort((np.broadcast_to(np.arange(x.shape[-1]), x.shape), -x), axis=-1)
    return order[..., :k]


@dataclass(frozen=True)
class LogitKL(Rule):
    """Logits judged as distributions, one per position along the last axis.

    A position passes when `KL(softmax(b) || softmax(a)) <= tau` (nats, `b` the golden)
    and at least a share `p` of the golden's `top_k` tokens are among the actual's
    `top_k` (ties broken by the lower token index). Every element of a failing position
    breaks the rule. For logits that cannot be bitwise (bf16, another framework), where a
    max-|logit| bound misleads: a large logit difference in a token of negligible
    probability changes nothing a sampler sees, a small one between the top two changes
    the argmax.

    The KL is computed in float64 from both arrays' log-softmax. Positions holding a NaN
    are left to the NaN placement check that every class shares.
    """

    tau: float
    top_k: int = 1
    p: float = 1.0
    kind: ClassVar[str] = "logit_kl"
    unit: ClassVar[Unit] = "kl"
    elementwise: ClassVar[bool] = False  # a distribution per row: the array is judged whole

    def __post_init__(self) -> None:
        _check_nonneg("logit_kl", "tau", self.tau)
        _check_nonneg("logit_kl", "p", self.p)
        if self.p > 1:
            raise ValueError(f"rule 'logit_kl': p is a share, at most 1, got {self.p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int | np.integer):
            raise ValueError(f"rule 'logit_kl': top_k must be an int, got {self.top_k!r}")
        if self.top_k < 1:
            raise ValueError(f"rule 'logit_kl': top_k must be >= 1, got {self.top_k!r}")
        object.__setattr__(self, "tau", float(self.tau))
        object.__setattr__(self, "p", float(self.p))
        object.__setattr__(self, "top_k", int(self.top_k))

    def describe(self) -> str:
        return f"KL(b||a) <= {self.tau:g} and top-{self.top_k} agreement >= {self.p:g}"

    def needs_scale(self) -> bool:
        return False

    def bound(self, scale: Scale) -> float:
        return self.tau

    def positions(self, actual: np.ndarray, golden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per position (every index but the last axis): the KL and the top-k agreement.

        **Arguments:**

        - `actual`, `golden`: float arrays of one shape, the vocabulary on the last axis.

        **Returns:** `(kl, agreement)`, each of the leading shape; NaN rows give KL 0 and
        agreement 1 (the NaN placement check judges them).
        """
        a = np.asarray(actual, np.float64)
        g = np.asarray(golden, np.float64)
        if a.ndim == 0:
            a, g = a.reshape(1), g.reshape(1)
        nan_row = np.isnan(a).any(axis=-1) | np.isnan(g).any(axis=-1)
        la, lg = _log_softmax(a), _log_softmax(g)
        pg = np.exp(lg)
        with np.errstate(invalid="ignore"):
            # p*log(p/q) with the convention 0*log(0/q) = 0 (where the golden gives 0).
            terms = np.where(pg > 0, pg * (lg - la), 0.0)
        kl = np.where(nan_row, 0.0, np.maximum(terms.sum(axis=-1), 0.0))
        k = min(self.top_k, a.shape[-1])
        ta, tg = _top_k(a, k), _top_k(g, k)
        hits = (tg[..., :, None] == ta[..., None, :]).any(axis=-1).sum(axis=-1)
        agreement = np.where(nan_row, 1.0, hits / k)
        return kl, agreement

    def judge(self, e: Elements, scale: Scale) -> Judgement:
        a, g, shape = e.both("logit_kl")
        shape = shape or (1,)
        kl, agreement = self.positions(a.reshape(shape), g.reshape(shape))
        with np.errstate(divide="ignore", invalid="ignore"):
            kl_score = np.where(kl == 0, 0.0, kl / self.tau)
            short = np.maximum(self.p - agreement, 0.0)
            top_score = np.where(short == 0, 0.0, 1.0 + short)
        bad = ~(kl <= self.tau) | (agreement < self.p)
        width = shape[-1] if len(shape) else 1
        per_elem = np.repeat(bad.reshape(-1), width)
        score = np.repeat(np.maximum(kl_score, top_score).reshape(-1), width)
        allowed = np.full(per_elem.shape, self.tau)
        figure = float(kl.max()) if kl.size else 0.0
        return Judgement(per_elem | e.special, score, allowed, figure=figure)

    def detail(self, j: Judgement, e: Elements, i: int) -> str:
        a, g, shape = e.both("logit_kl")
        width = shape[-1] if shape else 1
        row = i // width
        kl, agree = self.positions(
            a.reshape(-1, width)[row : row + 1], g.reshape(-1, width)[row : row + 1]
        )
        return (
            f", position KL {float(kl[0]):.3g} vs tau {self.tau:g}, top-{self.top_k} "
            f"agreement {float(agree[0]):.3g} vs p {self.p:g}"
        )


#: Every rule by its `kind`.
RULES: Mapping[str, type[Rule]] = {
    r.kind: r for r in (Bitwise, Ulp, Close, RelativeToMax, Reduction, Calibrated, Budget, LogitKL)
}


def rule_from_dict(kind: str, params: Mapping[str, Any]) -> Rule:
    """Build a rule from its kind and parameters (as `Rule.params` gives them).

    Raises `ValueError` naming the known kinds, or the parameters a kind takes.
    """
    try:
        cls = RULES[kind]
    except (KeyError, TypeError):
        raise ValueError(f"unknown rule {kind!r}; known rules: {sorted(RULES)}") from None
    fields = {f.name for f in dataclasses.fields(cls)}  # pyright: ignore[reportArgumentType]
    unknown = sorted(set(params) - fields)
    if unknown:
        got = ", ".join(f"{k}={params[k]!r}" for k in unknown)
        raise ValueError(f"rule {kind!r} takes {sorted(fields) or 'no parameters'}, got {got}")
    try:
        return cls(**dict(params))
    except TypeError as e:
        raise ValueError(f"rule {kind!r}: {e}") from None
