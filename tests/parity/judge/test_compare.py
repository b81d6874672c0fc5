"""compare_arrays and compare_trees: verdicts, figures, the worst index and forward order."""

from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest

from parity.judge._classes import REGISTRY, ToleranceClass
from parity.judge._compare import (
    ArrayVerdict,
    Comparison,
    Finding,
    compare_arrays,
    compare_trees,
    flatten,
    measure_array,
)
from parity.judge._fixed_rules import Close, Ulp
from parity.judge._reasons import array_reason
from parity.judge._tolerance import ClassMap, UnmatchedKeyError

BITWISE = REGISTRY["bitwise"]
ULP0 = ToleranceClass("ulp0", Ulp(max_ulp=0), meaning="test")
ULP1 = ToleranceClass("ulp1", Ulp(max_ulp=1), meaning="test")
CLOSE = REGISTRY["fp32_reassoc"]
LOOSE = ToleranceClass("loose", Close(atol=10.0, rtol=1.0), meaning="test")


def test_signed_zero_fails_only_bitwise() -> None:
    pos = np.zeros(4, np.float32)
    neg = -pos
    assert not compare_arrays("z", neg, pos, BITWISE).passed
    for tol in (ULP0, CLOSE):
        finding = compare_arrays("z", neg, pos, tol)
        assert finding.passed and not finding.bitwise_equal
        assert finding.n_differ == 4 and finding.max_abs == 0.0 and finding.max_ulp == 0


def test_nan_payloads_pass_close_but_not_bitwise() -> None:
    golden = np.array([1.0, np.nan], np.float32)
    actual = golden.copy()
    actual.view(np.uint32)[1] ^= 1  # another quiet NaN
    assert np.isnan(actual[1])
    assert compare_arrays("n", actual, golden, CLOSE).passed
    assert not compare_arrays("n", actual, golden, BITWISE).passed


@pytest.mark.parametrize("tol", [ULP1, CLOSE, LOOSE], ids=lambda t: t.name)
def test_nan_at_other_positions_fails_every_class(tol: ToleranceClass) -> None:
    golden = np.array([1.0, np.nan, 3.0], np.float32)
    actual = np.array([np.nan, 2.0, 3.0], np.float32)
    finding = compare_arrays("n", actual, golden, tol)
    assert finding.verdict == "fail"
    assert finding.n_nan_inf_mismatch == 2 and finding.worst_index == (0,)
    assert "NaN/inf" in finding.reason


@pytest.mark.parametrize("tol", [ULP1, CLOSE, LOOSE], ids=lambda t: t.name)
def test_inf_sign_must_match(tol: ToleranceClass) -> None:
    golden = np.array([np.inf, -np.inf, 1.0], np.float64)
    assert compare_arrays("i", golden.copy(), golden, tol).passed
    flipped = np.array([np.inf, np.inf, 1.0], np.float64)
    finding = compare_arrays("i", flipped, golden, tol)
    assert not finding.passed and finding.worst_index == (1,)
    finite = np.array([np.inf, -1e300, 1.0], np.float64)
    assert not compare_arrays("i", finite, golden, tol).passed


def test_dtype_mismatch_is_a_verdict_not_a_cast() -> None:
    golden = np.arange(4, dtype=np.float64)
    finding = compare_arrays("h1", golden.astype(np.float32), golden, LOOSE)
    assert finding.verdict == "fail"
    assert (finding.dtype_actual, finding.dtype_expected) == ("float32", "float64")
    assert "float32" in finding.reason and "float64" in finding.reason and "'h1'" in finding.reason
    assert finding.max_abs is None and finding.n_differ is None


def test_shape_mismatch_is_a_verdict_not_a_broadcast() -> None:
    golden = np.ones((2, 3), np.float32)
    finding = compare_arrays("w", np.ones((3,), np.float32), golden, LOOSE)
    assert finding.verdict == "fail"
    assert "(3,)" in finding.reason and "(2, 3)" in finding.reason
    assert finding.shape_actual == (3,) and finding.shape_expected == (2, 3)


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.int64, np.bool_, ml_dtypes.int4])
def test_integer_and_bool_arrays_are_exact_under_every_class(dtype: type) -> None:
    golden = np.array([1, 0, 1, 1], dtype)
    actual = np.array([1, 1, 1, 1], dtype)
    assert compare_arrays("i", golden.copy(), golden, LOOSE).passed
    finding = compare_arrays("i", actual, golden, LOOSE)
    assert finding.verdict == "fail" and finding.worst_index == (1,)
    assert finding.max_abs == 1.0 and finding.max_ulp is None
    assert "exactly" in finding.reason


def test_unsigned_differences_do_not_wrap() -> None:
    golden = np.array([0, 2**64 - 1], np.uint64)
    actual = np.array([2**64 - 1, 0], np.uint64)
    finding = compare_arrays("u", actual, golden, BITWISE)
    assert finding.max_abs == float(2**64 - 1)


def test_worst_index_is_the_largest_violation_ratio_not_the_largest_error() -> None:
    tol = ToleranceClass("dc", Close(atol=1e-7, rtol=1e-4), meaning="test")
    golden = np.array([[100.0, 1e-3], [5.0, -2.0]])
    delta = np.array([[1.5e-2, 5e-6], [0.0, 1e-5]])
    actual = golden + delta
    ratios = {
        (i, j): abs(float(actual[i, j]) - float(golden[i, j]))
        / (1e-7 + 1e-4 * abs(float(golden[i, j])))
        for i in range(2)
        for j in range(2)
    }
    finding = compare_arrays("k", actual, golden, tol)
    assert finding.worst_index == max(ratios, key=lambda ij: ratios[ij]) == (0, 1)
    assert finding.worst_actual == float(actual[0, 1])
    assert finding.worst_expected == float(golden[0, 1])
    assert finding.n_violating == sum(r > 1 for r in ratios.values())
    assert finding.max_abs == max(
        abs(float(a) - float(g)) for a, g in zip(actual.ravel(), golden.ravel(), strict=True)
    )


def test_worst_index_under_ulp_is_the_largest_ulp_and_under_bitwise_the_first() -> None:
    golden = np.array([1.0, 2.0, 4.0, 8.0], np.float32)
    actual = golden.copy()
    actual[1] = np.nextafter(golden[1], np.float32(3))
    actual[2] = np.nextafter(np.nextafter(golden[2], np.float32(5)), np.float32(5))
    assert compare_arrays("u", actual, golden, ULP1).worst_index == (2,)
    assert compare_arrays("u", actual, golden, ULP1).max_ulp == 2
    assert compare_arrays("u", actual, golden, BITWISE).worst_index == (1,)


def test_bfloat16_is_compared_after_an_exact_upcast() -> None:
    golden = np.array([1.0, -3.5, 1e30], ml_dtypes.bfloat16)
    actual = golden.copy()
    actual.view(np.uint16)[2] += 1  # the next bfloat16 above 1e30
    finding = compare_arrays("b", actual, golden, ULP1)
    assert finding.passed and finding.max_ulp == 1 and finding.worst_index == (2,)
    assert finding.max_abs == float(actual[2].astype(np.float32)) - float(
        golden[2].astype(np.float32)
    )
    assert finding.dtype_expected == "bfloat16"
    assert not compare_arrays("b", actual, golden, BITWISE).passed


def test_scalars_and_empty_arrays() -> None:
    assert compare_arrays("s", np.float32(1), np.float32(1), BITWISE).passed
    finding = compare_arrays("s", np.float32(2), np.float32(1), CLOSE)
    assert finding.verdict == "fail" and finding.worst_index == ()
    assert compare_arrays("e", np.zeros((0, 3)), np.zeros((0, 3)), BITWISE).passed


def test_jax_arrays_are_accepted() -> None:
    jnp = pytest.importorskip("jax.numpy")
    golden = np.linspace(0, 1, 8, dtype=np.float32)
    finding = compare_arrays("j", jnp.asarray(golden), golden, BITWISE)
    assert finding.passed and finding.bitwise_equal


def test_finding_round_trips_through_json() -> None:
    golden = np.array([1.0, 2.0, 3.0], np.float32)
    finding = compare_arrays("k", golden + np.float32(1e-3), golden, CLOSE)
    data = json.loads(json.dumps(finding.to_dict(), allow_nan=False))
    assert data["class"] == "fp32_reassoc"
    assert Finding.from_dict(data) == finding


def test_non_finite_figures_are_json_strings() -> None:
    golden = np.array([0.0, np.nan], np.float32)
    actual = np.array([1.0, 1.0], np.float32)
    finding = compare_arrays("k", actual, golden, CLOSE)
    assert finding.max_rel == math.inf
    data = json.loads(json.dumps(finding.to_dict(), allow_nan=False))
    assert data["max_rel"] == "inf" and data["worst_expected"] == "nan"
    back = Finding.from_dict(data)
    assert back.max_rel == math.inf and back.worst_expected is not None
    assert math.isnan(float(back.worst_expected))  # pyright: ignore[reportArgumentType]


def test_object_arrays_are_refused() -> None:
    with pytest.raises(TypeError, match="object"):
        compare_arrays("o", np.array([None]), np.array([None]), BITWISE)


# --- trees -----------------------------------------------------------------------------------


def test_flatten_joins_dict_keys_with_dots_and_mixes_with_flat_keys() -> None:
    tree = {"layers": [{"h1": np.ones(2)}, {"h1": np.zeros(2)}], "logits": 1.0, "skip": None}
    flat = flatten(tree)
    assert list(flat) == ["layers.0.h1", "layers.1.h1", "logits"]
    assert flatten(flat).keys() == flat.keys()
    with pytest.raises(ValueError, match=r"a\.b"):
        flatten({"a": {"b": 1}, "a.b": 2})
    with pytest.raises(TypeError):
        flatten(np.ones(3))


def test_every_key_gets_a_finding_and_absent_keys_fail() -> None:
    golden = {"a": np.ones(3, np.float32), "b": np.ones(2, np.float32)}
    actual = {"a": np.ones(3, np.float32), "c": np.ones(2, np.float32)}
    comparison = compare_trees(actual, golden, "bitwise")
    verdicts = {f.key: f.verdict for f in comparison.findings}
    assert verdicts == {"a": "pass", "b": "missing", "c": "unexpected"}
    assert not comparison.passed
    assert {f.key for f in comparison.failures} == {"b", "c"}
    missing = comparison.finding("b")
    assert missing.shape_expected == (2,) and missing.shape_actual is None
    assert "'b'" in missing.reason and "repin" in missing.reason


def test_all_failures_are_collected_not_just_the_first() -> None:
    golden = {f"k{i}": np.full(3, float(i), np.float32) for i in range(5)}
    actual = {k: v + np.float32(1) for k, v in golden.items()}
    comparison = compare_trees(actual, golden, "fp32_reassoc")
    assert len(comparison.failures) == 5


def _layered(n_layer: int) -> tuple[dict[str, np.ndarray], list[str]]:
    rng = np.random.default_rng(0)
    order = [f"layers.{i}.{tap}" for i in range(n_layer) for tap in ("h1", "post")]
    return {k: rng.standard_normal(4).astype(np.float32) for k in order}, order


def test_first_divergence_follows_the_declared_order() -> None:
    golden, order = _layered(12)
    actual = {k: v.copy() for k, v in golden.items()}
    # By name "layers.10" sorts before "layers.2": only the declared order puts 2 first.
    actual["layers.2.post"] = np.nextafter(actual["layers.2.post"], np.float32(np.inf))
    actual["layers.10.h1"] = actual["layers.10.h1"] + np.float32(1.0)
    actual["layers.3.h1"] = actual["layers.3.h1"] + np.float32(1.0)
    cmap = ClassMap((("layers.*", "fp32_reassoc"),))
    for declared in (
        order,
        lambda k: (int(k.split(".")[1]), ["h1", "post"].index(k.split(".")[2])),
    ):
        comparison = compare_trees(actual, golden, cmap, order=declared)
        assert [f.key for f in comparison.findings] == order
        assert [f.order for f in comparison.findings] == list(range(len(order)))
        assert comparison.first_not_bitwise is not None
        assert comparison.first_not_bitwise.key == "layers.2.post"
        assert comparison.first_failure is not None
        assert comparison.first_failure.key == "layers.3.h1"
    # Without an order, the golden's own order is the forward order: a dict's insertion
    # order. Built in layer order, layer 3 comes first; the same dict sorted by name (what
    # jax makes of a dict) puts layer 10 first.
    assert list(golden) == order
    own = compare_trees(actual, golden, cmap)
    assert own.first_failure is not None and own.first_failure.key == "layers.3.h1"
    by_name = compare_trees(actual, dict(sorted(golden.items())), cmap)
    assert by_name.first_failure is not None and by_name.first_failure.key == "layers.10.h1"


def test_keys_only_in_actual_follow_the_golden_s_own_order_in_actual_s_order() -> None:
    golden = {"b": np.zeros(1, np.float32), "a": np.zeros(1, np.float32)}
    actual = {"z": np.zeros(1, np.float32), **golden, "c": np.zeros(1, np.float32)}
    comparison = compare_trees(actual, golden, "bitwise")
    assert [f.key for f in comparison.findings] == ["b", "a", "z", "c"]


def test_keys_outside_the_order_go_last_by_name() -> None:
    golden, order = _layered(2)
    golden |= {"z.extra": np.ones(1, np.float32), "a.extra": np.ones(1, np.float32)}
    comparison = compare_trees(golden, golden, "bitwise", order=order[::-1])
    keys = [f.key for f in comparison.findings]
    assert keys == [*order[::-1], "a.extra", "z.extra"]
    assert comparison.findings[-1].order is None
    with pytest.raises(TypeError, match="single str"):
        compare_trees(golden, golden, "bitwise", order="layers.0.h1")


def test_by_class_groups_findings_in_order() -> None:
    golden, order = _layered(3)
    cmap = ClassMap((("*.h1", "fp32_reassoc"),), default="bitwise")
    comparison = compare_trees(golden, golden, cmap, order=order)
    groups = comparison.by_class()
    assert [f.key for f in groups["fp32_reassoc"]] == [k for k in order if k.endswith("h1")]
    assert [f.key for f in groups["bitwise"]] == [k for k in order if k.endswith("post")]
    assert comparison.passed and comparison.first_not_bitwise is None


def test_unmatched_key_is_a_configuration_error() -> None:
    tree = {"logits": np.ones(2)}
    with pytest.raises(UnmatchedKeyError, match="logits"):
        compare_trees(tree, tree, ClassMap((("taps.*", "bitwise"),)))


def test_user_registry_is_used() -> None:
    tree = {"x": np.ones(2)}
    mine = ToleranceClass("mine", Ulp(max_ulp=1), meaning="test")
    comparison = compare_trees(tree, tree, "mine", registry={"mine": mine})
    assert comparison.findings[0].class_name == "mine"
    with pytest.raises(ValueError, match="own name"):
        compare_trees(tree, tree, "other", registry={"other": mine})


def test_comparison_to_dict_is_json_safe() -> None:
    golden = {"a": np.array([1.0, np.nan]), "b": np.zeros(2)}
    actual = {"a": np.array([np.nan, 1.0]), "c": np.zeros(2)}
    comparison = compare_trees(actual, golden, "trajectory")
    data = json.loads(json.dumps(comparison.to_dict(), allow_nan=False))
    assert data["verdict"] == "fail" and data["n_failures"] == 3
    assert isinstance(comparison, Comparison)
    assert data["first_failure"]["key"] == "a"


def test_dtypes_without_a_float_rule_are_compared_exactly() -> None:
    golden = np.array([1 + 1j, 2 + 0j], np.complex64)
    actual = golden + np.complex64(1e-6j)
    assert compare_arrays("c", golden.copy(), golden, LOOSE).passed
    finding = compare_arrays("c", actual, golden, LOOSE)
    assert finding.verdict == "fail" and "compared exactly" in finding.reason
    json.dumps(finding.to_dict(), allow_nan=False)


def test_bitwise_worst_is_the_first_differing_element_even_with_nans() -> None:
    golden = np.array([1.0, 2.0, 3.0], np.float32)
    actual = np.array([1.0, 2.5, np.nan], np.float32)
    finding = compare_arrays("b", actual, golden, BITWISE)
    assert finding.worst_index == (1,) and finding.n_nan_inf_mismatch == 1
    assert compare_arrays("b", actual, golden, CLOSE).worst_index == (2,)


def _verdict(**figures: object) -> ArrayVerdict:
    """A comparator's result written by hand: key `x`, float32 `(3,)` on both sides."""
    f32 = np.dtype(np.float32)
    sides = {"key": "x", "tol": BITWISE, "reference": "golden", "order": None,
             "shape_actual": (3,), "shape_expected": (3,), "dtype_actual": f32,
             "dtype_expected": f32, "n_elements": 3}  # fmt: skip
    return ArrayVerdict(**(sides | figures))


# [1, 2, 4] against [1, 2.5, 4] in float32: one element differs by 0.5, 2**21 ulps at 2.0.
_ONE_DIFFERS = {
    "mismatch": None, "kind": "float", "verdict": "fail", "n_differ": 1, "n_violating": 1,
    "n_nan_inf_mismatch": 0, "max_abs": 0.5, "max_rel": 0.25, "max_ulp": 2**21, "bound": 0.0,
    "worst_index": (1,), "worst_is": "first differing element",
    "worst_actual": np.float32(2.5), "worst_expected": np.float32(2.0),
    "worst_actual_value": 2.5, "worst_expected_value": 2.0,
}  # fmt: skip


def test_the_message_alone_renders_a_comparator_result_written_by_hand() -> None:
    v = _verdict(**_ONE_DIFFERS)
    assert array_reason(v) == (
        "key 'x' breaks class 'bitwise' (bitwise): 1 of 3 elements (33.3%) differ in their "
        "bits; first differing element at index (1,): actual 2.5 vs golden 2.0; max |a-b| "
        "0.5, max rel 0.25, max ulp 2097152; shape (3,), float32"
    )
    # The comparator computes those figures, and the finding carries the message's words.
    golden = np.array([1.0, 2.0, 4.0], np.float32)
    actual = np.array([1.0, 2.5, 4.0], np.float32)
    assert measure_array("x", actual, golden, BITWISE) == v
    assert compare_arrays("x", actual, golden, BITWISE).reason == array_reason(v)


def test_the_message_names_a_mismatch_and_says_nothing_of_a_pass() -> None:
    f64 = np.dtype(np.float64)
    dtype = _verdict(mismatch="dtype", kind=None, verdict="fail", dtype_actual=f64)
    assert array_reason(dtype) == (
        "key 'x': dtype float64 (actual) does not match float32 (golden); parity compares "
        "dtypes strictly, without casting. Produce float32, or repin the goldens if the dtype "
        "change is intended"
    )
    shape = _verdict(mismatch="shape", kind=None, verdict="fail", shape_actual=(1, 3))
    assert array_reason(shape) == (
        "key 'x': shape (1, 3) (actual) does not match (3,) (golden), float32; parity compares "
        "shapes strictly, without broadcasting"
    )
    assert array_reason(_verdict(**(_ONE_DIFFERS | {"verdict": "pass"}))) == ""
