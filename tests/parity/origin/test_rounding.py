"""Rounding models per operation (issue 59, `parity.origin._rounding`): each held against jax
itself. A rearrangement of the base's values gives jax's result bit for bit; arithmetic
gives a bound that jax's float32 result lies within and that a candidate moved twice as
far breaks; sums taken in other orders, or in groups, lie within the model of the sum.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax import lax

from parity.origin._primitives import model
from parity.origin._rounding import Fresh, allowed, gamma, grounded, unit_roundoff, within

PROPERTY = settings(max_examples=20, deadline=None, derandomize=True)
BF16 = np.dtype(ml_dtypes.bfloat16)


def _traced(fn: Callable[..., Any], *args: Any, primitive: str) -> tuple[Any, list[Any], Any]:
    """The first equation of `primitive` in `fn`'s program, its operands' values and its
    result, the program run equation by equation with each primitive's own `bind` (these
    programs call no function that `bind` would need to be told of)."""
    closed = jax.make_jaxpr(fn)(*args)
    env = dict(zip(closed.jaxpr.invars, args, strict=True))
    env.update(zip(closed.jaxpr.constvars, closed.consts, strict=True))
    for eqn in closed.jaxpr.eqns:
        values = [v.val if type(v).__name__ == "Literal" else env[v] for v in eqn.invars]
        result = eqn.primitive.bind(*values, **eqn.params)
        if eqn.primitive.name == primitive:
            return eqn, values, result
        results = result if eqn.primitive.multiple_results else [result]
        env.update(zip(eqn.outvars, results, strict=True))
    raise AssertionError(f"no {primitive} in {closed}")


def _modelled(eqn: Any, values: list[Any]) -> Fresh:
    f = model(
        eqn.primitive.name, eqn.params, [grounded(v) for v in values], eqn.outvars[0].aval.dtype
    )
    assert f is not None, eqn.primitive.name
    return f


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64).view(np.uint64)


def _normal(seed: int, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    """Standard normals at a scale drawn from 1e-3 to 1e3 (far from underflow)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4)).astype(dtype)


X = _normal(0, (2, 3, 4))
Y = _normal(1, (2, 3, 4))

EXACT = {
    "reshape": (lambda a: a.reshape(6, 4), (X,)),
    "transpose": (lambda a: a.transpose(2, 0, 1), (X,)),
    "squeeze": (lambda a: lax.squeeze(a[:1], (0,)), (X,)),
    "broadcast_in_dim": (lambda a: jnp.broadcast_to(a[:, None], (2, 5, 3, 4)), (X,)),
    "slice": (lambda a: lax.slice(a, (0, 1, 0), (2, 3, 4), (1, 1, 3)), (X,)),
    "concatenate": (lambda a, b: jnp.concatenate([a, b], 1), (X, Y)),
    "pad": (lambda a: lax.pad(a, -2.5, [(1, -1, 1), (0, 2, 0), (-2, 1, 2)]), (X,)),
    "rev": (lambda a: lax.rev(a, (0, 2)), (X,)),
    "copy": (lambda a: lax.copy_p.bind(a), (X,)),
    "dynamic_slice": (lambda a, i: lax.dynamic_slice(a, (i, 1, 0), (1, 2, 4)), (X, 7)),
    "dynamic_update_slice": (
        lambda a, b, i: lax.dynamic_update_slice(a, b[:1, :2], (0, i, -9)),
        (X, Y, np.int32(-5)),
    ),
    "select_n": (lambda p, a, b: lax.select_n(p, a, b), (X > 0, X, Y)),
    "max": (lambda a, b: lax.max(a, b), (X, Y)),
    "min": (lambda a, b: lax.min(a, 0.5), (X, Y)),
    "abs": (lambda a: lax.abs(a), (X,)),
    "neg": (lambda a: -a, (X,)),
    "reduce_max": (lambda a: a.max((0, 2)), (X,)),
    "reduce_min": (lambda a: a.min(1), (X,)),
}
#: Exact operations that pick among their operands: `mag` is the largest of theirs.
PICKING = {"max", "min", "reduce_max", "reduce_min"}
WIDE = np.array([1e10, -1e10, np.nan, 2.7, -2.7, np.inf, -np.inf, 0.5, -0.0], np.float32)
CONVERSIONS = {
    "float32 to int32": (WIDE, jnp.int32),
    "float32 to uint8": (WIDE, jnp.uint8),
    "float32 to bool": (WIDE, jnp.bool_),
    "int32 to int8": (np.array([300, -129, 5, 0], np.int32), jnp.int8),
    "int32 to float32": (np.array([2**24 + 1, -7, 0], np.int32), jnp.float32),
    "int32 to bfloat16": (np.array([257, -7, 0], np.int32), jnp.bfloat16),
    "bool to float32": (np.array([True, False]), jnp.float32),
}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_an_exact_operation_on_base_values_gives_jaxs_result_bit_for_bit(name: str) -> None:
    fn, args = EXACT[name]
    eqn, values, result = _traced(fn, *args, primitive=name)
    f = _modelled(eqn, values)
    expected = np.asarray(result).astype(np.float64)
    assert f.centre.shape == expected.shape
    assert np.array_equal(_bits(f.centre), _bits(expected)), (f.centre, expected)
    if name in PICKING:
        assert np.all(f.mag >= np.abs(expected))
    else:
        assert np.array_equal(_bits(f.mag), _bits(np.abs(expected)))
    assert f.depth == 0 and not np.any(f.slack)
    assert within(np.asarray(result), f, eqn.outvars[0].aval.dtype) == (True, 0.0)


@pytest.mark.parametrize("name", sorted(CONVERSIONS))
def test_a_conversion_of_a_base_value_gives_jaxs_result_bit_for_bit(name: str) -> None:
    x, dtype = CONVERSIONS[name]
    eqn, values, result = _traced(
        lambda a: lax.convert_element_type(a, dtype), x, primitive="convert_element_type"
    )
    f = _modelled(eqn, values)
    expected = np.asarray(result).astype(np.float64)
    assert np.array_equal(_bits(f.centre), _bits(expected)), (f.centre, expected)
    assert f.dtype == np.dtype(dtype).name


@PROPERTY
@given(
    config=st.lists(
        st.tuples(st.integers(-3, 3), st.integers(-3, 3), st.integers(0, 2)), min_size=2, max_size=2
    ),
    strided=st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(1, 3)),
)
def test_any_padding_or_strided_slice_is_jaxs(
    config: list[tuple[int, int, int]], strided: tuple[int, int, int]
) -> None:
    x = X[0]
    sizes = [
        n + max(n - 1, 0) * inner + lo + hi
        for n, (lo, hi, inner) in zip(x.shape, config, strict=True)
    ]
    if min(sizes) >= 0:
        eqn, values, result = _traced(lambda a: lax.pad(a, 3.0, config), x, primitive="pad")
        assert np.array_equal(_modelled(eqn, values).centre, np.asarray(result, np.float64))
    start, limit, stride = strided
    if start <= limit:
        eqn, values, result = _traced(
            lambda a: lax.slice(a, (0, start), (3, min(limit, 4)), (1, stride)),
            x,
            primitive="slice",
        )
        assert np.array_equal(_modelled(eqn, values).centre, np.asarray(result, np.float64))


def _holds(candidate: Any, f: Fresh, dtype: Any) -> None:
    """`candidate` (jax's) lies within `f`; moved to twice the bound where it is widest, it
    does not."""
    __tracebackhide__ = True
    ok, margin = within(np.asarray(candidate), f, dtype)
    assert ok and margin <= 1, (margin, f.depth)
    bound = allowed(f, dtype)
    i = np.unravel_index(np.argmax(bound), bound.shape)
    assert bound[i] > 0
    moved = np.array(np.asarray(candidate), dtype=np.float64)
    moved[i] = f.centre[i] + 2 * bound[i]
    ok, margin = within(moved, f, dtype)
    assert not ok and margin == pytest.approx(2, rel=1e-6)


ELEMENTWISE = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "integer_pow": lambda a, b: a**2,
    "square": lambda a, b: jnp.square(a),
}


@PROPERTY
@given(name=st.sampled_from(sorted(ELEMENTWISE)), seed=st.integers(0, 2**16), n=st.integers(1, 40))
def test_jaxs_elementwise_arithmetic_lies_within_its_model(name: str, seed: int, n: int) -> None:
    a, b = _normal(seed, (n,)), _normal(seed + 1, (n,))
    # Before jax had a `square` primitive, jnp.square was integer_pow with y = 2.
    primitive = name if name != "square" or hasattr(lax, "square_p") else "integer_pow"
    eqn, values, result = _traced(ELEMENTWISE[name], a, b, primitive=primitive)
    _holds(result, _modelled(eqn, values), np.float32)


#: Each einsum, and its operands' shapes for a contraction length k.
DOTS = {
    "batched": ("bij,bjk->bik", lambda k: ((3, 2, k), (3, k, 4))),
    "matmul": ("ij,jk->ik", lambda k: ((5, k), (k, 6))),
    "two contracted": ("ijk,jkl->il", lambda k: ((2, k, 3), (k, 3, 2))),
}


@PROPERTY
@given(kind=st.sampled_from(sorted(DOTS)), k=st.integers(1, 512), seed=st.integers(0, 2**16))
def test_jaxs_dot_general_lies_within_its_model(kind: str, k: int, seed: int) -> None:
    spec, shapes = DOTS[kind]
    left, right = shapes(k)
    a, b = _normal(seed, left), _normal(seed + 1, right)
    eqn, values, result = _traced(
        lambda x, y: jnp.einsum(spec, x, y), a, b, primitive="dot_general"
    )
    f = _modelled(eqn, values)
    # K roundings of each product's path: its own, and K - 1 additions in any order.
    assert f.depth == (3 * k if kind == "two contracted" else k)
    # The centre is float64 arithmetic in some order of its own (numpy's einsum picks its
    # path by version): within float64's rounding of the same sum, the term the bound has.
    reference = np.einsum(spec, a.astype(np.float64), b.astype(np.float64))
    assert np.all(np.abs(f.centre - reference) <= gamma(f.depth, np.float64) * f.mag)
    _holds(result, f, np.float32)


@PROPERTY
@given(
    seed=st.integers(0, 2**16),
    shape=st.lists(st.integers(2, 9), min_size=1, max_size=3),
    pick=st.lists(st.booleans(), min_size=3, max_size=3),
)
def test_jaxs_reduce_sum_lies_within_its_model(
    seed: int, shape: list[int], pick: list[bool]
) -> None:
    axes = tuple(i for i in range(len(shape)) if pick[i]) or (0,)
    x = _normal(seed, tuple(shape))
    eqn, values, result = _traced(lambda a: a.sum(axes), x, primitive="reduce_sum")
    f = _modelled(eqn, values)
    assert f.depth == math.prod(shape[i] for i in axes) - 1
    _holds(result, f, np.float32)


def test_a_chain_of_operations_lies_within_the_chain_of_models() -> None:
    a, b, c = _normal(5, (64,)), _normal(6, (64,)), _normal(7, (64,))
    total = model("add", {}, [grounded(a), grounded(b)], np.float32)
    assert total is not None
    f = model("mul", {}, [total, grounded(c)], np.float32)
    assert f is not None and f.depth == 2
    q = model("div", {}, [f, grounded(b)], np.float32)
    assert q is not None and q.depth == 3
    _holds((jnp.asarray(a) + b) * c / b, q, np.float32)


def _sequential(values: np.ndarray) -> np.float32:
    total = np.float32(0)
    for v in values:
        total = np.float32(total + v)
    return total


@PROPERTY
@given(seed=st.integers(0, 2**16))
def test_a_sum_in_any_order_lies_within_the_model_and_a_dropped_term_does_not(seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal(1000).astype(np.float32)
    f = model("reduce_sum", {"axes": (0,)}, [grounded(x)], np.float32)
    assert f is not None
    orders = [np.add.reduce(x), _sequential(x[::-1]), _sequential(x[np.argsort(np.abs(x))])]
    for total in orders:
        assert within(np.asarray(total), f, np.float32)[0]
    # Tight enough to tell a real change: gamma_999 for float32, from numpy's own epsilon.
    expected = 999 * np.finfo(np.float32).eps / 2
    assert gamma(999, "float32") == pytest.approx(expected, rel=1e-3) and expected < 1e-4
    assert float(allowed(f, np.float32)) / float(f.mag) == pytest.approx(expected, rel=1e-3)
    largest = np.argmax(np.abs(x))
    assert not within(np.asarray(np.add.reduce(np.delete(x, largest))), f, np.float32)[0]


@PROPERTY
@given(sizes=st.lists(st.integers(1, 60), min_size=1, max_size=6), seed=st.integers(0, 2**16))
def test_a_sum_of_group_sums_covers_the_flat_sum_in_another_order(
    sizes: list[int], seed: int
) -> None:
    leaves = _normal(seed, (sum(sizes),))
    groups = np.split(leaves, np.cumsum(sizes)[:-1])
    total: Fresh | None = None
    for group in groups:
        part = model("reduce_sum", {"axes": (0,)}, [grounded(group)], np.float32)
        total = part if total is None else model("add", {}, [total, part], np.float32)
        assert total is not None
    assert total is not None and total.depth == leaves.size - 1
    shuffled = np.random.default_rng(seed).permutation(leaves)
    for flat in (_sequential(leaves[::-1]), np.add.reduce(shuffled)):
        assert within(np.asarray(flat), total, np.float32)[0]


def test_a_rounding_into_bfloat16_and_back_is_covered() -> None:
    x, w = _normal(8, (300,)), _normal(9, (300, 4)).astype(BF16)
    low = model("convert_element_type", {"new_dtype": BF16}, [grounded(x)], BF16)
    assert low is not None and low.depth == 0 and np.any(low.slack)
    assert within(np.asarray(jnp.asarray(x).astype(jnp.bfloat16)), low, BF16)[0]
    scaled = model("mul", {}, [low, grounded(w[:, 0])], BF16)
    assert scaled is not None
    _holds(jnp.asarray(x).astype(jnp.bfloat16) * w[:, 0], scaled, BF16)
    # A bfloat16 product carried on in float32: its bound is spent in bfloat16 first.
    wide = model("convert_element_type", {"new_dtype": np.float32}, [scaled], np.float32)
    assert wide is not None and wide.depth == 0
    assert np.array_equal(wide.slack, allowed(scaled, BF16))
    plus = model("add", {}, [wide, grounded(x)], np.float32)
    assert plus is not None
    got = (jnp.asarray(x).astype(jnp.bfloat16) * w[:, 0]).astype(jnp.float32) + x
    _holds(got, plus, np.float32)
    eqn, values, result = _traced(
        lambda a, b: jnp.einsum("i,ij->j", a, b, preferred_element_type=jnp.float32),
        x.astype(BF16),
        w,
        primitive="dot_general",
    )
    _holds(result, _modelled(eqn, values), np.float32)
    # The same dot of the narrowed value (slack, not a base value) is covered too.
    dot = model("dot_general", eqn.params, [low, grounded(w)], np.float32)
    assert dot is not None and np.all(dot.slack > 0)
    _holds(result, dot, np.float32)


def test_what_has_no_model_answers_none() -> None:
    x = grounded(X)
    sum_ = model("add", {}, [x, x], np.float32)
    assert sum_ is not None
    assert model("exp", {}, [x], np.float32) is None
    assert model("div", {}, [x, sum_], np.float32) is None
    assert model("integer_pow", {"y": -1}, [x], np.float32) is None
    assert model("convert_element_type", {"new_dtype": np.int32}, [sum_], np.int32) is None
    assert model("select_n", {}, [sum_, x, x], np.float32) is None
    assert model("add", {}, [x, x], np.complex64) is None


def test_within_places_nan_and_infinity_and_refuses_another_shape() -> None:
    centre = np.array([1.0, np.nan, np.inf, -np.inf])
    f = grounded(centre)
    assert within(centre.copy(), f, np.float32) == (True, 0.0)
    assert not within(np.array([np.nan, 1.0, np.inf, -np.inf]), f, np.float32)[0]
    assert not within(np.array([1.0, np.nan, -np.inf, -np.inf]), f, np.float32)[0]
    assert within(centre[:3], f, np.float32) == (False, math.inf)
    assert within(np.array([1.5, np.nan, np.inf, -np.inf]), f, np.float32) == (False, math.inf)
    scalar_slack = Fresh(np.zeros(3), np.zeros(3), 0, np.asarray(0.25))
    assert within(np.full(3, 0.25), scalar_slack, np.float32) == (True, 1.0)


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float32, np.float64])
def test_unit_roundoff_and_gamma_follow_each_types_epsilon(dtype: Any) -> None:
    u = float(ml_dtypes.finfo(dtype).eps) / 2
    assert unit_roundoff(dtype) == u == unit_roundoff(np.dtype(dtype).name)
    for n in (1, 7, 100):
        assert (1 + u) ** n - 1 <= gamma(n, dtype)
        # Higham's gamma_j + gamma_k + gamma_j gamma_k <= gamma_(j+k), to float64's own ulp.
        j, k = gamma(n, dtype), gamma(2 * n, dtype)
        assert j + k + j * k <= gamma(3 * n, dtype) * (1 + 4 * np.finfo(np.float64).eps)
    assert gamma(0, dtype) == 0 and gamma(math.ceil(1 / u), dtype) == math.inf
    assert unit_roundoff(np.int32) == 0 == gamma(5, "bool")
