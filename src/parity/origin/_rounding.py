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

**Per kind of operation:**

- Sums (`add`, `add_any`, `sub`, `reduce_sum`). Higham (chapters 3 and 4) bounds every
  summation order of n terms by |fl(sum) - sum| <= gamma_(n-1) sum |x_i|. Adding values of
  depths j and k gives depth j + k + 1, not max(j, k) + 1: for a sum of sums that is the
  number of leaves less one, so the bound covers every reassociation of the same leaves (a
  reordered loss sum, per-group sums added up). A reduction of n elements adds n - 1.
- Products (`mul`, `square`, `integer_pow` with y = 2). Factors off by gamma_j mag_a and
  gamma_k mag_b make a product off by gamma_(j+k+1) mag_a mag_b after its own rounding.
  The slack is (|a| + gamma_j mag_a + slack_a) slack_b + (|b| + gamma_k mag_b) slack_a.
- Inner products (`dot_general`): K products summed in any order, Higham's inner-product
  bound gamma_K |a|^T |b| on top of the operands' depths, and the slack as for a product.
  It assumes the arithmetic is done in the output type or a wider one: a backend that
  first lowers the operands (TF32 on a GPU, bfloat16 passes on a TPU at default
  precision) computes something else, which this bound does not cover.
- Division by an exact divisor (`div`): one rounding, every part divided by |b|.
- No rounding, 1-Lipschitz (`max`, `min`, `abs`, `reduce_max`, `reduce_min`; `select_n`
  with an exact predicate picks): |max(x) - max(y)| <= max |x - y|, so the largest `mag`
  and `slack` of the inputs, at the largest depth, bound the result.
- Rearrangements (`reshape`, `transpose`, `squeeze`, `broadcast_in_dim`, `slice`,
  `concatenate`, `pad`, `rev`, `copy`, and `dynamic_slice`, `dynamic_update_slice` with
  exact start indices, clamped as XLA clamps them): exact; each part moved alike.
- Conversions (`convert_element_type`). Into a narrower float, one rounding: slack u
  |centre|. Into a wider float, the bound so far is spent in the narrower type: it becomes
  slack, and the depth starts again at 0 (so does a narrower operand of a `dot_general`
  with a wider `preferred_element_type`). Between floats and integers or booleans only an
  exact operand is modelled, converted as XLA does (truncated, saturated, NaN to 0;
  integers wrap).

Every other primitive, and complex types, have no model: `model` answers None. Left out:
results below a type's smallest normal number, which XLA's CPU backend flushes to zero
(the relative rule does not describe it; such a candidate may be refused). Nothing here
imports jax, or anything of parity; `ml_dtypes` only for a type numpy lacks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Fresh", "allowed", "gamma", "grounded", "model", "unit_roundoff", "within"]

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


def _name(dtype: Any) -> str:
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name


def _np_dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:  # an ml_dtypes type ("bfloat16") that numpy only knows once registered
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def _is_float(name: str) -> bool:
    return name in _PRECISION or name.startswith("float")


def _is_exact_type(name: str) -> bool:
    return name == "bool" or name.startswith(("int", "uint"))


def unit_roundoff(dtype: Any) -> float:
    """The largest relative error of one correct rounding into `dtype`.

    **Arguments:**

    - `dtype`: a numpy dtype, a type numpy accepts as one, or its name ("bfloat16").

    **Returns:** 2**-p for a float type with p bits of precision; 0.0 for integers and
    booleans, whose arithmetic is exact. Raises `ValueError` for any other type (complex).
    """
    name = _name(dtype)
    if name in _PRECISION:
        return 2.0 ** -_PRECISION[name]
    if _is_exact_type(name):
        return 0.0
    if _is_float(name):  # the float8 kinds and other ml_dtypes floats
        import ml_dtypes

        return float(ml_dtypes.finfo(_np_dtype(name)).eps) / 2
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
    return Fresh(centre, np.abs(centre), 0, np.zeros_like(centre), a.dtype.name)


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
    bound = _times(scale, f.mag) + _times(1 + g, f.slack)
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


def model(
    primitive: str,
    params: Mapping[str, Any],
    operands: Sequence[Fresh],
    out_dtype: Any,
) -> Fresh | None:
    """The new program's `primitive` applied to `operands`, with its rounding bound.

    **Arguments:**

    - `primitive`: the jax primitive's name (`eqn.primitive.name`).
    - `params`: its parameters (`eqn.params`), as jax 0.4.35 to 0.10.2 give them.
    - `operands`: one `Fresh` per operand, in the equation's order (literals grounded).
    - `out_dtype`: the type of the result.

    **Returns:** the result's `Fresh`, or None where this module has no model: a
    primitive the module docstring does not name, a complex type, a divisor, predicate,
    start index or integer conversion whose operand is not exact, a power other than 2.
    The caller then says "no rounding model for <primitive>".
    """
    rule = _RULES.get(primitive)
    out = _name(out_dtype)
    if rule is None or not (_is_float(out) or _is_exact_type(out)):
        return None
    with np.errstate(all="ignore"):  # inf and NaN are carried as values, as jax does
        return rule(params, [_held_in(f, out) for f in operands], out)


def _times(x: Any, y: Any) -> np.ndarray:
    """x * y where 0 times anything (inf included) is 0: a bound with no error to scale."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where((np.asarray(x) == 0) | (np.asarray(y) == 0), 0.0, np.multiply(x, y))


def _exact(f: Fresh) -> bool:
    return f.depth == 0 and not np.any(f.slack)


def _slack(f: Fresh) -> np.ndarray:
    return np.broadcast_to(f.slack, f.centre.shape)


def _held_in(f: Fresh, out: str) -> Fresh:
    """`f` as an operand of arithmetic in `out`: where it was computed in a float with a
    larger unit roundoff, its bound so far is spent there (it becomes slack, depth 0)."""
    src = f.dtype
    spent = f.depth > 0 and src is not None and _is_float(src) and _is_float(out)
    if not spent or unit_roundoff(src) <= unit_roundoff(out):
        return f
    return Fresh(f.centre, f.mag, 0, np.array(allowed(f, src)), out)


def _sum(a: Fresh, b: Fresh, sign: float, out: str) -> Fresh:
    centre, depth = a.centre + sign * b.centre, a.depth + b.depth + 1
    return Fresh(centre, a.mag + b.mag, depth, a.slack + b.slack, out)


def _product(a: Fresh, b: Fresh, out: str) -> Fresh:
    ga, gb = gamma(a.depth, out), gamma(b.depth, out)
    from_a = np.abs(a.centre) + _times(ga, a.mag) + a.slack
    slack = _times(from_a, b.slack) + _times(np.abs(b.centre) + _times(gb, b.mag), a.slack)
    depth = a.depth + b.depth + 1
    return Fresh(a.centre * b.centre, _times(a.mag, b.mag), depth, slack, out)


def _quotient(a: Fresh, b: Fresh, out: str) -> Fresh | None:
    if not _exact(b):
        return None
    by = np.abs(b.centre)
    return Fresh(a.centre / b.centre, a.mag / by, a.depth + 1, a.slack / by, out)


def _reduce_sum(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh:
    f, axes = ops[0], tuple(p["axes"])
    depth = f.depth + max(math.prod(f.centre.shape[a] for a in axes) - 1, 0)
    return _built(lambda a: a.sum(axis=axes), [f], depth, out)


def _extreme(which: Callable[..., np.ndarray], start: float) -> Callable[..., Fresh]:
    """`reduce_max` (`np.max`, start -inf) or `reduce_min`: 1-Lipschitz, no rounding."""

    def rule(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh:
        f, axes = ops[0], tuple(p["axes"])
        centre = which(f.centre, axis=axes, initial=start)
        mag = np.max(f.mag, axis=axes, initial=0.0)
        return Fresh(centre, mag, f.depth, np.max(_slack(f), axis=axes, initial=0.0), out)

    return rule


def _pointwise(op: Callable[..., np.ndarray]) -> Callable[..., Fresh]:
    """`max`, `min` (two operands) or `abs` (one): 1-Lipschitz in each operand."""

    def rule(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh:
        shape = np.broadcast_shapes(*(f.centre.shape for f in ops))
        mag = np.maximum.reduce([np.broadcast_to(f.mag, shape) for f in ops])
        slack = np.maximum.reduce([np.broadcast_to(f.slack, shape) for f in ops])
        centre = op(*(f.centre for f in ops))
        return Fresh(centre, mag, max(f.depth for f in ops), slack, out)

    return rule


def _select_n(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh | None:
    pred, cases = ops[0], ops[1:]
    if not _exact(pred):
        return None
    which = pred.centre.astype(np.int64)

    def pick(*fields: np.ndarray) -> np.ndarray:
        chosen = fields[0]
        for i, field in enumerate(fields[1:], start=1):
            chosen = np.where(which == i, field, chosen)
        return np.broadcast_to(chosen, fields[0].shape)

    return _built(pick, cases, max(c.depth for c in cases), out)


def _dot_general(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh:
    """A contraction per jax's layout (batch, lhs free, rhs free), built as einsum."""
    lhs, rhs = ops
    (lc, rc), (lb, rb) = p["dimension_numbers"]
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    left, right = [""] * lhs.centre.ndim, [""] * rhs.centre.ndim
    for i, j in [*zip(lb, rb, strict=True), *zip(lc, rc, strict=True)]:
        left[i] = right[j] = next(letters)
    for names in (left, right):
        for i, name in enumerate(names):
            names[i] = name or next(letters)
    free_l = [left[i] for i in range(len(left)) if i not in lc and i not in lb]
    free_r = [right[j] for j in range(len(right)) if j not in rc and j not in rb]
    spec = f"{''.join(left)},{''.join(right)}->{''.join([left[i] for i in lb] + free_l + free_r)}"

    def dot(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.einsum(spec, x, y, optimize=True)

    k = math.prod(lhs.centre.shape[i] for i in lc)
    ga, gb = gamma(lhs.depth, out), gamma(rhs.depth, out)
    from_l = np.abs(lhs.centre) + _times(ga, lhs.mag) + _slack(lhs)
    slack = dot(from_l, _slack(rhs)) + dot(_slack(lhs), np.abs(rhs.centre) + _times(gb, rhs.mag))
    depth = lhs.depth + rhs.depth + max(k, 1)
    return Fresh(dot(lhs.centre, rhs.centre), dot(lhs.mag, rhs.mag), depth, slack, out)


def _cast(values: np.ndarray, src: str | None, name: str) -> np.ndarray:
    """Exact values converted as XLA does: floats truncated toward zero, saturated at the
    integer type's range, NaN to 0; integers wrap; anything to bool is "not zero"."""
    target = _np_dtype(name)
    if target.kind in "iu" and not (src is not None and _is_exact_type(src)):
        info = np.iinfo(target)
        top = float(info.max)
        top = np.nextafter(top, 0.0) if int(top) > info.max else top
        values = np.clip(np.nan_to_num(np.trunc(values), nan=0.0, posinf=top), info.min, top)
    elif target.kind in "iu":
        values = values.astype(np.int64)
    return values.astype(target)


def _convert(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh | None:
    f = ops[0]
    new = _name(p.get("new_dtype", out))
    if _is_float(new) and (f.dtype is None or _is_float(f.dtype)):
        if f.dtype is not None and unit_roundoff(new) <= unit_roundoff(f.dtype):
            return Fresh(f.centre, f.mag, f.depth, f.slack, new)
        u = unit_roundoff(new)
        return Fresh(f.centre, f.mag, f.depth, f.slack * (1 + u) + u * np.abs(f.centre), new)
    if not _exact(f):
        return None
    return grounded(_cast(f.centre, f.dtype, new))


def _built(combine: Callable[..., np.ndarray], ops: Sequence[Fresh], depth: int, out: str) -> Fresh:
    """`combine` applied alike to the operands' centres, mags and slacks."""
    parts = [(f.centre, f.mag, _slack(f)) for f in ops]
    centre, mag, slack = (combine(*each) for each in zip(*parts, strict=True))
    return Fresh(centre, mag, depth, slack, out)


def _moving(make: Callable[..., Callable[[np.ndarray], np.ndarray]]) -> Callable[..., Fresh]:
    """A one-operand rearrangement, from a function of (params, operand) to the move."""

    def rule(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh:
        return _built(make(p, ops[0]), ops[:1], ops[0].depth, out)

    return rule


def _reshape(p: Mapping[str, Any], f: Fresh) -> Callable[[np.ndarray], np.ndarray]:
    order = p.get("dimensions")
    return lambda a: (a if order is None else a.transpose(order)).reshape(p["new_sizes"])


def _broadcast(p: Mapping[str, Any], f: Fresh) -> Callable[[np.ndarray], np.ndarray]:
    shape = tuple(p["shape"])
    placed = [1] * len(shape)
    for i, d in enumerate(p["broadcast_dimensions"]):
        placed[d] = f.centre.shape[i]
    return lambda a: np.broadcast_to(a.reshape(placed), shape)


def _slice(p: Mapping[str, Any], f: Fresh) -> Callable[[np.ndarray], np.ndarray]:
    strides = p.get("strides") or (1,) * f.centre.ndim
    index = tuple(map(slice, p["start_indices"], p["limit_indices"], strides))
    return lambda a: a[index]


def _starts(ops: Sequence[Fresh], shape: Sequence[int], sizes: Sequence[int]) -> Any:
    """Start indices clamped into range as XLA does; None where one is not exact."""
    if not all(_exact(s) for s in ops):
        return None
    starts = np.clip([int(s.centre) for s in ops], 0, np.subtract(shape, sizes))
    return tuple(slice(b, b + n) for b, n in zip(starts, sizes, strict=True))


def _dynamic_slice(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh | None:
    index = _starts(ops[1:], ops[0].centre.shape, p["slice_sizes"])
    return None if index is None else _built(lambda a: a[index], ops[:1], ops[0].depth, out)


def _dynamic_update_slice(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh | None:
    f, update = ops[0], ops[1]
    index = _starts(ops[2:], f.centre.shape, update.centre.shape)
    if index is None:
        return None

    def put(whole: np.ndarray, part: np.ndarray) -> np.ndarray:
        whole = np.array(whole, dtype=np.float64)
        whole[index] = part
        return whole

    return _built(put, [f, update], max(f.depth, update.depth), out)


def _concatenate(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh:
    axis = p["dimension"]
    return _built(
        lambda *parts: np.concatenate(parts, axis=axis), ops, max(f.depth for f in ops), out
    )


def _pad(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh:
    """Interior padding first, then edges; a negative edge crops the dilated operand."""

    def padded(a: np.ndarray, value: np.ndarray) -> np.ndarray:
        wide, placed, crop = [], [], []
        for n, (lo, hi, inner) in zip(a.shape, p["padding_config"], strict=True):
            dilated = n + max(n - 1, 0) * inner
            wide.append(max(lo, 0) + dilated + max(hi, 0))
            placed.append(slice(max(lo, 0), max(lo, 0) + dilated, inner + 1))
            crop.append(slice(max(-lo, 0), wide[-1] - max(-hi, 0)))
        whole = np.full(wide, value, dtype=np.float64)
        whole[tuple(placed)] = a
        return whole[tuple(crop)]

    return _built(padded, ops, max(f.depth for f in ops), out)


_RULES: dict[str, Callable[[Mapping[str, Any], list[Fresh], str], Fresh | None]] = {
    "add": lambda p, ops, out: _sum(ops[0], ops[1], 1.0, out),
    "add_any": lambda p, ops, out: _sum(ops[0], ops[1], 1.0, out),
    "sub": lambda p, ops, out: _sum(ops[0], ops[1], -1.0, out),
    "neg": lambda p, ops, out: Fresh(-ops[0].centre, ops[0].mag, ops[0].depth, ops[0].slack, out),
    "mul": lambda p, ops, out: _product(ops[0], ops[1], out),
    "square": lambda p, ops, out: _product(ops[0], ops[0], out),
    "integer_pow": lambda p, ops, out: _product(ops[0], ops[0], out) if p.get("y") == 2 else None,
    "div": lambda p, ops, out: _quotient(ops[0], ops[1], out),
    "dot_general": _dot_general,
    "reduce_sum": _reduce_sum,
    "reduce_max": _extreme(np.max, -math.inf),
    "reduce_min": _extreme(np.min, math.inf),
    "max": _pointwise(np.maximum),
    "min": _pointwise(np.minimum),
    "abs": _pointwise(np.abs),
    "select_n": _select_n,
    "convert_element_type": _convert,
    "reshape": _moving(_reshape),
    "transpose": _moving(lambda p, f: lambda a: np.transpose(a, p["permutation"])),
    "squeeze": _moving(lambda p, f: lambda a: np.squeeze(a, axis=tuple(p["dimensions"]))),
    "broadcast_in_dim": _moving(_broadcast),
    "slice": _moving(_slice),
    "rev": _moving(lambda p, f: lambda a: np.flip(a, axis=tuple(p["dimensions"]))),
    "copy": _moving(lambda p, f: lambda a: a),
    "dynamic_slice": _dynamic_slice,
    "dynamic_update_slice": _dynamic_update_slice,
    "concatenate": _concatenate,
    "pad": _pad,
}
