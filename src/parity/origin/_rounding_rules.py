"""The rounding model of each kind of operation (`parity.origin._rounding`'s `Fresh` and
bounds): a rule takes the primitive's parameters, its operands' `Fresh` (already held in
the type the arithmetic is carried in) and that type's name, and gives the result's
`Fresh`, or None where the operands are outside what it models. Which primitive takes
which rule, and in which type each backend carries its arithmetic, is the registry's
(`parity.origin._primitives`).

- Sums (`add`, `add_any`, `sub`, `reduce_sum`, `cumsum`). Higham (chapters 3 and 4) bounds every
  summation order of n terms by |fl(sum) - sum| <= gamma_(n-1) sum |x_i|. Adding values of
  depths j and k gives depth j + k + 1, not max(j, k) + 1: for a sum of sums that is the
  number of leaves less one, so the bound covers every reassociation of the same leaves (a
  reordered loss sum, per-group sums added up). A reduction of n elements adds n - 1; a
  running sum (`cumsum`, however a backend scans it) adds n - 1 at its last element.
- Products (`mul`, `square`, `integer_pow` with y >= 0: y - 1 products). Factors off by
  gamma_j mag_a and gamma_k mag_b make a product off by gamma_(j+k+1) mag_a mag_b after its
  own rounding. The slack is (|a| + gamma_j mag_a + slack_a) slack_b + (|b| + gamma_k mag_b)
  slack_a.
- Inner products (`dot_general`): K products summed in any order, Higham's inner-product
  bound gamma_K |a|^T |b| on top of the operands' depths, and the slack as for a product.
  It assumes the arithmetic is done in the type it is given; a backend that first lowers
  the operands (bfloat16 passes on a TPU at default precision) or accumulates in a wider
  type (a bfloat16 `dot` on a CPU, in float32) is described by the registry, which
  narrows the operands or the result around this rule (`parity.origin._primitives`).
- Division by an exact divisor (`div`): one rounding, every part divided by |b|.
- No rounding, 1-Lipschitz (`max`, `min`, `abs`, `reduce_max`, `reduce_min`, `cummax`,
  `cummin`; `select_n` with an exact predicate picks): |max(x) - max(y)| <= max |x - y|, so
  the largest `mag` and `slack` of the inputs, at the largest depth, bound the result.
- Rearrangements (`reshape`, `transpose`, `squeeze`, `broadcast_in_dim`, `slice`,
  `concatenate`, `pad`, `rev`, `copy`, and `dynamic_slice`, `dynamic_update_slice`,
  `gather` with exact indices, clamped as XLA clamps them or filled): exact; each part
  moved alike.
- Scattered sums (`scatter-add` with exact indices: an embedding's gradient): each element
  of the operand plus the updates it receives, a sum of 1 + h terms in any order.
- Conversions (`convert_element_type`). Into a narrower float, one rounding (`narrowed`: the
  bound so far spent in the wider type, then u |centre| and u times that bound, as slack;
  IEEE's round to nearest even is a correct rounding). Into a wider float, the bound so far
  is spent in the narrower type: it becomes slack, and the depth starts again at 0 (so does
  a narrower operand of a `dot_general` with a wider `preferred_element_type`). Between
  floats and integers or booleans only an exact operand is modelled, converted as XLA does
  (truncated, saturated, NaN to 0; integers wrap).

Every other primitive, and complex types, have no rule. Nothing here imports jax, or
anything of parity but the bounds' arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from parity.origin._placement import gather_sources, scatter_targets
from parity.origin._rounding import (
    Fresh,
    exact,
    gamma,
    grounded,
    is_exact_type,
    is_float,
    name_of,
    narrowed,
    np_dtype,
    slack_of,
    times,
    unit_roundoff,
)

#: A rule: (the primitive's parameters, its operands, the type it computes in) -> the result.
Rule = Callable[[Mapping[str, Any], list[Fresh], str], "Fresh | None"]


def sum_of(a: Fresh, b: Fresh, sign: float, out: str) -> Fresh:
    centre, depth = a.centre + sign * b.centre, a.depth + b.depth + 1
    return Fresh(centre, a.mag + b.mag, depth, a.slack + b.slack, out)


def product(a: Fresh, b: Fresh, out: str) -> Fresh:
    ga, gb = gamma(a.depth, out), gamma(b.depth, out)
    from_a = np.abs(a.centre) + times(ga, a.mag) + a.slack
    slack = times(from_a, b.slack) + times(np.abs(b.centre) + times(gb, b.mag), a.slack)
    depth = a.depth + b.depth + 1
    return Fresh(a.centre * b.centre, times(a.mag, b.mag), depth, slack, out)


def quotient(a: Fresh, b: Fresh, out: str) -> Fresh | None:
    if not exact(b):
        return None
    by = np.abs(b.centre)
    return Fresh(a.centre / b.centre, a.mag / by, a.depth + 1, a.slack / by, out)


def reduce_sum(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh:
    f, axes = ops[0], tuple(p["axes"])
    depth = f.depth + max(math.prod(f.centre.shape[a] for a in axes) - 1, 0)
    return _built(lambda a: a.sum(axis=axes), [f], depth, out)


def extreme(which: Callable[..., np.ndarray], start: float) -> Callable[..., Fresh]:
    """`reduce_max` (`np.max`, start -inf) or `reduce_min`: 1-Lipschitz, no rounding."""

    def rule(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh:
        f, axes = ops[0], tuple(p["axes"])
        centre = which(f.centre, axis=axes, initial=start)
        mag = np.max(f.mag, axis=axes, initial=0.0)
        return Fresh(centre, mag, f.depth, np.max(slack_of(f), axis=axes, initial=0.0), out)

    return rule


def pointwise(op: Callable[..., np.ndarray]) -> Callable[..., Fresh]:
    """`max`, `min` (two operands) or `abs` (one): 1-Lipschitz in each operand."""

    def rule(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh:
        shape = np.broadcast_shapes(*(f.centre.shape for f in ops))
        mag = np.maximum.reduce([np.broadcast_to(f.mag, shape) for f in ops])
        slack = np.maximum.reduce([np.broadcast_to(f.slack, shape) for f in ops])
        centre = op(*(f.centre for f in ops))
        return Fresh(centre, mag, max(f.depth for f in ops), slack, out)

    return rule


def select_n(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh | None:
    pred, cases = ops[0], ops[1:]
    if not exact(pred):
        return None
    which = pred.centre.astype(np.int64)

    def pick(*fields: np.ndarray) -> np.ndarray:
        chosen = fields[0]
        for i, field in enumerate(fields[1:], start=1):
            chosen = np.where(which == i, field, chosen)
        return np.broadcast_to(chosen, fields[0].shape)

    return _built(pick, cases, max(c.depth for c in cases), out)


def dot_general(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh:
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
    from_l = np.abs(lhs.centre) + times(ga, lhs.mag) + slack_of(lhs)
    # A side with no slack (a value taken as given) adds exact zeros: not multiplied out,
    # where the other side is finite (an infinity times 0 is NaN, which a bound must keep).
    slack: Any = 0.0
    if np.any(rhs.slack) or not _finite(from_l):
        slack = dot(from_l, slack_of(rhs))
    if np.any(lhs.slack) or not (math.isfinite(gb) and _finite(rhs.centre, rhs.mag)):
        slack = slack + dot(slack_of(lhs), np.abs(rhs.centre) + times(gb, rhs.mag))
    slack = np.asarray(slack, np.float64)
    depth = lhs.depth + rhs.depth + max(k, 1)
    return Fresh(dot(lhs.centre, rhs.centre), dot(lhs.mag, rhs.mag), depth, slack, out)


def _finite(*arrays: np.ndarray) -> bool:
    return all(bool(np.isfinite(a).all()) for a in arrays)


def _cast(values: np.ndarray, src: str | None, name: str) -> np.ndarray:
    """Exact values converted as XLA does: floats truncated toward zero, saturated at the
    integer type's range, NaN to 0; integers wrap; anything to bool is "not zero"."""
    target = np_dtype(name)
    if target.kind in "iu" and not (src is not None and is_exact_type(src)):
        info = np.iinfo(target)
        top = float(info.max)
        top = np.nextafter(top, 0.0) if int(top) > info.max else top
        values = np.clip(np.nan_to_num(np.trunc(values), nan=0.0, posinf=top), info.min, top)
    elif target.kind in "iu":
        values = values.astype(np.int64)
    return values.astype(target)


def convert(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh | None:
    f = ops[0]
    new = name_of(p.get("new_dtype", out))
    if is_float(new) and (f.dtype is None or is_float(f.dtype)):
        if f.dtype is not None and unit_roundoff(new) <= unit_roundoff(f.dtype):
            return Fresh(f.centre, f.mag, f.depth, f.slack, new)
        return narrowed(f, new)
    if not exact(f):
        return None
    return grounded(_cast(f.centre, f.dtype, new))


def _built(combine: Callable[..., np.ndarray], ops: Sequence[Fresh], depth: int, out: str) -> Fresh:
    """`combine` applied alike to the operands' centres, mags and slacks."""
    parts = [(f.centre, f.mag, slack_of(f)) for f in ops]
    centre, mag, slack = (combine(*each) for each in zip(*parts, strict=True))
    return Fresh(centre, mag, depth, slack, out)


def moving(make: Callable[..., Callable[[np.ndarray], np.ndarray]]) -> Callable[..., Fresh]:
    """A one-operand rearrangement, from a function of (params, operand) to the move."""

    def rule(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh:
        return _built(make(p, ops[0]), ops[:1], ops[0].depth, out)

    return rule


def reshape(p: Mapping[str, Any], f: Fresh) -> Callable[[np.ndarray], np.ndarray]:
    order = p.get("dimensions")
    return lambda a: (a if order is None else a.transpose(order)).reshape(p["new_sizes"])


def broadcast(p: Mapping[str, Any], f: Fresh) -> Callable[[np.ndarray], np.ndarray]:
    shape = tuple(p["shape"])
    placed = [1] * len(shape)
    for i, d in enumerate(p["broadcast_dimensions"]):
        placed[d] = f.centre.shape[i]
    return lambda a: np.broadcast_to(a.reshape(placed), shape)


def slice_of(p: Mapping[str, Any], f: Fresh) -> Callable[[np.ndarray], np.ndarray]:
    strides = p.get("strides") or (1,) * f.centre.ndim
    index = tuple(map(slice, p["start_indices"], p["limit_indices"], strides))
    return lambda a: a[index]


def _starts(ops: Sequence[Fresh], shape: Sequence[int], sizes: Sequence[int]) -> Any:
    """Start indices clamped into range as XLA does; None where one is not exact."""
    if not all(exact(s) for s in ops):
        return None
    starts = np.clip([int(s.centre) for s in ops], 0, np.subtract(shape, sizes))
    return tuple(slice(b, b + n) for b, n in zip(starts, sizes, strict=True))


def dynamic_slice(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh | None:
    index = _starts(ops[1:], ops[0].centre.shape, p["slice_sizes"])
    return None if index is None else _built(lambda a: a[index], ops[:1], ops[0].depth, out)


def dynamic_update_slice(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh | None:
    f, update = ops[0], ops[1]
    index = _starts(ops[2:], f.centre.shape, update.centre.shape)
    if index is None:
        return None

    def put(whole: np.ndarray, part: np.ndarray) -> np.ndarray:
        whole = np.array(whole, dtype=np.float64)
        whole[index] = part
        return whole

    return _built(put, [f, update], max(f.depth, update.depth), out)


def concatenate(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh:
    axis = p["dimension"]
    return _built(
        lambda *parts: np.concatenate(parts, axis=axis), ops, max(f.depth for f in ops), out
    )


def pad(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh:
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


def summed(sign: float) -> Rule:
    """`add`, `add_any` (sign 1) or `sub` (sign -1) of two operands."""
    return lambda p, ops, out: sum_of(ops[0], ops[1], sign, out)


def negated(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh:
    """`neg`: exact, each part's sign flipped."""
    f = ops[0]
    return Fresh(-f.centre, f.mag, f.depth, f.slack, out)


def times_of(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh:
    """`mul` of two operands, `square` of one."""
    return product(ops[0], ops[-1], out)


def integer_power(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh | None:
    """`integer_pow` with y >= 0: y - 1 products of the operand, in whatever order the
    backend multiplies (by squaring or not: the depths add alike), y = 0 exact ones; a
    negative power divides by a rounded value, which has no rule."""
    y, f = int(p.get("y", 0)), ops[0]
    if y < 0:
        return None
    if y == 0:
        return Fresh(np.ones_like(f.centre), np.ones_like(f.centre), 0, np.zeros(()), out)
    power = Fresh(f.centre, f.mag, f.depth, f.slack, out)
    for _ in range(y - 1):
        power = product(power, f, out)
    return power


def cumulative_sum(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh:
    """`cumsum` along `axis` (from the end with `reverse`): each element a sum of the terms
    before it, in any order or tree (a scan's), so at most n - 1 additions deep."""
    f, axis, reverse = ops[0], int(p["axis"]), bool(p.get("reverse", False))

    def running(a: np.ndarray) -> np.ndarray:
        a = np.flip(a, axis) if reverse else a
        total = np.cumsum(a, axis=axis)
        return np.flip(total, axis) if reverse else total

    return _built(running, [f], f.depth + max(f.centre.shape[axis] - 1, 0), out)


def cumulative_extreme(which: np.ufunc) -> Rule:
    """`cummax` (`np.maximum`) or `cummin`: 1-Lipschitz running extremes, no rounding."""

    def rule(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh:
        f, axis, reverse = ops[0], int(p["axis"]), bool(p.get("reverse", False))

        def running(op: np.ufunc, a: np.ndarray) -> np.ndarray:
            a = np.flip(a, axis) if reverse else a
            done = op.accumulate(a, axis=axis)
            return np.flip(done, axis) if reverse else done

        centre = running(which, f.centre)
        mag, slack = running(np.maximum, f.mag), running(np.maximum, slack_of(f))
        return Fresh(centre, mag, f.depth, slack, out)

    return rule


def divided(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh | None:
    """`div` by an exact divisor."""
    return quotient(ops[0], ops[1], out)


def scatter_sum(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh | None:
    """`scatter-add`: each element of the operand plus the updates scattered onto it, the
    duplicates summed in whatever order the backend takes them (an embedding's gradient): a
    sum of 1 + h terms, h the most updates one element receives, so h additions deep on top
    of the deepest term. Exact indices only; a layout with batching dimensions has no rule."""
    operand, indices, updates = ops
    if not exact(indices):
        return None
    targets = scatter_targets(
        p, indices.centre.astype(np.int64), operand.centre.shape, updates.centre.shape
    )
    if targets is None:
        return None
    keep, where = targets
    shape = operand.centre.shape

    def scattered(a: np.ndarray, u: np.ndarray) -> np.ndarray:
        whole = np.array(np.broadcast_to(a, shape), dtype=np.float64)
        np.add.at(whole, where, np.broadcast_to(u, updates.centre.shape).reshape(-1)[keep])
        return whole

    hits = scattered(np.zeros(shape), np.ones(updates.centre.shape))
    depth = max(operand.depth, updates.depth) + int(hits.max(initial=0.0))
    parts = [scattered(a, u) for a, u in zip(
        (operand.centre, operand.mag, slack_of(operand)),
        (updates.centre, updates.mag, slack_of(updates)),
        strict=True,
    )]  # fmt: skip
    return Fresh(parts[0], parts[1], depth, parts[2], out)


def gathered(p: Mapping[str, Any], ops: list[Fresh], out: str) -> Fresh | None:
    """`gather` with exact indices: each result element an operand element moved (where a
    `fill` mode finds its window out of bounds, the fill value, exact): each part moved
    alike, no rounding."""
    operand, indices = ops
    if not exact(indices):
        return None
    valid, flat, shape = gather_sources(p, indices.centre.astype(np.int64), operand.centre.shape)
    fill = p.get("fill_value")
    fill = math.nan if fill is None else float(fill)

    def take(a: np.ndarray, empty: float) -> np.ndarray:
        moved = np.broadcast_to(a, operand.centre.shape).reshape(-1)[flat].reshape(shape)
        return np.where(valid.reshape(shape), moved, empty)

    centre = take(operand.centre, fill)
    mag = take(operand.mag, abs(fill))
    return Fresh(centre, mag, operand.depth, take(slack_of(operand), 0.0), out)
