"""Compare arrays against goldens, array by array, under their tolerance classes.

`compare_arrays` checks one array and returns a `Finding`: what differed, by how much,
where it was worst and what was allowed. `compare_trees` checks every key of two (nested)
mappings, reports every failure (not just the first), walks the keys in a declared
forward order and names the first divergence.

Differences are computed in float64 after an exact upcast, so bfloat16 and the other
ml_dtypes floats work like float32. jax arrays are taken through `np.asarray`; this
module imports numpy and ml_dtypes only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np

from parity.rules import Elements, Scale
from parity.tolerance import REGISTRY, ClassMap, ToleranceClass, get_class
from parity.trees import flatten
from parity.ulp import is_float_dtype, is_int_dtype, to_float64, ulp_distance

__all__ = [
    "Comparison",
    "Finding",
    "Order",
    "Verdict",
    "compare_arrays",
    "compare_trees",
    "flatten",
]

Verdict = Literal["pass", "fail", "missing", "unexpected"]
Scalar = bool | int | float | complex
#: A forward order: a sequence of keys, or a callable giving each key a sort key (or `None`
#: for keys it does not cover).
Order = Sequence[str] | Callable[[str], Any]

# Float fields of a finding; `to_dict` writes their non-finite values as strings.
_FLOAT_FIELDS = (
    "share_differ",
    "max_abs",
    "max_rel",
    "worst_actual",
    "worst_golden",
    "bound",
    "figure",
)


def _json_float(x: Any) -> Any:
    # JSON has no NaN or inf; strings keep them readable and unambiguous (null means absent).
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, complex):
        return str(x)
    return x


def _from_json_float(x: Any) -> Any:
    if isinstance(x, str) and x in ("nan", "inf", "-inf"):
        return float(x)
    return x


@dataclass(frozen=True, kw_only=True)
class Finding:
    """The outcome of comparing one array (or one absent key) against its golden.

    **Fields:**

    - `key`, `class_name`: the array key and the tolerance class it was checked under.
    - `verdict`: `"pass"`, `"fail"`, `"missing"` (only in the golden) or `"unexpected"`
        (only in the actual outputs); all but `"pass"` are failures.
    - `shape_actual`, `shape_golden`, `dtype_actual`, `dtype_golden`: `None` on the side
        where the key is absent; dtypes by name (`"bfloat16"`, `"float32"`).
    - `n_elements`: elements of the golden (of the actual array for `"unexpected"`).
    - `n_differ`, `share_differ`: elements whose bits differ, and their share; `None` when
        the arrays cannot be compared element by element (dtype or shape mismatch, absent).
    - `max_abs`, `max_rel`: largest `|a-b|` and `|a-b|/|b|` over positions where both are
        finite (`inf` where `b == 0` and `a != b`); 0.0 when bitwise equal. Integer and bool
        arrays have them too (exact up to 2**53). `None` when not comparable.
    - `max_ulp`: largest ulp distance over positions where both are finite; `None` for
        integer, bool and other non-float dtypes, where ulps mean nothing.
    - `worst_index`, `worst_actual`, `worst_golden`: the worst element and its two values
        (python scalars). Worst is: under *bitwise* the first differing element; under
        *close* and *ulp* the first NaN/inf position mismatch if any, else the largest
        `|a-b| / allowed` (*close*) or ulp distance (*ulp*), else (only -0.0/+0.0 or NaN
        payloads differ) the first differing element; for integers the largest `|a-b|`;
        for other dtypes the first differing element. `None` when bitwise equal.
    - `allowed`: the class's rule in words (`ToleranceClass.describe_allowed`).
    - `bitwise_equal`: same dtype, shape and bytes.
    - `reason`: why the array failed, naming key, class, rule, values, index and shape;
        `""` for a pass.
    - `order`: the key's place in the declared forward order, `None` if it has none.
    - `n_violating`: elements breaking the class (NaN/inf mismatches included).
    - `n_nan_inf_mismatch`: positions where NaN, +inf or -inf sit in one array only.
    - `bound`: the class's bound for this array, in its own unit: for *close* the largest
        allowed `|a-b|` (`atol_eff + rtol*max|golden|`), for *ulp* `max_ulp`, for *bitwise*
        (and integers under any class) 0.0. Reports plot errors against it.
    - `rule`: the kind of the class's rule (`"bitwise"`, `"ulp"`, `"close"`, ...).
    - `unit`: the unit of `bound` and of the figure reports set against it: `"abs"`
        (`max_abs`), `"ulp"` (`max_ulp`) or `"kl"` (`figure`); so that a finding reads
        without the registry.
    - `figure`: the worst figure in the rule's own unit when that is neither `|a-b|` nor
        ulps (a `logit_kl` class: the largest per-position KL); `None` otherwise.
    - `note`: what the rule says even of a passing array (a `budget` class: "below budget:
        repin to ratchet it down"); `""` when it says nothing.
    """

    key: str
    class_name: str
    verdict: Verdict
    shape_actual: tuple[int, ...] | None
    shape_golden: tuple[int, ...] | None
    dtype_actual: str | None
    dtype_golden: str | None
    n_elements: int
    allowed: str
    bitwise_equal: bool
    reason: str
    # The figures: None where nothing was measured (an absent key, a shape or dtype mismatch).
    n_differ: int | None = None
    share_differ: float | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    max_ulp: int | None = None
    worst_index: tuple[int, ...] | None = None
    worst_actual: Scalar | None = None
    worst_golden: Scalar | None = None
    order: int | None = None
    n_violating: int | None = None
    n_nan_inf_mismatch: int | None = None
    bound: float | None = None
    rule: str | None = None
    unit: str | None = None
    figure: float | None = None
    note: str = ""

    @property
    def passed(self) -> bool:
        """Whether the array is within its class."""
        return self.verdict == "pass"

    def to_dict(self) -> dict[str, Any]:
        """The finding as a JSON-safe dict.

        The class name is under `"class"`; shapes and the worst index are lists; `None`
        becomes `null`; non-finite floats become the strings `"nan"`, `"inf"` and `"-inf"`
        (so `json.dumps(..., allow_nan=False)` works); complex values become strings.
        """
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, tuple):
                value = list(cast(tuple[int, ...], value))
            out["class" if field.name == "class_name" else field.name] = _json_float(value)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """Read a finding back from `to_dict` output (after a JSON round trip)."""
        kwargs = {("class_name" if k == "class" else k): v for k, v in data.items()}
        for name in ("shape_actual", "shape_golden", "worst_index"):
            if kwargs.get(name) is not None:
                kwargs[name] = tuple(kwargs[name])
        for name in _FLOAT_FIELDS:
            if name in kwargs:
                kwargs[name] = _from_json_float(kwargs[name])
        return cls(**kwargs)


def _as_array(key: str, x: Any, side: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind in "OUSMm" or (arr.dtype.kind == "V" and arr.dtype.names is not None):
        raise TypeError(
            f"key {key!r}: the {side} array has dtype {arr.dtype}, which parity cannot "
            "compare; pass numeric (float, int, bool) arrays"
        )
    return arr


def _flat_bits(x: np.ndarray) -> np.ndarray:
    """Raw bits of `x`, flattened: one unsigned int per element (or a row of bytes)."""
    flat = np.ascontiguousarray(x.reshape(-1))
    size = x.dtype.itemsize
    if size in (1, 2, 4, 8):
        return flat.view(np.dtype(f"u{size}"))
    return flat.view(np.uint8).reshape(flat.shape[0], size)


def _differ_mask(bits_a: np.ndarray, bits_g: np.ndarray) -> np.ndarray:
    ne = bits_a != bits_g
    return ne.any(axis=1) if ne.ndim == 2 else ne


def _index(i: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(j) for j in np.unravel_index(i, shape))


def _scalar(x: Any) -> Scalar:
    value = x.item() if isinstance(x, np.generic) else x
    if isinstance(value, bool | int | float | complex):
        return value
    return float(value)


def _fmt(x: Any) -> str:
    # The dtype's own str: shortest repr that round-trips in that dtype (0.1, not 0.1000000015).
    return str(x)


def _sig(x: float) -> str:
    return f"{x:.3g}"


def _absent(
    key: str, tol: ToleranceClass, present: np.ndarray, verdict: Verdict, order: int | None
) -> Finding:
    shape, dtype = tuple(int(d) for d in present.shape), present.dtype.name
    if verdict == "missing":
        reason = (
            f"key {key!r} (shape {shape}, {dtype}) is in the golden but not in the actual "
            "outputs: the change dropped or renamed it; restore it, or repin the goldens if "
            "the change is intended"
        )
    else:
        reason = (
            f"key {key!r} (shape {shape}, {dtype}) is in the actual outputs but not in the "
            "golden: repin the goldens to pin it, or stop producing it"
        )
    golden_side = verdict == "missing"
    return Finding(
        key=key,
        class_name=tol.name,
        verdict=verdict,
        shape_actual=None if golden_side else shape,
        shape_golden=shape if golden_side else None,
        dtype_actual=None if golden_side else dtype,
        dtype_golden=dtype if golden_side else None,
        n_elements=int(present.size),
        allowed=tol.describe_allowed(),
        bitwise_equal=False,
        reason=reason,
        order=order,
        rule=tol.rule.kind,
        unit=tol.rule.unit,
    )


def _bound(tol: ToleranceClass, golden: np.ndarray, float_like: bool) -> float:
    if not float_like:
        return 0.0
    if not tol.rule.needs_scale():
        return tol.rule.bound(Scale(golden.dtype, 0.0))
    return tol.rule.bound(Scale.of(golden, to_float64(golden)))


def compare_arrays(
    key: str, actual: Any, golden: Any, tol: ToleranceClass, *, order: int | None = None
) -> Finding:
    """Compare one array against its golden under a tolerance class.

    **Arguments:**

    - `key`: the array's key, for messages.
    - `actual`: the array the changed code produced (numpy, jax, anything `np.asarray`
        takes).
    - `golden`: the pinned array.
    - `tol`: the tolerance class.
    - `order`: the key's place in a forward order, stored on the finding.

    **Returns:** a `Finding`. Dtypes and shapes are strict: a mismatch is a `"fail"` whose
    reason names both, never a cast or broadcast. NaN and inf (with sign) must sit at the
    same positions under every class; integer and bool arrays are compared exactly under
    every class, and so are dtypes without a float rule (complex, long double). Raises
    `TypeError` for object, string and datetime arrays.
    """
    a = _as_array(key, actual, "actual")
    g = _as_array(key, golden, "golden")
    shape_a = tuple(int(d) for d in a.shape)
    shape_g = tuple(int(d) for d in g.shape)
    common = {
        "key": key,
        "class_name": tol.name,
        "shape_actual": shape_a,
        "shape_golden": shape_g,
        "dtype_actual": a.dtype.name,
        "dtype_golden": g.dtype.name,
        "allowed": tol.describe_allowed(),
        "order": order,
        "rule": tol.rule.kind,
        "unit": tol.rule.unit,
    }
    mismatch = None
    if a.dtype != g.dtype:
        mismatch = (
            f"key {key!r}: dtype {a.dtype.name} (actual) does not match {g.dtype.name} "
            f"(golden); parity compares dtypes strictly, without casting. Produce "
            f"{g.dtype.name}, or repin the goldens if the dtype change is intended"
        )
    elif shape_a != shape_g:
        mismatch = (
            f"key {key!r}: shape {shape_a} (actual) does not match {shape_g} (golden), "
            f"{g.dtype.name}; parity compares shapes strictly, without broadcasting"
        )
    if mismatch is not None:
        return Finding(
            **common,
            verdict="fail",
            n_elements=int(g.size),
            bitwise_equal=False,
            reason=mismatch,
        )

    dtype = g.dtype
    is_float = is_float_dtype(dtype)
    is_int = is_int_dtype(dtype)
    n = int(g.size)
    bits_a, bits_g = _flat_bits(a), _flat_bits(g)
    if np.array_equal(bits_a, bits_g):
        # Fast path: the same bytes pass every class and need no arithmetic.
        return Finding(
            **common,
            verdict="pass",
            n_elements=n,
            n_differ=0,
            share_differ=0.0,
            max_abs=0.0,
            max_rel=0.0,
            max_ulp=0 if is_float else None,
            worst_index=None,
            worst_actual=None,
            worst_golden=None,
            bitwise_equal=True,
            reason="",
            n_violating=0,
            n_nan_inf_mismatch=0 if is_float else None,
            bound=_bound(tol, g, is_float),
            figure=0.0 if is_float and tol.rule.unit not in ("abs", "ulp") else None,
        )

    differ = _differ_mask(bits_a, bits_g)
    n_differ = int(np.count_nonzero(differ))
    first_differ = int(np.argmax(differ))
    flat_a, flat_g = a.reshape(-1), g.reshape(-1)
    n_special = None
    max_ulp = None
    max_rel: float | None = None
    notes: list[str] = []
    worst_detail = ""  # the worst element's figure against its bound, for the reason
    worst_is_special = False  # the worst element is a NaN/inf position mismatch
    figure: float | None = None
    note = ""
    if is_float:
        a64, g64 = to_float64(flat_a), to_float64(flat_g)
        nan_a, nan_g = np.isnan(a64), np.isnan(g64)
        finite = np.isfinite(a64) & np.isfinite(g64)
        # Outside the finite pairs only equal infs and NaN against NaN are in place.
        special = ~finite & ~(nan_a & nan_g) & (a64 != g64)
        n_special = int(np.count_nonzero(special))
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            diff = np.where(finite, np.abs(a64 - g64), 0.0)
            abs_g = np.where(finite, np.abs(g64), 0.0)
            rel = np.where(diff == 0, 0.0, diff / abs_g)
        ulp = np.where(finite, ulp_distance(flat_a, flat_g), np.uint64(0))
        max_abs = float(diff.max())
        max_rel = float(rel.max())
        max_ulp = int(ulp.max())
        scale = Scale.for_rule(tol.rule, g, g64)
        bound = tol.rule.bound(scale)
        elements = Elements(differ, finite, special, diff, abs_g, ulp, a64, g64, shape_g)
        judgement = tol.rule.judge(elements, scale)
        violating = judgement.violating
        figure, note = judgement.figure, judgement.note
        if n_special:
            notes.append(
                f"{n_special} NaN/inf position(s) differ (NaN and ±inf must sit at the same "
                "positions under every class)"
            )
        score = judgement.score
        if n_special and tol.rule.tolerant:
            worst = int(np.argmax(special))
            worst_is_special = True
        elif score is not None and score.max() > 0:
            worst = int(np.argmax(score))
            worst_detail = tol.rule.detail(judgement, elements, worst)
        else:
            worst = first_differ
        worst_a, worst_g = _scalar(a64[worst]), _scalar(g64[worst])
    elif is_int:
        ia = flat_a.astype(np.uint64 if dtype.kind == "u" else np.int64)
        ig = flat_g.astype(ia.dtype)
        # Modular uint64 subtraction of the smaller from the larger is exact for any pair.
        ua, ug = ia.view(np.uint64), ig.view(np.uint64)
        dist = np.where(ia >= ig, ua - ug, ug - ua)
        max_abs = float(dist.max())
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(dist == 0, 0.0, dist.astype(np.float64) / np.abs(ig.astype(np.float64)))
        max_rel = float(rel.max())
        bound = 0.0
        violating = differ
        worst = int(np.argmax(dist))
        worst_a, worst_g = _scalar(flat_a[worst]), _scalar(flat_g[worst])
        if dtype.kind == "b":
            worst_a, worst_g = bool(worst_a), bool(worst_g)
        elif not isinstance(worst_a, int):
            worst_a, worst_g = int(ia[worst]), int(ig[worst])
        if tol.rule.tolerant:
            notes.append(f"{dtype.name} arrays are compared exactly under every class")
    else:
        with np.errstate(all="ignore"):
            try:
                max_abs = float(np.max(np.abs(flat_a - flat_g)))
            except TypeError:
                max_abs = None
        bound = 0.0
        violating = differ
        worst = first_differ
        worst_a, worst_g = _scalar(flat_a[worst]), _scalar(flat_g[worst])
        if tol.rule.tolerant:
            notes.append(f"{dtype.name} has no float rule in parity; compared exactly")

    n_violating = int(np.count_nonzero(violating))
    worst_index = _index(worst, shape_g)
    verdict: Verdict = "fail" if n_violating else "pass"
    reason = ""
    if verdict == "fail":
        share = n_violating / n
        what = "break the rule" if tol.rule.tolerant else "differ in their bits"
        values = f"actual {_fmt(flat_a[worst])} vs golden {_fmt(flat_g[worst])}"
        figures = []
        if max_abs is not None:
            figures.append(f"max |a-b| {_sig(max_abs)}")
        if max_rel is not None:
            figures.append(f"max rel {_sig(max_rel)}")
        if max_ulp is not None:
            figures.append(f"max ulp {max_ulp}")
        where = {
            True: "first NaN/inf mismatch",
            False: "worst" if tol.rule.tolerant else "first differing element",
        }[worst_is_special]
        reason = (
            f"key {key!r} breaks class {tol.name!r} ({tol.describe_allowed()}): "
            f"{n_violating} of {n} elements ({100 * share:.3g}%) {what}; {where} at index "
            f"{worst_index}: {values}"
        )
        reason += f"{worst_detail}; {', '.join(figures)}; shape {shape_g}, {dtype.name}"
        if notes:
            reason += "; " + "; ".join(notes)
    return Finding(
        **common,
        verdict=verdict,
        n_elements=n,
        n_differ=n_differ,
        share_differ=n_differ / n,
        max_abs=max_abs,
        max_rel=max_rel,
        max_ulp=max_ulp,
        worst_index=worst_index,
        worst_actual=worst_a,
        worst_golden=worst_g,
        bitwise_equal=False,
        reason=reason,
        n_violating=n_violating,
        n_nan_inf_mismatch=n_special,
        bound=bound,
        figure=figure,
        note=note,
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


@dataclass(frozen=True)
class Comparison:
    """Every finding of one comparison, in forward order.

    **Fields:**

    - `findings`: one per key, sorted by the declared order (uncovered keys last, by name).
    """

    findings: tuple[Finding, ...]

    @property
    def passed(self) -> bool:
        """Whether every key is within its class (and none is missing or unexpected)."""
        return all(f.passed for f in self.findings)

    @property
    def failures(self) -> tuple[Finding, ...]:
        """The findings that are not `"pass"`, in order."""
        return tuple(f for f in self.findings if not f.passed)

    @property
    def first_not_bitwise(self) -> Finding | None:
        """The first key in order that is not bitwise equal (absent keys included)."""
        return next((f for f in self.findings if not f.bitwise_equal), None)

    @property
    def first_failure(self) -> Finding | None:
        """The first key in order that breaks its class, or is missing or unexpected."""
        return next((f for f in self.findings if not f.passed), None)

    def finding(self, key: str) -> Finding:
        """The finding for `key`; raises `KeyError` if the comparison has none."""
        for f in self.findings:
            if f.key == key:
                return f
        raise KeyError(f"no finding for key {key!r} in this comparison")

    def by_class(self) -> dict[str, list[Finding]]:
        """Findings grouped by class name; classes in order of first appearance."""
        out: dict[str, list[Finding]] = {}
        for f in self.findings:
            out.setdefault(f.class_name, []).append(f)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The comparison as a JSON-safe dict (findings as in `Finding.to_dict`)."""
        first_nb, first_fail = self.first_not_bitwise, self.first_failure
        return {
            "verdict": "pass" if self.passed else "fail",
            "n_findings": len(self.findings),
            "n_failures": len(self.failures),
            "first_not_bitwise": None if first_nb is None else first_nb.to_dict(),
            "first_failure": None if first_fail is None else first_fail.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
        }


def compare_trees(
    actual: Any,
    golden: Any,
    class_map: ClassMap | str | Callable[[str], str],
    *,
    registry: Mapping[str, ToleranceClass] = REGISTRY,
    order: Order | None = None,
) -> Comparison:
    """Compare every array of `actual` against `golden`, each under its class.

    **Arguments:**

    - `actual`, `golden`: flat `{key: array}` mappings or nested mappings (flattened with
        `flatten`, keys joined by `"."`).
    - `class_map`: which class each key gets: a `ClassMap`, a bare class name for every
        key, or a callable `key -> class name` (as `parity.check.class_resolver` builds).
    - `registry`: the classes by name; defaults to `REGISTRY`.
    - `order`: the forward order: a sequence of keys, or a callable `key -> sort key`
        returning `None` for keys it does not cover. Findings follow it; uncovered keys
        come last, by name. Without an order, findings are sorted by key.

    **Returns:** a `Comparison` with one finding per key of either side: keys only in the
    golden are `"missing"`, keys only in `actual` are `"unexpected"`, and both count as
    failures. Raises `UnmatchedKeyError` or `UnknownClassError` when a key has no class.
    """
    flat_a = flatten(actual)
    flat_g = flatten(golden)
    if isinstance(class_map, str):
        class_for = ClassMap(default=class_map).class_for
    elif isinstance(class_map, ClassMap):
        class_for = class_map.class_for
    else:
        class_for = class_map
    findings: list[Finding] = []
    for key, place in _ordered(set(flat_a) | set(flat_g), order):
        tol = get_class(class_for(key), registry)
        if key not in flat_a:
            findings.append(_absent(key, tol, flat_g[key], "missing", place))
        elif key not in flat_g:
            findings.append(_absent(key, tol, flat_a[key], "unexpected", place))
        else:
            findings.append(compare_arrays(key, flat_a[key], flat_g[key], tol, order=place))
    return Comparison(tuple(findings))
