"""Compare two trees of arrays, array by array, under their tolerance classes: each
`actual` array against its `expected` one, whatever the expected side is (a golden, the
baseline, a live tree: the finding's `reference` says which).

`compare_arrays` checks one array and returns a `Finding`: what differed, by how much,
where it was worst and what was allowed; it is a comparator, `measure_array` (the figures
and the verdict as plain data, an `ArrayVerdict`), and its message
(`parity.judge._reasons.array_reason`). `compare_trees` checks every key of two (nested)
mappings, reports every failure (not just the first), walks the keys in a declared
forward order and names the first divergence.

Differences are computed in float64 after an exact upcast, so bfloat16 and the other
ml_dtypes floats work like float32. jax arrays are taken through `np.asarray`; this
module imports numpy only (ml_dtypes' types are recognised without importing it:
`parity.judge._mldtypes`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from parity.judge._chunks import (
    DEFAULT_BUDGET,
    ArraySource,
    Source,
    elements_per_chunk,
    is_source,
    plan,
)
from parity.judge._classes import REGISTRY, ToleranceClass
from parity.judge._findings import ArrayVerdict, Comparison, Finding, Verdict
from parity.judge._reasons import absent_reason, array_reason, proof_clause
from parity.judge._tally import Tally, scan_scale
from parity.judge._tolerance import ClassMap, KeyClass, to_class
from parity.judge._trees import flatten
from parity.judge._ulp import is_float_dtype, is_int_dtype

__all__ = [
    "ArrayVerdict",
    "Comparison",
    "Finding",
    "Order",
    "Verdict",
    "compare_arrays",
    "compare_trees",
    "flatten",
    "measure_array",
]

#: A forward order: a sequence of keys, or a callable giving each key a sort key (or `None`
#: for keys it does not cover).
Order = Sequence[str] | Callable[[str], Any]


def _check_dtype(key: str, dtype: np.dtype[Any], side: str) -> None:
    if dtype.kind in "OUSMm" or (dtype.kind == "V" and dtype.names is not None):
        raise TypeError(
            f"key {key!r}: the {side} array has dtype {dtype}, which parity cannot "
            "compare; pass numeric (float, int, bool) arrays"
        )


def _as_array(key: str, x: Any, side: str) -> np.ndarray:
    arr = np.asarray(x)
    _check_dtype(key, arr.dtype, side)
    return arr


def _as_source(key: str, x: Any, side: str) -> Source:
    if is_source(x):
        _check_dtype(key, np.dtype(x.dtype), side)
        return x
    return ArraySource(_as_array(key, x, side))


def _index(i: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(j) for j in np.unravel_index(i, shape))


def _absent(
    key: str,
    tol: ToleranceClass,
    present: Any,
    verdict: Verdict,
    order: int | None,
    reference: str = "golden",
) -> Finding:
    if not is_source(present):
        present = np.asarray(present)
    shape, dtype = tuple(int(d) for d in present.shape), np.dtype(present.dtype).name
    expected_side = verdict == "missing"
    return Finding(
        key=key,
        class_name=tol.name,
        verdict=verdict,
        shape_actual=None if expected_side else shape,
        shape_expected=shape if expected_side else None,
        dtype_actual=None if expected_side else dtype,
        dtype_expected=dtype if expected_side else None,
        n_elements=math.prod(shape),
        allowed=tol.describe_allowed(),
        bitwise_equal=False,
        reason=absent_reason(key, shape, dtype, verdict, reference),
        order=order,
        rule=tol.rule.kind,
        unit=tol.rule.unit,
        reference=reference,
    )


def _tally(src_a: Source, src_e: Source, tol: ToleranceClass, budget: int) -> Tally:
    """Every chunk of the two (same dtype, same shape) sources folded into one `Tally`."""
    dtype, shape = src_e.dtype, src_e.shape
    is_float = is_float_dtype(dtype)
    kind: Literal["float", "int", "other"] = (
        "float" if is_float else "int" if is_int_dtype(dtype) else "other"
    )
    whole = is_float and not tol.rule.elementwise
    per_chunk = max(1, math.prod(shape)) if whole else elements_per_chunk(dtype.itemsize, budget)
    blocks = list(plan(shape, per_chunk))
    scale = None
    if is_float and tol.rule.judge_needs_scale():
        scale = scan_scale(src_e, blocks)
    tally = Tally(kind, tol, scale, dtype, shape=shape)
    for block in blocks:
        tally.add(block.start, src_a.read(block), src_e.read(block))
    src_a.finish()
    src_e.finish()
    return tally


def measure_array(
    key: str,
    actual: Any,
    expected: Any,
    tol: ToleranceClass,
    *,
    order: int | None = None,
    budget: int = DEFAULT_BUDGET,
    reference: str = "golden",
) -> ArrayVerdict:
    """The comparator of `compare_arrays`: its figures and verdict, without the words.

    **Arguments:** as `compare_arrays`.

    **Returns:** an `ArrayVerdict`. Raises `TypeError` as `compare_arrays` does.
    """
    src_a = _as_source(key, actual, "actual")
    src_e = _as_source(key, expected, reference)
    shape_e, dtype = src_e.shape, src_e.dtype
    sides = {
        "key": key,
        "tol": tol,
        "reference": reference,
        "order": order,
        "shape_actual": src_a.shape,
        "shape_expected": shape_e,
        "dtype_actual": src_a.dtype,
        "dtype_expected": dtype,
        "n_elements": math.prod(shape_e),
    }
    mismatch = "dtype" if src_a.dtype != dtype else "shape" if src_a.shape != shape_e else None
    if mismatch is not None:
        return ArrayVerdict(**sides, mismatch=mismatch, kind=None, verdict="fail")
    tally = _tally(src_a, src_e, tol, budget)
    is_float = tally.kind == "float"
    bound = tol.rule.bound(tally.final_scale(dtype)) if is_float else 0.0
    if tally.n_differ == 0:
        # The same bytes pass every class.
        return ArrayVerdict(
            **sides,
            mismatch=None,
            kind=tally.kind,
            verdict="pass",
            n_differ=0,
            n_violating=0,
            n_nan_inf_mismatch=0 if is_float else None,
            max_abs=0.0,
            max_rel=0.0,
            max_ulp=0 if is_float else None,
            bound=bound,
            figure=0.0 if is_float and tol.rule.unit not in ("abs", "ulp") else None,
        )
    worst, worst_is_special = tally.worst()
    # One meaning of "at index" on every line: the element this label names.
    where = (
        "first NaN/inf mismatch"
        if worst_is_special
        else "worst"
        if tally.best is not None
        else "first differing element"
    )
    return ArrayVerdict(
        **sides,
        mismatch=None,
        kind=tally.kind,
        verdict="fail" if tally.n_violating else "pass",
        n_differ=tally.n_differ,
        n_violating=tally.n_violating,
        n_nan_inf_mismatch=tally.n_special if is_float else None,
        max_abs=tally.max_abs,
        max_rel=tally.max_rel if tally.kind != "other" else None,
        max_ulp=tally.max_ulp if is_float else None,
        bound=bound,
        figure=tally.figure,
        note=tally.note,
        worst_index=_index(worst.index, shape_e),
        worst_is=where,
        worst_actual=worst.actual,
        worst_expected=worst.expected,
        worst_actual_value=worst.actual_value,
        worst_expected_value=worst.expected_value,
        worst_detail=worst.detail,
    )


def compare_arrays(
    key: str,
    actual: Any,
    expected: Any,
    tol: ToleranceClass,
    *,
    order: int | None = None,
    budget: int = DEFAULT_BUDGET,
    reference: str = "golden",
) -> Finding:
    """Compare one array against its expected one under a tolerance class: the comparator
    (`measure_array`) and its message (`array_reason`) as one `Finding`.

    **Arguments:**

    - `key`: the array's key, for messages.
    - `actual`: the array the changed code produced (numpy, jax, anything `np.asarray`
        takes), or a `parity.judge._chunks.Source` (read block by block).
    - `expected`: the array it is compared with (a golden's pinned array, the baseline's,
        a live tree's), or a `Source` (`GoldenFile.source(key)`).
    - `tol`: the tolerance class.
    - `order`: the key's place in a forward order, stored on the finding.
    - `budget`: bytes the comparison may hold at once (chunks and temporaries); arrays
        larger than that are compared in chunks (`parity.judge._chunks`), with the same finding.
    - `reference`: what `expected` is called in the finding's words: `"golden"` (a pinned
        file, the default; its advice is to repin), `"baseline"` (the golden group
        re-produced at its base commit here: `parity.check._against_baseline`) or
        `"expected"` (a live tree).

    **Returns:** a `Finding`. Dtypes and shapes are strict: a mismatch is a `"fail"` whose
    reason names both, never a cast or broadcast. NaN and inf (with sign) must sit at the
    same positions under every class; integer and bool arrays are compared exactly under
    every class, and so are dtypes without a float rule (complex, long double). Raises
    `TypeError` for object, string and datetime arrays.
    """
    v = measure_array(key, actual, expected, tol, order=order, budget=budget, reference=reference)
    return _finding_of(v, array_reason(v))


def _finding_of(v: ArrayVerdict, reason: str) -> Finding:
    """The `Finding` of a comparator's result `v`, with `reason` its words."""
    share = None
    if v.n_differ is not None:
        share = v.n_differ / v.n_elements if v.n_differ else 0.0  # an empty array too
    clause = proof_clause(v, reason)
    return Finding(
        key=v.key,
        class_name=v.tol.name,
        verdict=v.verdict,
        shape_actual=v.shape_actual,
        shape_expected=v.shape_expected,
        dtype_actual=v.dtype_actual.name,
        dtype_expected=v.dtype_expected.name,
        n_elements=v.n_elements,
        allowed=v.tol.describe_allowed(),
        bitwise_equal=v.mismatch is None and v.n_differ == 0,
        reason=reason + clause,
        proof_clause=clause,
        n_differ=v.n_differ,
        share_differ=share,
        max_abs=v.max_abs,
        max_rel=v.max_rel,
        max_ulp=v.max_ulp,
        worst_index=v.worst_index,
        worst_actual=v.worst_actual_value,
        worst_expected=v.worst_expected_value,
        order=v.order,
        n_violating=v.n_violating,
        n_nan_inf_mismatch=v.n_nan_inf_mismatch,
        bound=v.bound,
        rule=v.tol.rule.kind,
        unit=v.tol.rule.unit,
        figure=v.figure,
        note=v.note,
        reference=v.reference,
        worst_is=v.worst_is,
    )


def _ordered(keys: Iterable[str], order: Order | None) -> list[tuple[str, int | None]]:
    """Keys in forward order with their places; uncovered keys last, by name."""
    keys = sorted(keys)
    unordered: list[tuple[str, int | None]] = [(k, None) for k in keys]
    if order is None:
        return unordered
    if isinstance(order, str):
        raise TypeError(
            f"order must be a sequence of keys or a callable, got the single str {order!r}"
        )
    if callable(order):
        ranks = {k: order(k) for k in keys}
        covered = sorted((k for k in keys if ranks[k] is not None), key=lambda k: (ranks[k], k))
    else:
        place = {k: i for i, k in enumerate(order)}
        covered = sorted((k for k in keys if k in place), key=lambda k: place[k])
    seen = set(covered)
    rest = [k for k in keys if k not in seen]
    placed: list[tuple[str, int | None]] = [(k, i) for i, k in enumerate(covered)]
    return placed + [(k, None) for k in rest]


def compare_trees(
    actual: Any,
    expected: Any,
    class_map: ClassMap | str | Callable[[str], KeyClass],
    *,
    registry: Mapping[str, ToleranceClass] = REGISTRY,
    order: Order | None = None,
    budget: int = DEFAULT_BUDGET,
    reference: str = "golden",
) -> Comparison:
    """Compare every array of `actual` against `expected`, each under its class.

    **Arguments:**

    - `actual`, `expected`: flat `{key: array}` mappings or nested mappings (flattened with
        `flatten`, keys joined by `"."`).
    - `class_map`: which class each key gets: a `ClassMap`, a bare class name for every
        key, or a callable `key -> class name` (as `parity.judge._tolerance.class_resolver` builds)
        or `key -> ToleranceClass` (a class resolved for that key, its parameters bound
        as data: a `calibrated` key's spread).
    - `registry`: the classes by name; defaults to `REGISTRY`.
    - `order`: the forward order: a sequence of keys, or a callable `key -> sort key`
        returning `None` for keys it does not cover. Findings follow it; uncovered keys
        come last, by name. Without an order, the expected side's own order is the forward order
        (its keys as `flatten` walks it: a dict's insertion order, a `Dataflow`'s dataflow
        order), then keys only in `actual` in its order: the one rule every face of parity
        follows (a golden file's pinned order is its producer's, `parity.judge._dataflow`).
    - `budget`: bytes one array comparison may hold at once (`compare_arrays`).
    - `reference`: what `expected` is called in the findings' words (`compare_arrays`).

    Leaves may be `parity.judge._chunks.Source`s (a golden file's `source(key)`) as well as
    arrays: those are read block by block, so that memory stays within `budget` whatever
    the arrays' sizes.

    **Returns:** a `Comparison` with one finding per key of either side: keys only in the
    expected side are `"missing"`, keys only in `actual` are `"unexpected"`, and both count as
    failures. Raises `UnmatchedKeyError` or `UnknownClassError` when a key has no class.
    """
    flat_a = flatten(actual)
    flat_e = flatten(expected)
    class_for: Callable[[str], KeyClass]
    if isinstance(class_map, str):
        class_for = ClassMap(default=class_map).class_for
    elif isinstance(class_map, ClassMap):
        class_for = class_map.class_for
    else:
        class_for = class_map
    if order is None:
        order = [*flat_e, *(k for k in flat_a if k not in flat_e)]
    findings: list[Finding] = []
    for key, place in _ordered(set(flat_a) | set(flat_e), order):
        tol = to_class(class_for(key), registry)
        if key not in flat_a:
            findings.append(_absent(key, tol, flat_e[key], "missing", place, reference))
        elif key not in flat_e:
            findings.append(_absent(key, tol, flat_a[key], "unexpected", place, reference))
        else:
            found = compare_arrays(
                key, flat_a[key], flat_e[key], tol, order=place, budget=budget, reference=reference
            )
            findings.append(found)
    return Comparison(tuple(findings))
