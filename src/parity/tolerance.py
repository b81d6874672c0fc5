"""Tolerance classes: what a refactor may change in an array, as data.

A class is a name, a rule and its parameters, one line saying what it tolerates and the
measurement that set its threshold. Three rules exist:

- *bitwise*: same dtype, shape and bytes. NaN payloads count and -0.0 differs from +0.0.
- *ulp*: elementwise distance in units in the last place at most `max_ulp`.
- *close*: `|a - b| <= atol + rtol*|b|` with `b` the golden, `atol` either absolute or in
  ulps of the golden's largest finite magnitude.

Under every rule dtypes and shapes are strict (float32 against a float64 golden is a
mismatch, never a cast), NaN and inf (with its sign) must sit at the same positions, and
integer and bool arrays are compared exactly. The checking itself lives in
`parity.compare`; this module holds the data, the class map and `ulp_distance`.

This module imports numpy and ml_dtypes only: jax arrays reach it through `np.asarray`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import json
import math
import types
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any, Literal, cast, get_args

import ml_dtypes
import numpy as np

__all__ = [
    "REGISTRY",
    "ULP_NAN",
    "ClassMap",
    "Rule",
    "ToleranceClass",
    "UnknownClassError",
    "UnmatchedKeyError",
    "effective_atol",
    "get_class",
    "is_float_dtype",
    "is_int_dtype",
    "to_float64",
    "ulp_distance",
]

Rule = Literal["bitwise", "ulp", "close"]
_RULES: tuple[str, ...] = get_args(Rule)

#: What `ulp_distance` returns where either operand is NaN: the largest uint64. NaN has no
#: place on the number line, so it is at no finite distance from anything, itself included;
#: callers check NaN positions separately (as `parity.compare` does).
ULP_NAN = np.uint64(np.iinfo(np.uint64).max)


class UnknownClassError(KeyError):
    """A tolerance class name that the registry does not hold."""

    def __str__(self) -> str:
        # KeyError's str() is the repr of its argument, which quotes a whole sentence.
        return str(self.args[0]) if self.args else ""


class UnmatchedKeyError(KeyError):
    """An array key that no rule of a `ClassMap` matches, with no default to fall back on."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _check_nonneg(field: str, value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(
            f"tolerance class {name!r}: {field} must be a number, got {value!r} "
            f"({type(value).__name__})"
        )
    if not math.isfinite(value) or value < 0:
        raise ValueError(
            f"tolerance class {name!r}: {field} must be finite and >= 0, got {value!r}"
        )


@dataclass(frozen=True)
class ToleranceClass:
    """A named rule for how far an array may move from its golden.

    **Arguments:**

    - `name`: the class name, as the class map and reports spell it.
    - `rule`: `"bitwise"`, `"ulp"` or `"close"`.
    - `max_ulp`: for `"ulp"`, the largest elementwise ulp distance allowed.
    - `atol`: for `"close"`, the absolute tolerance.
    - `atol_ulps`: for `"close"`, the absolute tolerance in ulps of the golden's largest
        finite magnitude, in the golden's dtype; when set, it replaces `atol` (which must
        then be 0).
    - `rtol`: for `"close"`, the tolerance relative to `|golden|`.
    - `meaning`: one line saying what the class tolerates.
    - `measured`: the measurement that set the threshold.

    Parameters that the rule does not use must stay at their defaults, so that a class
    never looks looser than it is.
    """

    name: str
    rule: Rule
    _: KW_ONLY
    max_ulp: int = 0
    atol: float = 0.0
    atol_ulps: float | None = None
    rtol: float = 0.0
    meaning: str
    measured: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"tolerance class name must be a non-empty str, got {self.name!r}")
        if self.rule not in _RULES:
            raise ValueError(
                f"tolerance class {self.name!r}: rule must be one of {list(_RULES)}, "
                f"got {self.rule!r}"
            )
        if isinstance(self.max_ulp, bool) or not isinstance(self.max_ulp, int | np.integer):
            raise ValueError(
                f"tolerance class {self.name!r}: max_ulp must be an int, got {self.max_ulp!r}"
            )
        if self.max_ulp < 0:
            raise ValueError(
                f"tolerance class {self.name!r}: max_ulp must be >= 0, got {self.max_ulp!r}"
            )
        _check_nonneg("atol", self.atol, self.name)
        _check_nonneg("rtol", self.rtol, self.name)
        if self.atol_ulps is not None:
            _check_nonneg("atol_ulps", self.atol_ulps, self.name)
            if self.atol != 0:
                raise ValueError(
                    f"tolerance class {self.name!r}: set atol or atol_ulps, not both "
                    f"(got atol={self.atol!r}, atol_ulps={self.atol_ulps!r})"
                )
        for field in ("meaning", "measured"):
            if not isinstance(getattr(self, field), str):
                raise ValueError(
                    f"tolerance class {self.name!r}: {field} must be a str, "
                    f"got {getattr(self, field)!r}"
                )
        unused = {
            "bitwise": ("max_ulp", "atol", "atol_ulps", "rtol"),
            "ulp": ("atol", "atol_ulps", "rtol"),
            "close": ("max_ulp",),
        }[self.rule]
        for field in unused:
            value = getattr(self, field)
            if value not in (None, 0):
                raise ValueError(
                    f"tolerance class {self.name!r}: rule {self.rule!r} does not use "
                    f"{field}, got {field}={value!r}; leave it at its default"
                )
        # Normalise numbers so that equality and JSON round trips do not depend on int/float.
        object.__setattr__(self, "max_ulp", int(self.max_ulp))
        object.__setattr__(self, "atol", float(self.atol))
        object.__setattr__(self, "rtol", float(self.rtol))
        if self.atol_ulps is not None:
            object.__setattr__(self, "atol_ulps", float(self.atol_ulps))

    def describe_allowed(self) -> str:
        """One line saying what the class allows.

        **Returns:** for example `"bitwise"`, `"ulp <= 4"`, `"|a-b| <= 1.7e-05 + 0*|b|"` or
        `"|a-b| <= 2 ulp(max|b|) + 0*|b|"`, with `b` the golden.
        """
        if self.rule == "bitwise":
            return "bitwise"
        if self.rule == "ulp":
            return f"ulp <= {self.max_ulp}"
        atol = f"{self.atol:g}" if self.atol_ulps is None else f"{self.atol_ulps:g} ulp(max|b|)"
        return f"|a-b| <= {atol} + {self.rtol:g}*|b|"

    def to_dict(self) -> dict[str, Any]:
        """The class as a JSON-safe dict; `ToleranceClass.from_dict` reads it back."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToleranceClass:
        """Build a class from `to_dict` output.

        **Arguments:**

        - `data`: a mapping with at least `name`, `rule` and `meaning`.

        **Returns:** the `ToleranceClass`; raises `ValueError` on unknown or missing fields.
        """
        fields = {f.name for f in dataclasses.fields(cls)} - {"_"}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(
                f"tolerance class dict has unknown fields {unknown}; expected a subset of "
                f"{sorted(fields)}"
            )
        missing = sorted({"name", "rule", "meaning"} - set(data))
        if missing:
            raise ValueError(f"tolerance class dict lacks required fields {missing}: {data!r}")
        return cls(**dict(data))


def _frozen_registry(*classes: ToleranceClass) -> Mapping[str, ToleranceClass]:
    return types.MappingProxyType({c.name: c for c in classes})


#: The named classes. Read-only: to add classes, build your own dict
#: (`{**REGISTRY, "mine": ToleranceClass(...)}`) and pass it where a registry is taken.
REGISTRY: Mapping[str, ToleranceClass] = _frozen_registry(
    ToleranceClass(
        "bitwise",
        "bitwise",
        meaning="nothing: same dtype, shape and bytes (NaN payloads and the sign of zero count)",
        measured="by definition",
    ),
    ToleranceClass(
        "fp32_reassoc",
        "close",
        atol=2e-5,
        meaning="fp32 reassociation of sums: scan against unrolled loop, fused against split",
        measured=(
            "production: taps against the unrolled forward within 1.7e-5 abs. Subject (AVX2, "
            "fp32): scan against unrolled, 600 hypothesis examples, worst tap 2.4e-6 abs, "
            "worst logit 1.1e-5 abs; live differential on the golden models 3.8e-6 abs"
        ),
    ),
    ToleranceClass(
        "trajectory",
        "close",
        atol=5e-6,
        meaning="3 training steps whose fp32 reassociation propagates through the updates",
        measured=(
            "production: 3-step trajectories within 3.9e-6 abs. Subject (tiny GLU, AVX2): "
            "remat 'nothing'/'dots' against none, worst 9.5e-7 on metrics and component/CI "
            "leaves, 3.3e-6 on the PGD sources"
        ),
    ),
    ToleranceClass(
        "device_count",
        "close",
        atol=1e-7,
        rtol=1e-4,
        meaning="1 against 4 data-parallel devices: reductions split and summed in another order",
        measured=(
            "production: 1 against 4 devices within 1e-4*|a| + 1e-7 (here relative to the "
            "golden |b|). Subject (tiny GLU, 3 steps): train metrics within 3e-8, toy "
            "outputs 2.4e-7 abs / 2.7e-6 rel"
        ),
    ),
    ToleranceClass(
        "eval_metric",
        "close",
        atol=4e-6,
        rtol=1e-4,
        meaning=(
            "eval metrics that are differences of two cross-entropies (~4.2, ulp 4.8e-7): "
            "a few ulps of each CE, plus device_count's relative part"
        ),
        measured=(
            "1 against 4 devices, tiny GLU: worst |a-b| 1.17e-6 (ce_diff/random, value -8.1e-3), "
            "the cancellation of two CEs near 4.2; 8 ulp of 4.2 is 3.8e-6"
        ),
    ),
    ToleranceClass(
        "compile_budget",
        "close",
        rtol=0.02,
        meaning=(
            "compile statistics (HLO bytes, instruction counts) within 2% of the pinned budget; "
            "a shrink beyond 2% also fails, so that the budget is repinned and ratchets down"
        ),
        measured="HLO bytes and instruction counts are deterministic for a fixed jax/XLA build",
    ),
)


def get_class(name: str, registry: Mapping[str, ToleranceClass] = REGISTRY) -> ToleranceClass:
    """Look a class up by name.

    **Arguments:**

    - `name`: the class name.
    - `registry`: where to look; defaults to `REGISTRY`.

    **Returns:** the `ToleranceClass`; raises `UnknownClassError` (a `KeyError`) listing the
    known names when `name` is not there, and `ValueError` when the class found under
    `name` is named otherwise.
    """
    try:
        tol = registry[name]
    except KeyError:
        raise UnknownClassError(
            f"unknown tolerance class {name!r}; known classes: {sorted(registry)}. "
            "Fix the name in the class map, or pass a registry that defines it."
        ) from None
    if tol.name != name:
        # Findings and reports name the class by `tol.name`; a registry key that differs
        # would make them disagree with the class map.
        raise ValueError(
            f"registry key {name!r} holds the tolerance class named {tol.name!r}; register "
            "each class under its own name, e.g. {c.name: c for c in classes}"
        )
    return tol


@dataclass(frozen=True)
class ClassMap:
    """Which tolerance class each array key gets, by glob pattern; first match wins.

    **Arguments:**

    - `rules`: `(pattern, class_name)` pairs, tried in order with `fnmatch.fnmatchcase`
        (`*` also matches `.`, so `"layers.*.h1"` matches `"layers.3.h1"`).
    - `default`: the class for keys that no rule matches, or `None` to make such keys an
        error.
    """

    rules: tuple[tuple[str, str], ...] = ()
    default: str | None = None

    def __post_init__(self) -> None:
        # Accept lists (as JSON gives them) but store tuples, so the map stays hashable.
        try:
            rules = tuple((p, c) for p, c in self.rules)
        except (TypeError, ValueError):
            raise ValueError(
                f"ClassMap rules must be (pattern, class_name) pairs, got {self.rules!r}"
            ) from None
        for pattern, name in rules:
            if not isinstance(pattern, str) or not isinstance(name, str) or not name:
                raise ValueError(
                    f"ClassMap rule must be a (str pattern, non-empty str class name) pair, "
                    f"got {(pattern, name)!r}"
                )
        if self.default is not None and (not isinstance(self.default, str) or not self.default):
            raise ValueError(f"ClassMap default must be a class name or None, got {self.default!r}")
        object.__setattr__(self, "rules", rules)

    def class_for(self, key: str) -> str:
        """The class name for `key`: the first matching rule's, else the default.

        **Arguments:**

        - `key`: an array key, for example `"layers.3.h1"`.

        **Returns:** the class name; raises `UnmatchedKeyError` (a `KeyError`) when no rule
        matches and there is no default.
        """
        for pattern, name in self.rules:
            if fnmatch.fnmatchcase(key, pattern):
                return name
        if self.default is not None:
            return self.default
        patterns = [p for p, _ in self.rules]
        raise UnmatchedKeyError(
            f"no class map rule matches key {key!r} (patterns, in order: {patterns}) and the "
            "map has no default; add a rule for it or set a default class"
        )

    def resolve(
        self, key: str, registry: Mapping[str, ToleranceClass] = REGISTRY
    ) -> ToleranceClass:
        """The `ToleranceClass` for `key`, looked up in `registry`.

        **Arguments:**

        - `key`: an array key.
        - `registry`: the classes by name; defaults to `REGISTRY`.

        **Returns:** the class; raises `UnmatchedKeyError` or `UnknownClassError`.
        """
        return get_class(self.class_for(key), registry)

    def class_names(self) -> tuple[str, ...]:
        """Every class name the map can give, in rule order, default last, no repeats."""
        names = [c for _, c in self.rules] + ([self.default] if self.default else [])
        return tuple(dict.fromkeys(names))

    def check(self, registry: Mapping[str, ToleranceClass] = REGISTRY) -> None:
        """Raise `UnknownClassError` if the map names a class that `registry` lacks."""
        unknown = [n for n in self.class_names() if n not in registry]
        if unknown:
            raise UnknownClassError(
                f"class map names unknown tolerance classes {unknown}; known classes: "
                f"{sorted(registry)}"
            )

    def to_json(self) -> str:
        """The map as JSON text, byte-stable for a given map (it is pinned in golden files)."""
        return json.dumps(
            {"rules": [list(r) for r in self.rules], "default": self.default},
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> ClassMap:
        """Read a map written by `to_json`.

        **Arguments:**

        - `text`: JSON with `rules` (a list of `[pattern, class_name]`) and `default`.

        **Returns:** the `ClassMap`; raises `ValueError` on any other shape.
        """
        data = json.loads(text)
        if not isinstance(data, dict) or set(data) - {"rules", "default"}:
            raise ValueError(
                f"class map JSON must be an object with 'rules' and 'default', got {text!r}"
            )
        data = cast(dict[str, Any], data)
        rules = data.get("rules", [])
        if not isinstance(rules, list) or not all(
            isinstance(r, list) and len(cast(list[Any], r)) == 2 for r in cast(list[Any], rules)
        ):
            raise ValueError(
                f"class map 'rules' must be a list of [pattern, class] pairs: {text!r}"
            )
        pairs = cast(Iterable[list[str]], rules)
        return cls(tuple((p, c) for p, c in pairs), data.get("default"))


# --- dtypes and the ulp line ------------------------------------------------------------

_ML_INT_NAMES = ("int1", "int2", "int4", "uint1", "uint2", "uint4")
_ML_INT_DTYPES = frozenset(
    np.dtype(getattr(ml_dtypes, n)) for n in _ML_INT_NAMES if hasattr(ml_dtypes, n)
)


@functools.cache
def _is_ml_float(dtype: np.dtype[Any]) -> bool:
    try:
        ml_dtypes.finfo(dtype)
    except (ValueError, TypeError):
        return False
    return True


def is_float_dtype(dtype: np.dtype[Any]) -> bool:
    """Whether `dtype` is a real floating dtype parity can put on the ulp line.

    numpy's float16/32/64 and the ml_dtypes floats (bfloat16, float8 kinds, ...); not
    complex, and not long double (it has no exact float64 upcast).
    """
    if dtype.kind == "f":
        return dtype.itemsize <= 8
    return dtype.kind == "V" and _is_ml_float(dtype)


def is_int_dtype(dtype: np.dtype[Any]) -> bool:
    """Whether `dtype` is an integer or bool dtype (numpy's or ml_dtypes' int2/int4/...)."""
    return dtype.kind in "biu" or dtype in _ML_INT_DTYPES


def to_float64(x: np.ndarray) -> np.ndarray:
    """`x` as float64: exact for every float dtype `is_float_dtype` accepts.

    Some ml_dtypes casts warn about NaN patterns ("invalid value"); the NaN is kept, so the
    warning says nothing here.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(np.float64)


def _uint_view(x: np.ndarray) -> np.ndarray:
    # Raw bits as unsigned ints of the same width, so ordering and equality are on bits.
    # ascontiguousarray promotes 0-d arrays to 1-d; the reshape puts the shape back.
    return np.ascontiguousarray(x).reshape(x.shape).view(np.dtype(f"u{x.dtype.itemsize}"))


@functools.cache
def _rank_table(dtype: np.dtype[Any]) -> np.ndarray:
    """For a float dtype of at most 16 bits: bit pattern -> rank on the number line.

    Ranking every pattern by value (rather than flipping sign-magnitude bits) is right for
    every ml_dtypes layout, including those without negative zero (`fnuz`), without a sign
    (`e8m0fnu`) and narrower than their storage byte (`float4`, `float6`). Equal values
    (+0 and -0) share a rank; NaN patterns get -1.
    """
    n = 1 << (8 * dtype.itemsize)
    values = to_float64(np.arange(n, dtype=np.dtype(f"u{dtype.itemsize}")).view(dtype))
    nan = np.isnan(values)
    line = np.unique(values[~nan])
    ranks = np.searchsorted(line, np.where(nan, 0.0, values)).astype(np.int64)
    ranks[nan] = -1
    ranks.setflags(write=False)
    return ranks


def _ordinal(x: np.ndarray) -> np.ndarray:
    """Each element's place on a monotone int64 line: equal values (±0) at the same place.

    NaN elements get an arbitrary place; callers mask them.
    """
    dtype = x.dtype
    if dtype.itemsize <= 2:
        return _rank_table(dtype)[_uint_view(x)]
    # IEEE float32/float64: sign-magnitude bits, folded so negatives count down from 0.
    bits = _uint_view(x).view(np.dtype(f"i{dtype.itemsize}")).astype(np.int64)
    magnitude = bits & np.int64((1 << (8 * dtype.itemsize - 1)) - 1)
    return np.where(bits < 0, -magnitude, magnitude)


def ulp_distance(a: Any, b: Any) -> np.ndarray:
    """Elementwise distance in ulps between two float arrays of the same dtype and shape.

    Raw bits are mapped to a monotone integer line (the rank of each value among the
    dtype's values), and the distance is the difference of ranks: symmetric, 0 exactly
    when the values are equal (+0 and -0 are at distance 0), 1 between neighbours, and inf
    is one step past the largest finite value.

    **Arguments:**

    - `a`, `b`: arrays (anything `np.asarray` takes) of one float dtype: float16, bfloat16,
        float32, float64 or an ml_dtypes float8 (or narrower) kind.

    **Returns:** a `uint64` array of the common shape, `ULP_NAN` (the largest uint64) where
    either operand is NaN. Raises `TypeError` for other dtypes and `ValueError` for
    differing dtypes or shapes.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    if a.dtype != b.dtype:
        raise ValueError(
            f"ulp_distance needs one dtype, got {a.dtype.name} and {b.dtype.name}; "
            "ulps of different dtypes are not comparable"
        )
    if a.shape != b.shape:
        raise ValueError(f"ulp_distance needs one shape, got {a.shape} and {b.shape}")
    if not is_float_dtype(a.dtype):
        raise TypeError(
            f"ulp_distance needs a real float dtype of at most 64 bits, got {a.dtype.name}"
        )
    oa = _ordinal(a).view(np.uint64)
    ob = _ordinal(b).view(np.uint64)
    # Both ordinals lie within int64 but their difference can exceed it (for float64,
    # -max to +max); modular uint64 subtraction of the smaller from the larger is exact.
    larger = oa.view(np.int64) >= ob.view(np.int64)
    with np.errstate(over="ignore"):  # 0-d operands become scalars, which warn on wrapping
        dist = np.asarray(np.where(larger, oa - ob, ob - oa))
    nan = np.isnan(to_float64(a)) | np.isnan(to_float64(b))
    dist[nan] = ULP_NAN
    return dist


def _spacing_at(value: float, dtype: np.dtype[Any]) -> float:
    """The gap from `value` (>= 0, representable in `dtype`) to its upper neighbour in
    `dtype`, or to its lower one at the top of the range; as a float64."""
    itemsize = dtype.itemsize
    bits = np.array([value], dtype=np.float64).astype(dtype).view(np.dtype(f"u{itemsize}"))
    here = float(to_float64(bits.view(dtype))[0])
    up = float(to_float64((bits + 1).view(dtype))[0])
    if math.isfinite(up) and up > here:
        return up - here
    down = float(to_float64((bits - 1).view(dtype))[0])
    return here - down


def effective_atol(tol: ToleranceClass, golden: Any) -> float:
    """The absolute tolerance `tol` gives against `golden`.

    **Arguments:**

    - `tol`: the class.
    - `golden`: the golden array.

    **Returns:** `tol.atol`, or, when `tol.atol_ulps` is set and the golden is a float
    array, `atol_ulps * spacing(max finite |golden|)` in the golden's dtype (the spacing
    at 0 when the golden has no finite element).
    """
    if tol.atol_ulps is None:
        return tol.atol
    g = np.asarray(golden)
    if not is_float_dtype(g.dtype):
        return 0.0
    g64 = np.abs(to_float64(g))
    finite = g64[np.isfinite(g64)]
    largest = float(finite.max()) if finite.size else 0.0
    return tol.atol_ulps * _spacing_at(largest, g.dtype)
