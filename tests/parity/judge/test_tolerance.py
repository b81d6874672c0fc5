"""Tolerance classes, the class map and the ulp line: properties over raw bits, and units.

Arrays are drawn as raw unsigned bits and viewed as the float dtype, so every pattern
(NaN payloads, -0.0, subnormals, inf) is reachable for bfloat16 and float8 alike.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from parity.judge._classes import REGISTRY, ToleranceClass
from parity.judge._compare import compare_arrays
from parity.judge._fixed_rules import Close, Ulp
from parity.judge._tolerance import (
    ClassMap,
    UnknownClassError,
    UnmatchedKeyError,
    effective_atol,
    get_class,
)
from parity.judge._ulp import ULP_NAN, ulp_distance

FLOAT_DTYPES = [
    np.dtype(np.float16),
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(np.float32),
    np.dtype(np.float64),
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e5m2),
    np.dtype(ml_dtypes.float8_e4m3fnuz),
]
DTYPE_IDS = [d.name for d in FLOAT_DTYPES]
PROPERTY = settings(max_examples=30, deadline=None)


def f64(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return x.astype(np.float64)


@st.composite
def float_pairs(draw: Any, dtype: np.dtype[Any], finite: bool = False) -> tuple[np.ndarray, ...]:
    """Two arrays of `dtype` and one shape: equal, a few bit steps apart, or unrelated."""
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=6))
    ubits = np.dtype(f"u{dtype.itemsize}")
    # np.asarray: for shape () hypothesis may hand back a numpy scalar.
    a_bits = np.asarray(draw(hnp.arrays(ubits, shape)))
    mode = draw(st.sampled_from(["same", "near", "independent"]))
    if mode == "same":
        b_bits = a_bits.copy()
    elif mode == "near":
        steps = draw(hnp.arrays(np.int64, shape, elements=st.integers(-3, 3)))
        b_bits = np.asarray((a_bits.astype(np.int64) + steps).astype(ubits))
    else:
        b_bits = np.asarray(draw(hnp.arrays(ubits, shape)))
    a, b = np.array(a_bits.view(dtype)), np.array(b_bits.view(dtype))
    if finite:
        a[~np.isfinite(f64(a))] = 0
        b[~np.isfinite(f64(b))] = 0
    return a, b


def sign_magnitude_ulps(a: np.ndarray, b: np.ndarray) -> list[int]:
    """Independent ulp distance: the textbook sign-magnitude ordinal, in python ints."""
    width = 8 * a.dtype.itemsize
    mag = (1 << (width - 1)) - 1

    def ordinal(bits: int) -> int:
        return -(bits & mag) if bits >> (width - 1) else bits

    ua = a.reshape(-1).view(f"u{a.dtype.itemsize}").tolist()
    ub = b.reshape(-1).view(f"u{b.dtype.itemsize}").tolist()
    return [abs(ordinal(x) - ordinal(y)) for x, y in zip(ua, ub, strict=True)]


def passes(tol: ToleranceClass, a: np.ndarray, b: np.ndarray) -> bool:
    return compare_arrays("x", a, b, tol).passed


def ulp_class(n: int) -> ToleranceClass:
    return ToleranceClass(f"ulp{n}", Ulp(max_ulp=n), meaning="test")


# --- properties ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@PROPERTY
@given(data=st.data())
def test_bitwise_is_reflexive_on_any_bits_including_nan_payloads(
    dtype: np.dtype[Any], data: Any
) -> None:
    a, _ = data.draw(float_pairs(dtype))
    finding = compare_arrays("x", a, a.copy(), REGISTRY["bitwise"])
    assert finding.passed and finding.bitwise_equal and finding.n_differ == 0


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@PROPERTY
@given(data=st.data())
def test_ulp_distance_is_symmetric_and_zero_exactly_on_equal_values(
    dtype: np.dtype[Any], data: Any
) -> None:
    a, b = data.draw(float_pairs(dtype))
    d = ulp_distance(a, b)
    assert d.dtype == np.uint64 and d.shape == a.shape
    np.testing.assert_array_equal(d, ulp_distance(b, a))
    nan = np.isnan(f64(a)) | np.isnan(f64(b))
    assert np.all(d[nan] == ULP_NAN)
    np.testing.assert_array_equal((d == 0)[~nan], (f64(a) == f64(b))[~nan])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@PROPERTY
@given(data=st.data())
def test_ulp_distance_matches_sign_magnitude_ordinals(dtype: np.dtype[Any], data: Any) -> None:
    a, b = data.draw(float_pairs(dtype))
    nan = (np.isnan(f64(a)) | np.isnan(f64(b))).reshape(-1)
    expected = sign_magnitude_ulps(a, b)
    got = ulp_distance(a, b).reshape(-1).tolist()
    for i in np.flatnonzero(~nan):
        assert got[i] == expected[i], (a.reshape(-1)[i], b.reshape(-1)[i])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@PROPERTY
@given(data=st.data())
def test_ulp_distance_adds_up_along_the_number_line(dtype: np.dtype[Any], data: Any) -> None:
    a, b = data.draw(float_pairs(dtype))
    c, _ = data.draw(float_pairs(dtype))
    if c.shape != a.shape:
        c = np.resize(c, a.shape) if c.size else np.zeros(a.shape, dtype)
    stack = np.stack([a, b, c]).reshape(3, -1)
    keep = ~np.isnan(f64(stack)).any(axis=0)
    stack = stack[:, keep]
    order = np.argsort(f64(stack), axis=0, kind="stable")
    lo, mid, hi = np.take_along_axis(stack, order, axis=0)
    np.testing.assert_array_equal(
        ulp_distance(lo, hi), ulp_distance(lo, mid) + ulp_distance(mid, hi)
    )


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@PROPERTY
@given(data=st.data(), n=st.integers(0, 3), extra=st.integers(0, 3))
def test_classes_are_monotone(dtype: np.dtype[Any], data: Any, n: int, extra: int) -> None:
    a, b = data.draw(float_pairs(dtype))
    if passes(REGISTRY["bitwise"], a, b):
        assert passes(ulp_class(0), a, b)
    if passes(ulp_class(n), a, b):
        assert passes(ulp_class(n + extra), a, b)
        # n ulps cross at most one binade boundary here (every dtype has >= 4 values per
        # binade), where the spacing at most doubles: 2n ulps of the largest |b| contain it.
        contains = ToleranceClass("c", Close(atol_ulps=2 * n), meaning="test")
        assert passes(contains, a, b)
    loose = ToleranceClass("loose", Close(atol=0.5, rtol=0.1), meaning="test")
    looser = ToleranceClass(
        "looser", Close(atol=0.5 * (1 + extra), rtol=0.1 * (1 + n)), meaning="test"
    )
    if passes(loose, a, b):
        assert passes(looser, a, b)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@PROPERTY
@given(
    data=st.data(),
    atol=st.sampled_from([0.0, 1e-6, 1e-3, 0.1, 1.0]),
    rtol=st.sampled_from([0.0, 1e-4, 1e-2, 0.5]),
)
def test_close_agrees_with_numpy_isclose_on_finite_inputs(
    dtype: np.dtype[Any], data: Any, atol: float, rtol: float
) -> None:
    actual, golden = data.draw(float_pairs(dtype, finite=True))
    tol = ToleranceClass("c", Close(atol=atol, rtol=rtol), meaning="test")
    finding = compare_arrays("x", actual, golden, tol)
    # numpy's isclose is |a-b| <= atol + rtol*|b| with b its second argument: the golden.
    close = np.isclose(f64(actual), f64(golden), rtol=rtol, atol=atol, equal_nan=False)
    assert finding.passed == bool(close.all())
    if not finding.bitwise_equal:
        assert finding.n_violating == int((~close).sum())


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@given(data=st.data(), n=st.integers(0, 8))
@PROPERTY
def test_atol_ulps_is_spacing_of_the_largest_golden_magnitude(
    dtype: type[np.floating[Any]], data: Any, n: int
) -> None:
    _, golden = data.draw(float_pairs(np.dtype(dtype), finite=True))
    tol = ToleranceClass("u", Close(atol_ulps=n), meaning="test")
    largest = np.abs(golden).max() if golden.size else dtype(0)
    with np.errstate(over="ignore"):
        spacing = float(np.spacing(dtype(largest)))
    if not math.isfinite(spacing):  # at the top of the range: the gap below instead
        spacing = float(largest) - float(np.nextafter(dtype(largest), dtype(0)))
    assert effective_atol(tol, golden) == n * spacing


# --- ulp_distance units --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_signed_zeros_are_at_distance_zero(dtype: np.dtype[Any]) -> None:
    zero = np.zeros(3, dtype)
    assert np.all(ulp_distance(zero, -zero) == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_neighbours_are_one_ulp_apart(dtype: type[np.floating[Any]]) -> None:
    x = np.array([0.0, 1.0, -2.5, 1e-30, np.finfo(dtype).max / 2], dtype)
    up = np.nextafter(x, dtype(np.inf))
    np.testing.assert_array_equal(ulp_distance(x, up), np.ones(5, np.uint64))


def test_float64_extremes_do_not_overflow() -> None:
    big = np.array([np.finfo(np.float64).max])
    ordinal = int(big.view(np.int64)[0])  # positive: the ordinal is the bit pattern
    assert int(ulp_distance(-big, big)[0]) == 2 * ordinal


def test_ulp_distance_refuses_mixed_dtypes_shapes_and_ints() -> None:
    with pytest.raises(ValueError, match="float32 and float64"):
        ulp_distance(np.zeros(2, np.float32), np.zeros(2, np.float64))
    with pytest.raises(ValueError, match="shape"):
        ulp_distance(np.zeros(2), np.zeros(3))
    with pytest.raises(TypeError, match="int32"):
        ulp_distance(np.zeros(2, np.int32), np.zeros(2, np.int32))


# --- ToleranceClass ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"rule": "close", "atol": -1e-5}, "atol"),
        ({"rule": "close", "rtol": -0.1}, "rtol"),
        ({"rule": "close", "atol": math.inf}, "atol"),
        ({"rule": "close", "atol_ulps": -2.0}, "atol_ulps"),
        ({"rule": "ulp", "max_ulp": -1}, "max_ulp"),
        ({"rule": "roughly"}, "rule"),
        ({"rule": "bitwise", "atol": 1e-3}, "atol"),
        ({"rule": "ulp", "max_ulp": 2, "rtol": 1e-3}, "rtol"),
        ({"rule": "close", "atol": 1e-3, "atol_ulps": 2.0}, "atol_ulps"),
    ],
)
def test_invalid_classes_are_refused_naming_field_and_value(
    kwargs: dict[str, Any], field: str
) -> None:
    rule = kwargs["rule"]
    with pytest.raises(ValueError, match=field) as info:
        ToleranceClass.from_dict({"name": "bad", "meaning": "test", **kwargs})
    shown = rule if field == "rule" else kwargs[field]
    assert repr(shown) in str(info.value)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_registry_classes_round_trip_through_json(name: str) -> None:
    tol = REGISTRY[name]
    assert tol.meaning and tol.measured
    assert ToleranceClass.from_dict(json.loads(json.dumps(tol.to_dict()))) == tol


def test_from_dict_refuses_unknown_fields() -> None:
    data = REGISTRY["trajectory"].to_dict() | {"atoll": 1.0}
    with pytest.raises(ValueError, match="atoll"):
        ToleranceClass.from_dict(data)


def test_describe_allowed_states_the_rule() -> None:
    assert REGISTRY["bitwise"].describe_allowed() == "bitwise"
    assert ulp_class(4).describe_allowed() == "ulp <= 4"
    tol = ToleranceClass("t", Close(atol=1.7e-5), meaning="test")
    assert tol.describe_allowed() == "|a-b| <= 1.7e-05 + 0*|b|"
    assert "ulp(max|b|)" in ToleranceClass("u", Close(atol_ulps=3), meaning="t").describe_allowed()


def test_registry_holds_the_design_classes_and_is_read_only() -> None:
    assert {"bitwise", "fp32_reassoc", "trajectory", "device_count"} <= set(REGISTRY)
    assert "1.7e-5" in REGISTRY["fp32_reassoc"].measured
    assert "3.9e-6" in REGISTRY["trajectory"].measured
    with pytest.raises(TypeError):
        REGISTRY["mine"] = REGISTRY["bitwise"]  # type: ignore[index]


def test_get_class_lists_known_names() -> None:
    assert get_class("trajectory") is REGISTRY["trajectory"]
    with pytest.raises(KeyError) as info:
        get_class("fp32_reasoc")
    assert isinstance(info.value, UnknownClassError)
    for name in REGISTRY:
        assert name in str(info.value)
    mine = {"mine": ToleranceClass("mine", Ulp(max_ulp=2), meaning="test")}
    assert get_class("mine", mine) is mine["mine"]
    with pytest.raises(ValueError, match="own name"):
        get_class("alias", {"alias": mine["mine"]})


# --- ClassMap ------------------------------------------------------------------------------


def test_class_map_first_match_wins() -> None:
    cmap = ClassMap(
        (("taps.layers.0.*", "bitwise"), ("taps.*", "fp32_reassoc"), ("*", "trajectory"))
    )
    assert cmap.class_for("taps.layers.0.h1") == "bitwise"
    assert cmap.class_for("taps.layers.10.h1") == "fp32_reassoc"
    assert cmap.class_for("params.w") == "trajectory"
    assert cmap.resolve("taps.layers.3.post") is REGISTRY["fp32_reassoc"]


def test_class_map_without_match_or_default_says_so() -> None:
    cmap = ClassMap((("taps.*", "fp32_reassoc"),))
    with pytest.raises(UnmatchedKeyError, match=r"'logits'.*taps\.\*.*default"):
        cmap.class_for("logits")
    assert ClassMap((("taps.*", "fp32_reassoc"),), default="bitwise").class_for("logits") == (
        "bitwise"
    )


def test_class_map_round_trips_through_json_byte_stably() -> None:
    cmap = ClassMap((("a.*", "bitwise"), ("b.?", "trajectory")), default="fp32_reassoc")
    text = cmap.to_json()
    assert ClassMap.from_json(text) == cmap
    assert ClassMap.from_json(text).to_json() == text
    assert ClassMap.from_json(ClassMap().to_json()) == ClassMap()


def test_class_map_refuses_bad_json_and_unknown_classes() -> None:
    with pytest.raises(ValueError, match="rules"):
        ClassMap.from_json('{"rules": [["a"]], "default": null}')
    with pytest.raises(ValueError):
        ClassMap.from_json('{"patterns": []}')
    with pytest.raises(UnknownClassError, match="nope"):
        ClassMap((("a", "nope"),)).check()


def test_tolerance_compare_and_report_do_not_import_jax_or_decomp() -> None:
    code = (
        "import sys; import parity; before = set(sys.modules);"
        "import parity.judge._tolerance, parity.judge._compare, parity.report;"
        "new = set(sys.modules) - before;"
        "bad = sorted(m for m in new if m.split('.')[0] in ('jax', 'jaxlib', 'decomp'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_half_floats_take_the_sign_magnitude_line_with_the_rank_tables_distances(
    dtype: type,
) -> None:
    # Every pattern of the dtype against a fixed sample of others: the fast line (sign-
    # magnitude bits) and the general one (each value's rank by value) agree everywhere.
    from parity.judge._ulp import _rank_table, _uint_view

    patterns = np.arange(65536, dtype=np.uint16).view(dtype)
    table = _rank_table(np.dtype(dtype))[_uint_view(patterns)]
    rng = np.random.default_rng(0)
    other = patterns[rng.permutation(65536)]
    expected = np.abs(table - _rank_table(np.dtype(dtype))[_uint_view(other)])
    nan = (table < 0) | (_rank_table(np.dtype(dtype))[_uint_view(other)] < 0)
    got = ulp_distance(patterns, other)
    assert np.array_equal(got[~nan], expected[~nan].astype(np.uint64))
    assert (got[nan] == ULP_NAN).all()
