"""The reduction-aware, logit-distribution and one-sided budget rules, each on arrays whose
right answer is known by another path: exact float64 sums (`math.fsum`), KL written out
with `math.log` on hand-built distributions, budgets moved by known amounts."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from parity.judge._classes import REGISTRY, ToleranceClass
from parity.judge._compare import compare_arrays, compare_trees
from parity.judge._measured_rules import Budget, LogitKL, Reduction, unit_roundoff
from parity.judge._rule_base import Scale
from parity.judge._tolerance import ClassMap, UnknownClassError, get_class
from parity.report import format_table


def _cls(rule, name: str = "t") -> ToleranceClass:
    return ToleranceClass(name, rule, meaning="test")


# --- reduction ---------------------------------------------------------------------------


def test_unit_roundoff_is_half_the_spacing_at_one() -> None:
    # Independent of finfo: the next value above 1.0 is 1.0's bit pattern plus one.
    for dtype, uint in ((np.float32, np.uint32), (np.float64, np.uint64),
                        (ml_dtypes.bfloat16, np.uint16), (np.float16, np.uint16)):  # fmt: skip
        above = (np.array(1.0, dtype).view(uint) + 1).astype(uint).view(dtype)
        assert unit_roundoff(dtype) == (float(above) - 1.0) / 2


def test_reduction_bound_is_k_sqrt_K_u_scale() -> None:
    rule = Reduction(k=3.0, K=400)
    scale = Scale(np.dtype(np.float32), 5.0)
    assert rule.bound(scale) == pytest.approx(3.0 * 20.0 * 2.0**-24 * 5.0, rel=1e-15)
    bf = Scale(np.dtype(ml_dtypes.bfloat16), 5.0)
    assert rule.bound(bf) == pytest.approx(3.0 * 20.0 * 2.0**-8 * 5.0, rel=1e-15)


@pytest.mark.parametrize("K", [64, 1024, 16384])
def test_reduction_bounds_the_float32_sum_of_random_positive_terms(K: int) -> None:
    """A sequential float32 sum against the exact sum (`math.fsum` of the same float32
    terms): within 8*sqrt(K)*u*|S| for terms of one sign, where max|b| is sum|x_i|."""
    rng = np.random.default_rng(K)
    x = rng.uniform(0.0, 1.0, size=(8, K)).astype(np.float32)
    sequential = np.add.accumulate(x, axis=1, dtype=np.float32)[:, -1]
    exact = np.array([math.fsum(row.astype(np.float64)) for row in x])
    golden = exact.astype(np.float32)  # the correctly rounded sum
    finding = compare_arrays("s", sequential, golden, _cls(Reduction(k=8.0, K=K)))
    assert finding.verdict == "pass", finding.reason
    assert not finding.bitwise_equal  # the rule had something to judge
    # The measured error sits within the same order as the sqrt(K) model predicts.
    worst = float(np.max(np.abs(sequential.astype(np.float64) - exact)))
    assert worst < 8.0 * math.sqrt(K) * 2.0**-24 * float(np.max(exact))


def test_reduction_is_not_a_bound_when_rounding_errors_align() -> None:
    """Summing one constant that rounds the same way every time: the error grows like K,
    not sqrt(K), and a k=8 reduction class rightly rejects it (the docstring's caveat)."""
    K = 1 << 20
    x = np.full(K, 0.1, np.float32)
    sequential = np.add.accumulate(x, dtype=np.float32)[-1:]
    exact = np.array([math.fsum([float(np.float32(0.1))] * K)])
    finding = compare_arrays("s", sequential, exact.astype(np.float32), _cls(Reduction(8, K=K)))
    assert finding.verdict == "fail"
    rel = abs(float(sequential[0]) - exact[0]) / exact[0]
    assert rel > 100 * math.sqrt(K) * 2.0**-24  # far beyond the sqrt(K) model


def test_reduction_length_comes_from_the_class_map() -> None:
    golden = {"taps.a": np.ones(4, np.float32) * 2, "taps.b": np.ones(4, np.float32) * 2}
    rule = REGISTRY["reduction"].rule
    assert isinstance(rule, Reduction)
    moved = 2 * rule.k * math.sqrt(100) * 2.0**-24 * 2.0  # twice the K=100 bound, under K=10000
    actual = {k: (v + np.float32(moved)).astype(np.float32) for k, v in golden.items()}
    cmap = ClassMap((("taps.a", "reduction[K=100]"), ("taps.b", "reduction[K=10000]")))
    comp = compare_trees(actual, golden, cmap)
    assert comp.finding("taps.a").verdict == "fail"
    assert comp.finding("taps.b").verdict == "pass"
    assert comp.finding("taps.a").class_name == "reduction[K=100]"
    assert comp.finding("taps.b").bound == pytest.approx(rule.k * 100 * 2.0**-24 * 2)


def test_a_reduction_class_without_its_length_says_how_to_declare_it() -> None:
    with pytest.raises(UnknownClassError, match=r"needs \['K'\].*reduction\[K="):
        get_class("reduction")
    with pytest.raises(UnknownClassError, match="takes"):
        get_class("reduction[Q=3]")
    with pytest.raises(UnknownClassError, match="param=number"):
        get_class("reduction[K]")
    assert get_class("reduction[K=7,k=2]").rule == Reduction(k=2.0, K=7)


# --- logit distributions -------------------------------------------------------------------


def _kl_by_hand(g_logits: list[float], a_logits: list[float]) -> float:
    def softmax(z: list[float]) -> list[float]:
        m = max(z)
        e = [math.exp(v - m) for v in z]
        s = sum(e)
        return [v / s for v in e]

    p, q = softmax(g_logits), softmax(a_logits)
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True) if pi > 0)


def test_kl_of_hand_built_distributions() -> None:
    # p = (1/2, 1/4, 1/4), q = (1/4, 1/2, 1/4): KL(p||q) = ln2/2 - ln2/4 = ln2/4.
    golden = np.log(np.array([[0.5, 0.25, 0.25]], np.float32))
    actual = np.log(np.array([[0.25, 0.5, 0.25]], np.float32))
    rule = LogitKL(tau=0.2, top_k=1, p=0.0)
    kl, agree = rule.positions(actual, golden)
    assert kl[0] == pytest.approx(math.log(2) / 4, rel=1e-6)
    assert agree[0] == 0.0  # argmax moved from token 0 to token 1
    assert compare_arrays("l", actual, golden, _cls(rule)).verdict == "pass"
    tight = compare_arrays("l", actual, golden, _cls(LogitKL(tau=0.17)))
    assert tight.verdict == "fail" and tight.figure == pytest.approx(math.log(2) / 4, rel=1e-6)


def test_kl_matches_a_written_out_formula_on_random_rows() -> None:
    rng = np.random.default_rng(0)
    golden = rng.normal(size=(3, 5, 17)).astype(np.float32) * 3
    actual = (golden + rng.normal(size=golden.shape).astype(np.float32) * 0.05).astype(np.float32)
    kl, _ = LogitKL(tau=1.0).positions(actual, golden)
    by_hand = np.array(
        [
            [_kl_by_hand(golden[i, j].tolist(), actual[i, j].tolist()) for j in range(5)]
            for i in range(3)
        ]
    )
    np.testing.assert_allclose(kl, by_hand, rtol=1e-9, atol=1e-15)


def test_a_shift_of_every_logit_is_no_change_of_distribution() -> None:
    golden = np.array([[2.0, 1.0, -1.0, 0.5]], np.float32)
    actual = golden + np.float32(4.0)
    kl_class = _cls(LogitKL(tau=1e-9, top_k=2, p=1.0))
    finding = compare_arrays("l", actual, golden, kl_class)
    assert finding.verdict == "pass" and finding.max_abs == 4.0
    assert compare_arrays("l", actual, golden, REGISTRY["fp32_reassoc"]).verdict == "fail"


def test_top_k_agreement_fails_a_swap_of_the_top_two_at_tiny_kl() -> None:
    golden = np.array([[3.0, 2.999, -5.0, -6.0], [1.0, 0.0, 0.0, 0.0]], np.float32)
    actual = golden.copy()
    actual[0, :2] = golden[0, 1::-1]  # the top two trade places
    rule = LogitKL(tau=1e-3, top_k=1, p=1.0)
    finding = compare_arrays("l", actual, golden, _cls(rule))
    assert finding.verdict == "fail"
    assert finding.figure is not None and finding.figure < 1e-5
    assert finding.n_violating == 4  # the whole first position, nothing of the second
    assert finding.worst_index == (0, 0) and "agreement 0" in finding.reason
    # With top-2 the set {0, 1} is the same on both sides.
    assert compare_arrays("l", actual, golden, _cls(LogitKL(1e-3, top_k=2))).verdict == "pass"


def test_kl_rule_keeps_the_shared_nan_placement_check() -> None:
    golden = np.array([[0.0, 1.0], [0.0, 1.0]], np.float32)
    actual = golden.copy()
    actual[1, 0] = np.nan
    finding = compare_arrays("l", actual, golden, _cls(LogitKL(tau=1.0, p=0.0)))
    assert finding.verdict == "fail" and finding.n_nan_inf_mismatch == 1


def test_logit_kl_parameters_are_checked() -> None:
    with pytest.raises(ValueError, match="share"):
        LogitKL(tau=1.0, p=1.5)
    with pytest.raises(ValueError, match="top_k"):
        LogitKL(tau=1.0, top_k=0)


# --- one-sided budgets ----------------------------------------------------------------------


def test_budget_fails_growth_beyond_its_share_only() -> None:
    budget = REGISTRY["compile_budget"]
    assert isinstance(budget.rule, Budget)
    golden = np.float64(10_000.0)
    assert compare_arrays("b", np.float64(10_199.0), golden, budget).verdict == "pass"
    grown = compare_arrays("b", np.float64(10_201.0), golden, budget)
    assert grown.verdict == "fail" and "grew by 201" in grown.reason
    assert grown.note == ""


def test_a_shrink_passes_and_says_to_ratchet() -> None:
    budget = REGISTRY["compile_budget"]
    golden = {"compile.f.hlo_bytes": np.float64(10_000.0), "compile.g.hlo_bytes": np.float64(50)}
    actual = {"compile.f.hlo_bytes": np.float64(7_000.0), "compile.g.hlo_bytes": np.float64(50)}
    comp = compare_trees(actual, golden, budget.name)
    assert comp.passed
    shrunk = comp.finding("compile.f.hlo_bytes")
    assert shrunk.note.startswith("below budget: repin to ratchet it down")
    assert "30% smaller" in shrunk.note
    assert comp.finding("compile.g.hlo_bytes").note == ""
    text = format_table(comp)
    assert "notes (1):" in text and "compile.f.hlo_bytes" in text.split("notes (1):")[1]
