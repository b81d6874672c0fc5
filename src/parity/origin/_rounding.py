"""How far floating-point rounding can move one operation's result (issue 59, shadow
replay): for a jax primitive applied to the base program's values, the exact result of the
new program's arithmetic and a bound that every floating-point evaluation of it, in any
order of its sums, stays within.

**The value.** A `Fresh` holds `centre`, the arithmetic carried out in float64 on the
base's values; `mag`, the sum of the absolute terms its rounding error scales with (for a
dot, the dot of the absolute values); `depth`, the most roundings one term can meet on its
way to the result; and `slack`, an absolute error that does not scale with `mag` (a
rounding into a narrower type). A base value is `grounded`: exact, depth 0, no slack.
`within` accepts a candidate (what the new program computed) that lies no further from the
centre than `allowed`: gamma(depth, dtype) mag + gamma(depth, float64) mag + (1 +
gamma(depth, dtype)) slack. The second term is the centre's own float64 rounding, which
follows the same arithmetic (it counts only for a float64 program); the factor on the
slack is the growth of an error already made through the roundings still to come.

**The rounding rule.** The IEEE 754 standard makes +, -, *, / and sqrt correctly rounded:
the result in a type of unit roundoff u is the exact one times (1 + d), |d| <= u
(`unit_roundoff`). Integer arithmetic is exact (u is 0; an overflow wraps far from the
centre and is refused). Higham, *Accuracy and Stability of Numerical Algorithms* (2nd ed.,
2002), bounds n such factors together by gamma_n = n u / (1 - n u) (Lemma 3.1, `gamma`),
and gamma_j + gamma_k + gamma_j gamma_k <= gamma_(j+k): depths add.

**Per kind of operation** the rules are `parity.origin._rounding_rules`'s, and which
primitive takes which rule, and how each backend computes it, is
`parity.origin._primitives`'s registry (`model` there).

**Narrower types.** A value computed in one float type and rounded into a narrower one
(a conversion to bfloat16; a bfloat16 `dot` accumulated in float32 and rounded once; a
TPU's float32 `dot` at default precision, whose operands are rounded to bfloat16 first)
is `narrowed`: the bound so far is spent in the type it was computed in, and one rounding
into the narrower type is added to it as slack, u |centre| + u times that bound.

Left out: results below a type's smallest normal number, which XLA's CPU backend flushes
to zero (the relative rule does not describe it; such a candidate may be refused). Nothing
here imports jax, or anything of parity; `ml_dtypes` only for a type numpy lacks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Fresh",
    "allowed",
    "exact",
    "gamma",
    "grounded",
    "held_in",
    "is_exact_type",
    "is_float",
    "name_of",
    "narrowed",
    "np_dtype",
    "part_of",
    "slack_of",
    "split_part",
    "stacked",
    "times",
    "unit_roundoff",
    "within",
]

#: The bits of precision p of each common float type (stored bits + 1): u is 2**-p.
_PRECISION = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}


@dataclass(frozen=True)
class Fresh:
    """The new program's arithmetic on the base's values, and what bounds its rounding.

    **Fields** (arrays of one shape, float64; `slack` may be a broadcastable scalar):

    - `centre`: the arithmetic carried out in float64.
    - `mag`: >= |centre|; the sum of absolute terms the rounding error scales with.
    - `depth`: the most roundings one term may meet, in any order of the same sums.
    - `slack`: >= 0; absolute error outside gamma (a rounding into a narrower type).
    - `dtype`: its type's name where known (`model` gives its output's, `grounded` the array's).
    """

    centre: np.ndarray
    mag: np.ndarray
    depth: int
    slack: np.ndarray
    dtype: str | None = None


def name_of(dtype: Any) -> str:
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name


def np_dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:  # an ml_dtypes type ("bfloat16") that numpy only knows once registered
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def is_float(name: str) -> bool:
    return name in _PRECISION or name.startswith("float")


def is_exact_type(name: str) -> bool:
    return name == "bool" or name.startswith(("int", "uint"))


def unit_roundoff(dtype: Any) -> float:
    """The largest relative error of one correct rounding into `dtype`.

    **Arguments:**

    - `dtype`: a numpy dtype, a type numpy accepts as one, or its name ("bfloat16").

    **Returns:** 2**-p for a float type with p bits of precision; 0.0 for integers and
    booleans, whose arithmetic is exact. Raises `ValueError` for any other type (complex).
    """
    name = name_of(dtype)
    if name in _PRECISION:
        return 2.0 ** -_PRECISION[name]
    if is_exact_type(name):
        return 0.0
    if is_float(name):  # the float8 kinds and other ml_dtypes floats
        import ml_dtypes

        return float(ml_dtypes.finfo(np_dtype(name)).eps) / 2
    raise ValueError(f"no rounding model for dtype {name}: only real floats and integers")


def gamma(n: int, dtype: Any) -> float:
    """Higham's gamma_n = n u / (1 - n u): what n roundings into `dtype` can do at most.

    **Arguments:**

    - `n`: the number of roundings (>= 0).
    - `dtype`: as for `unit_roundoff`.

    **Returns:** gamma_n as a float; inf where n u >= 1 (no bound).
    """
    nu = n * unit_roundoff(dtype)
    return math.inf if nu >= 1 else nu / (1 - nu)


def grounded(array: Any) -> Fresh:
    """A value taken as given (one of the base's): exact, depth 0, no slack.

    **Arguments:**

    - `array`: any array numpy reads (floats, integers or booleans, jax arrays included).

    **Returns:** its `Fresh`: centre its values in float64, mag their absolute values.
    """
    a = np.asarray(array)
    centre = a.astype(np.float64)
    return Fresh(centre, np.abs(centre), 0, _NO_SLACK, a.dtype.name)


#: The slack of a value taken as given: none, one zero for every element (`Fresh.slack`
#: broadcasts), where a whole array of zeros was as large as the value in float64.
_NO_SLACK = np.zeros(())
_NO_SLACK.flags.writeable = False


def allowed(f: Fresh, dtype: Any) -> np.ndarray:
    """How far a floating-point evaluation of `f`'s arithmetic in `dtype` may lie from
    `f.centre` (the module docstring gives the three terms and why).

    **Arguments:**

    - `f`: the modelled value.
    - `dtype`: the type the candidate was computed in.

    **Returns:** the bound per element, float64, in `f.centre`'s shape.
    """
    g = gamma(f.depth, dtype)
    scale = g + gamma(f.depth, "float64")
    bound = times(scale, f.mag) + times(1 + g, f.slack)
    return np.broadcast_to(bound, f.centre.shape)


def within(candidate: np.ndarray, f: Fresh, dtype: Any) -> tuple[bool, float]:
    """Whether `candidate` is `f`'s arithmetic up to rounding in `dtype`, and by how much.

    **Arguments:**

    - `candidate`: what the new program computed.
    - `f`: the model of that computation on the base's values.
    - `dtype`: the type the candidate was computed in.

    **Returns:** (accepted, margin). Accepted when the shapes agree, every NaN and
    infinity stands where the centre has the same, and every other element lies within
    `allowed`. The margin is the largest |candidate - centre| / allowed (0 where both are
    0, inf where only the bound is, or where the shapes or a non-finite value differ).
    """
    got = np.asarray(candidate)
    if got.shape != f.centre.shape:
        return False, math.inf
    got = got.astype(np.float64)
    centre = f.centre
    finite = np.isfinite(got) & np.isfinite(centre)
    same = (got == centre) | (np.isnan(got) & np.isnan(centre))
    if not np.all(finite | same):
        return False, math.inf
    bound = allowed(f, dtype)
    with np.errstate(divide="ignore", invalid="ignore"):  # inf - inf, x / 0: masked out
        diff = np.where(finite, np.abs(got - centre), 0.0)
        ratio = np.where(diff == 0, 0.0, diff / bound)
    ratio = np.where(np.isnan(ratio), math.inf, ratio)
    margin = float(ratio.max()) if ratio.size else 0.0
    return bool(np.all((diff <= bound) | ~finite)), margin


def times(x: Any, y: Any) -> np.ndarray:
    """x * y where 0 times anything (inf included) is 0: a bound with no error to scale."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where((np.asarray(x) == 0) | (np.asarray(y) == 0), 0.0, np.multiply(x, y))


def exact(f: Fresh) -> bool:
    """Whether `f` is exact: no rounding on its way, no slack."""
    return f.depth == 0 and not np.any(f.slack)


def slack_of(f: Fresh) -> np.ndarray:
    """`f.slack` in `f.centre`'s shape."""
    return np.broadcast_to(f.slack, f.centre.shape)


def held_in(f: Fresh, out: str) -> Fresh:
    """`f` as an operand of arithmetic in `out`: where it was computed in a float with a
    larger unit roundoff, its bound so far is spent there (it becomes slack, depth 0)."""
    src = f.dtype
    spent = f.depth > 0 and src is not None and is_float(src) and is_float(out)
    if not spent or unit_roundoff(src) <= unit_roundoff(out):
        return f
    return Fresh(f.centre, f.mag, 0, np.array(allowed(f, src)), out)


def narrowed(f: Fresh, to: str) -> Fresh:
    """`f`, computed in its own type, rounded once into `to`: its bound so far spent in the
    type it was computed in (`allowed`), plus that rounding, u |centre| + u times the bound
    (the rounded value lies within u of what was rounded, which lies within the bound of the
    centre), as slack; depth 0 from here."""
    spent = allowed(f, f.dtype if f.dtype is not None and is_float(f.dtype) else to)
    u = unit_roundoff(to)
    slack = spent + times(u, np.abs(f.centre) + spent)
    return Fresh(f.centre, f.mag, 0, slack, to)


def part_of(fresh: Fresh, take: Callable[[np.ndarray], np.ndarray]) -> Fresh:
    """The model of a part of a value modelled by `fresh`: `take` of each of its arrays
    (a row of it, a slice of one axis)."""
    slack = np.broadcast_to(fresh.slack, fresh.centre.shape)
    return Fresh(take(fresh.centre), take(fresh.mag), fresh.depth, take(slack), fresh.dtype)


def split_part(params: Any, fresh: Fresh, n: int) -> Fresh:
    """Result `n` of a `split` (`sizes` along `axis`) of a value modelled by `fresh`."""
    axis, sizes = int(params["axis"]), [int(k) for k in params["sizes"]]
    start = sum(sizes[:n])
    index = (slice(None),) * axis + (slice(start, start + sizes[n]),)
    return part_of(fresh, lambda a: a[index])


def stacked(models: Sequence[Fresh]) -> Fresh:
    """The model of values modelled by `models` stacked on a new leading axis (a scan's
    `ys`)."""
    return Fresh(
        np.stack([m.centre for m in models]),
        np.stack([m.mag for m in models]),
        max(m.depth for m in models),
        np.stack([np.broadcast_to(m.slack, m.centre.shape) for m in models]),
        models[0].dtype,
    )
