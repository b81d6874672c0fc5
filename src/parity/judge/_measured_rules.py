"""The rules whose bound is measured or propagated rather than a fixed tolerance:
`Reduction` (the error of a length-K reduction), `Calibrated` (a multiple of the spread a
calibration measured), `Budget` (a figure that may shrink but not grow) and `LogitKL`
(the KL divergence of two logit rows), with `unit_roundoff`. Siblings of the rules with a
fixed tolerance (`parity.judge._fixed_rules`), registered with them in
`parity.judge._registry.RULES`.

This module imports numpy, and ml_dtypes for a dtype numpy does not know.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from parity.judge._floats import count, sig
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

__all__ = ["Budget", "Calibrated", "LogitKL", "Reduction", "unit_roundoff"]


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

    `u` is the unit roundoff of the expected array's dtype (`unit_roundoff`), `max|b|` its
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
        check_nonneg("reduction", "k", self.k)
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
        return judge_within(e, self.bound(scale))


@dataclass(frozen=True)
class Calibrated(Rule):
    """`|a - b| <= max(floor_ulps * ulp(max|b|), k * spread)`: the key's own measured noise
    as its bound.

    `spread` is the largest `|a-b|` that benign perturbations of the environment (other
    ISA caps, device counts, process layouts, a repeat) moved this key from its golden,
    as `parity calibrate --write` recorded it in the golden file; the check sets it per key
    as data, the exact float (`parity.calibrated._bounds.bind_calibrated`), so the class
    map and every report name the class alone.
    `k` is the margin over the measured noise; the floor, in ulps of the expected array's largest
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
        check_nonneg("calibrated", "k", self.k)
        check_nonneg("calibrated", "floor_ulps", self.floor_ulps)
        object.__setattr__(self, "k", float(self.k))
        object.__setattr__(self, "floor_ulps", float(self.floor_ulps))
        if self.spread is not None:
            check_nonneg("calibrated", "spread", self.spread)
            object.__setattr__(self, "spread", float(self.spread))

    def missing(self) -> list[str]:
        return [] if self.spread is not None else ["spread"]

    def describe(self) -> str:
        spread = "spread" if self.spread is None else sig(self.spread)
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
        return judge_within(e, self.bound(scale))


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
        check_nonneg("budget", "rtol", self.rtol)
        object.__setattr__(self, "rtol", float(self.rtol))

    def describe(self) -> str:
        return f"a <= b + {self.rtol:g}*|b| (growth only)"

    def bound(self, scale: Scale) -> float:
        return self.rtol * scale.max_abs

    def judge(self, e: Elements, scale: Scale) -> Judgement:
        a, b, _ = e.both("budget")
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            allowed = self.rtol * e.abs_expected
            growth = np.where(e.finite, a - b, 0.0)
            violating = (e.finite & ~(growth <= allowed)) | e.special
            score = np.where(growth <= 0, 0.0, growth / allowed)
        below = e.finite & (a < b)
        note = ""
        if below.any():
            i = int(np.argmax(np.where(below, (b - a) / np.maximum(e.abs_expected, 1e-300), 0)))
            note = (
                f"below budget: repin to ratchet it down "
                f"({count(int(np.count_nonzero(below)), 'element')} shrank, "
                f"most {b[i]:.6g} -> {a[i]:.6g}, "
                f"{sig(100 * (b[i] - a[i]) / abs(b[i]))}% smaller)"
            )
        return Judgement(violating, score, allowed, note=note)

    def detail(self, j: Judgement, e: Elements, i: int) -> str:
        a, b, _ = e.both("budget")
        allowed = float(np.asarray(j.allowed).reshape(-1)[i]) if j.allowed is not None else 0.0
        return f", grew by {a[i] - b[i]:.6g} vs allowed {allowed:.6g}"


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

    A position passes when `KL(softmax(b) || softmax(a)) <= tau` (nats, `b` the expected
    logits) and at least a share `p` of the expected side's `top_k` tokens are among the
    actual's `top_k` (ties broken by the lower token index). Every element of a failing
    position breaks the rule. For logits that cannot be bitwise (bf16, another framework),
    where a max-|logit| bound misleads: a large logit difference in a token of negligible
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
        check_nonneg("logit_kl", "tau", self.tau)
        check_nonneg("logit_kl", "p", self.p)
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

    def positions(self, actual: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per position (every index but the last axis): the KL and the top-k agreement.

        **Arguments:**

        - `actual`, `expected`: float arrays of one shape, the vocabulary on the last axis.

        **Returns:** `(kl, agreement)`, each of the leading shape; NaN rows give KL 0 and
        agreement 1 (the NaN placement check judges them).
        """
        a = np.asarray(actual, np.float64)
        b = np.asarray(expected, np.float64)
        if a.ndim == 0:
            a, b = a.reshape(1), b.reshape(1)
        nan_row = np.isnan(a).any(axis=-1) | np.isnan(b).any(axis=-1)
        la, lb = _log_softmax(a), _log_softmax(b)
        pb = np.exp(lb)
        with np.errstate(invalid="ignore"):
            # p*log(p/q) with the convention 0*log(0/q) = 0 (where the expected side gives 0).
            terms = np.where(pb > 0, pb * (lb - la), 0.0)
        kl = np.where(nan_row, 0.0, np.maximum(terms.sum(axis=-1), 0.0))
        k = min(self.top_k, a.shape[-1])
        ta, tb = _top_k(a, k), _top_k(b, k)
        hits = (tb[..., :, None] == ta[..., None, :]).any(axis=-1).sum(axis=-1)
        agreement = np.where(nan_row, 1.0, hits / k)
        return kl, agreement

    def judge(self, e: Elements, scale: Scale) -> Judgement:
        a, b, shape = e.both("logit_kl")
        shape = shape or (1,)
        kl, agreement = self.positions(a.reshape(shape), b.reshape(shape))
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
        a, b, shape = e.both("logit_kl")
        width = shape[-1] if shape else 1
        row = i // width
        kl, agree = self.positions(
            a.reshape(-1, width)[row : row + 1], b.reshape(-1, width)[row : row + 1]
        )
        return (
            f", position KL {sig(float(kl[0]))} vs tau {self.tau:g}, top-{self.top_k} "
            f"agreement {sig(float(agree[0]))} vs p {self.p:g}"
        )
