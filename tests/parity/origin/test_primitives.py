"""The registry of primitives (`parity.origin._primitives`): how a backend computes an
operation, held against jax on this CPU, and modelled for a TPU from the arithmetic a TPU
is documented to do (its bfloat16 pass), computed here with numpy.

- A bfloat16 `dot_general` on a CPU accumulates in float32 and rounds once: jax's result
  is the float32 product rounded, its model is the tight one, and a candidate moved by a
  few of bfloat16's roundings on a few elements breaks it, where the bound of a sum
  rounded in bfloat16 at every step (K u) would pass it.
- A bfloat16 `reduce_sum` on a CPU does not: jax's result is not the float32 sum rounded
  once, and lies within the model of a sum rounded in bfloat16 at every step.
- On a TPU at default precision, a float32 `dot_general`'s operands are rounded to
  bfloat16 first: that product lies within the TPU's model and outside the CPU's; at
  `highest`, the TPU's model is the CPU's.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from parity.origin import _in_parts as in_parts
from parity.origin._primitives import REGISTRY, Machine, model
from parity.origin._rounding import allowed, grounded, within

BF16 = np.dtype(ml_dtypes.bfloat16)
DIMS = (((1,), (0,)), ((), ()))


def _pair(k: int, seed: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((16, k)).astype(dtype),
        rng.standard_normal((k, 8)).astype(dtype),
    )


def _dot_model(a: np.ndarray, b: np.ndarray, out: np.dtype, machine: Machine, **params: object):
    f = model(
        "dot_general",
        {"dimension_numbers": DIMS, "precision": None, **params},
        [grounded(a), grounded(b)],
        out,
        machine=machine,
    )
    assert f is not None
    return f


@pytest.mark.parametrize("k", [16, 512, 4096])
def test_a_bfloat16_dot_on_a_cpu_is_the_float32_product_rounded_once(k: int) -> None:
    a, b = _pair(k, k, BF16)
    got = np.asarray(lax.dot_general(jnp.asarray(a), jnp.asarray(b), DIMS))
    once = (a.astype(np.float32) @ b.astype(np.float32)).astype(BF16)
    assert got.dtype == BF16 and np.array_equal(got, once)
    tight = _dot_model(a, b, BF16, Machine("cpu"))
    assert tight.depth == 0  # spent in float32, then one rounding: slack
    assert within(got, tight, BF16)[0]
    # Each step rounded in bfloat16 (a backend not known to accumulate wider: a GPU here).
    loose = _dot_model(a, b, BF16, Machine("gpu"))
    assert within(got, loose, BF16)[0]
    assert np.all(allowed(tight, BF16) < allowed(loose, BF16))
    # Moved by twice the tight bound on one element: the tight model breaks, where the
    # loose one (k u of the terms' magnitudes) passes it for a long enough sum.
    moved = got.astype(np.float64)
    moved[0, 0] += 2 * allowed(tight, BF16)[0, 0]
    assert not within(moved.astype(BF16), tight, BF16)[0]
    if k >= 512:
        assert within(moved.astype(BF16), loose, BF16)[0]


def test_a_bfloat16_reduce_sum_on_a_cpu_is_rounded_at_every_step_and_covered() -> None:
    x = np.random.default_rng(3).standard_normal((8, 1024)).astype(BF16)
    got = np.asarray(lax.reduce_sum(jnp.asarray(x), (1,)))
    once = x.astype(np.float32).sum(1).astype(BF16)
    assert not np.array_equal(got, once)  # the premise: not float32 accumulation
    f = model("reduce_sum", {"axes": (1,)}, [grounded(x)], BF16, machine=Machine("cpu"))
    assert f is not None and f.depth == 1023
    assert within(got, f, BF16)[0]


def test_a_float32_dot_on_a_tpu_at_default_precision_is_bounded_in_its_bfloat16_pass() -> None:
    a, b = _pair(256, 7, np.dtype(np.float32))
    # What a TPU's MXU does at default precision: operands rounded to bfloat16, their
    # products exact in float32, summed in float32.
    tpu = a.astype(BF16).astype(np.float32) @ b.astype(BF16).astype(np.float32)
    default = _dot_model(a, b, np.dtype(np.float32), Machine("tpu"))
    assert within(tpu, default, np.float32)[0]
    cpu = _dot_model(a, b, np.dtype(np.float32), Machine("cpu"))
    assert not within(tpu, cpu, np.float32)[0]
    highest = _dot_model(a, b, np.dtype(np.float32), Machine("tpu", "highest"))
    assert np.array_equal(allowed(highest, np.float32), allowed(cpu, np.float32))
    # The operation's own precision wins over the machine's default.
    own = _dot_model(
        a, b, np.dtype(np.float32), Machine("tpu"), precision=(lax.Precision.HIGHEST,) * 2
    )
    assert np.array_equal(allowed(own, np.float32), allowed(cpu, np.float32))


@pytest.mark.parametrize("side", [0, 1])
@pytest.mark.parametrize("machine", [Machine("cpu"), Machine("tpu")])
def test_a_contraction_with_a_large_value_is_modelled_a_part_at_a_time_as_whole(
    side: int, machine: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 76: a `dot_general` whose large operand is a value of the base's is modelled
    over parts of that operand's free axis (`_in_parts.dot_in_parts`, here with `LARGE`
    made small), each part grounded on its own: the whole model's arithmetic, magnitudes,
    depth and bounds, with a batch axis, from either side, as jax computes it."""
    monkeypatch.setattr(in_parts, "LARGE", 100)
    rng = np.random.default_rng(side)
    big = rng.standard_normal((3, 64, 40) if side == 0 else (3, 40, 56)).astype(np.float32)
    small = rng.standard_normal((3, 40, 5) if side == 0 else (3, 7, 40)).astype(np.float32)
    lhs, rhs = (big, small) if side == 0 else (small, big)
    dims = (((2,), (1,)), ((0,), (0,)))  # contract 40, batch 3
    params = {"dimension_numbers": dims, "precision": None, "preferred_element_type": None}
    f32 = np.dtype(np.float32)
    whole = model("dot_general", params, [grounded(lhs), grounded(rhs)], f32, machine=machine)
    pair = (big, grounded(small)) if side == 0 else (grounded(small), big)
    parts = in_parts.dot_in_parts(params, pair, f32, machine)
    assert whole is not None and parts is not None and parts.depth == whole.depth
    np.testing.assert_allclose(parts.centre, whole.centre, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(parts.mag, whole.mag, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(allowed(parts, f32), allowed(whole, f32), rtol=1e-9)
    got = np.asarray(lax.dot_general(jnp.asarray(lhs), jnp.asarray(rhs), dims))
    assert within(got, parts, f32)[0] == within(got, whole, f32)[0]


def test_each_primitive_is_one_entry_and_a_rule_stands_beside_its_other_facts() -> None:
    # A move made on the host is a move of the recording, and exact on the base's values.
    for name, entry in REGISTRY.items():
        assert entry.name == name
        if entry.host is not None:
            assert entry.kind == "move" and entry.placing, name
        if entry.call or entry.bound:
            assert entry.rounding is None, name
    assert REGISTRY["dot_general"].computes is not None
    assert REGISTRY["reduce_sum"].computes is None


@pytest.mark.parametrize("reverse", [False, True])
def test_a_running_sum_in_any_order_lies_within_its_model(reverse: bool) -> None:
    x = np.random.default_rng(5).standard_normal((3, 700)).astype(np.float32)
    got = np.asarray(lax.cumsum(jnp.asarray(x), axis=1, reverse=reverse))
    f = model("cumsum", {"axis": 1, "reverse": reverse}, [grounded(x)], np.float32)
    assert f is not None and f.depth == 699
    assert within(got, f, np.float32)[0]
    # Another order: each prefix summed from its far end, in float32, one term at a time.
    ordered = x[:, ::-1] if reverse else x
    other = np.zeros_like(ordered)
    for i in range(ordered.shape[1]):
        other[:, i] = np.add.reduce(ordered[:, : i + 1][:, ::-1], axis=1, dtype=np.float32)
    assert within(other[:, ::-1] if reverse else other, f, np.float32)[0]
    moved = got.astype(np.float64)
    moved[1, 350] += 2 * allowed(f, np.float32)[1, 350]
    assert not within(moved.astype(np.float32), f, np.float32)[0]


@pytest.mark.parametrize("y", [0, 1, 3, 5])
def test_an_integer_power_lies_within_its_model(y: int) -> None:
    x = np.random.default_rng(y).standard_normal((64,)).astype(np.float32) * 3
    got = np.asarray(lax.integer_pow(jnp.asarray(x), y))
    f = model("integer_pow", {"y": y}, [grounded(x)], np.float32)
    assert f is not None and f.depth == max(y - 1, 0)
    assert within(got, f, np.float32)[0]
    if y > 1:
        moved = got.astype(np.float64) + 2 * allowed(f, np.float32)
        assert not within(moved.astype(np.float32), f, np.float32)[0]


def test_a_running_maximum_is_its_operands_elements() -> None:
    x = np.random.default_rng(2).standard_normal((4, 9)).astype(np.float32)
    got = np.asarray(lax.cummax(jnp.asarray(x), axis=1, reverse=True))
    f = model("cummax", {"axis": 1, "reverse": True}, [grounded(x)], np.float32)
    assert f is not None and np.array_equal(f.centre, got.astype(np.float64))
    assert REGISTRY["cummax"].placing and REGISTRY["cumsum"].kind == "op"


def _scatter_eqn(fn: Any, *args: Any) -> Any:
    closed = jax.make_jaxpr(fn)(*args)
    return next(e for e in closed.jaxpr.eqns if e.primitive.name == "scatter-add")


@pytest.mark.parametrize("mode", ["drop", "clip"])
def test_a_scatter_add_of_duplicate_indices_in_any_order_lies_within_its_model(mode: str) -> None:
    """An embedding's gradient: rows of updates summed onto the rows their tokens name,
    repeated tokens in whatever order; an index out of bounds dropped or clamped."""
    rng = np.random.default_rng(11)
    table = rng.standard_normal((10, 6)).astype(np.float32)
    tokens = rng.integers(0, 10, 300).astype(np.int32)
    tokens[:3] = [12, -4, 9]  # out of bounds: dropped, or clamped to the edge rows
    rows = rng.standard_normal((300, 6)).astype(np.float32)

    def add(t: Any, i: Any, u: Any) -> Any:
        return t.at[i].add(u, mode=mode)

    eqn = _scatter_eqn(add, table, tokens, rows)
    args = [jnp.asarray(table), jnp.asarray(tokens)[:, None], jnp.asarray(rows)]
    got = np.asarray(eqn.primitive.bind(*args, **eqn.params))
    f = model("scatter-add", eqn.params, [grounded(a) for a in args], np.float32)
    assert f is not None and f.depth >= 30  # ~30 updates a row
    assert within(got, f, np.float32)[0]
    # The same rows summed in another order, one at a time in float32.
    kept = np.clip(tokens, 0, 9) if mode == "clip" else tokens
    order = rng.permutation(300)
    other = table.copy()
    for j in order:
        if 0 <= kept[j] < 10:
            other[kept[j]] += rows[j]
    assert within(other, f, np.float32)[0]
    exact = table.astype(np.float64)
    np.add.at(exact, kept[(kept >= 0) & (kept < 10)], rows[(kept >= 0) & (kept < 10)])
    assert np.allclose(f.centre, exact, rtol=0, atol=1e-12)
    moved = got.astype(np.float64)
    moved[4, 2] += 2 * allowed(f, np.float32)[4, 2]
    assert not within(moved.astype(np.float32), f, np.float32)[0]


def test_the_embedding_gradients_scatter_is_modelled() -> None:
    table = jnp.ones((10, 4))
    tokens = jnp.array([1, 2, 1, 3])
    closed = jax.make_jaxpr(jax.grad(lambda e: jnp.sum(e[tokens] * 2)))(table)
    eqn = next(e for e in closed.jaxpr.eqns if e.primitive.name == "scatter-add")
    env = [np.zeros((10, 4), np.float32), np.array([[1], [2], [1], [3]]), np.full((4, 4), 2.0)]
    f = model("scatter-add", eqn.params, [grounded(a) for a in env], np.float32)
    assert f is not None and f.centre[1, 0] == 4.0 and f.depth == 2


#: Gathers as jax writes them: rows by token (an embedding), one element per row along an
#: axis (`take_along_axis`: batching dimensions), a window of rows, out of bounds filled
#: or clamped.
GATHERS = {
    "rows": (lambda x, i: x[i], np.array([4, 0, 4, 2], np.int32)),
    "along an axis": (
        lambda x, i: lax.gather(
            x, i[..., None], lax.GatherDimensionNumbers(
                offset_dims=(), collapsed_slice_dims=(1,), start_index_map=(1,),
                operand_batching_dims=(0,), start_indices_batching_dims=(0,),
            ), slice_sizes=(1, 1), mode="fill", fill_value=np.nan,
        ),
        np.array([[0, 5], [3, 3], [1, 0], [5, 2], [4, 4], [2, 1]], np.int32),
    ),
    "windows": (lambda x, i: jax.vmap(lambda s: lax.dynamic_slice_in_dim(x, s, 2))(i),
                np.array([0, 3, 4], np.int32)),
    "filled": (lambda x, i: x.at[i].get(mode="fill", fill_value=-7.0),
               np.array([1, 9, 0], np.int32)),
    "clamped": (lambda x, i: x.at[i].get(mode="clip"), np.array([1, 9, 0], np.int32)),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(GATHERS))
def test_a_gather_moves_its_operands_elements_as_jax_does(kind: str) -> None:
    fn, idx = GATHERS[kind]
    x = np.random.default_rng(4).standard_normal((6, 6)).astype(np.float32)
    closed = jax.make_jaxpr(fn)(x, idx)
    eqn = next(e for e in closed.jaxpr.eqns if e.primitive.name == "gather")
    env = dict(zip(closed.jaxpr.invars, [jnp.asarray(x), jnp.asarray(idx)], strict=True))
    for e in closed.jaxpr.eqns:  # run to the gather, its operands as jax made them
        values = [v.val if type(v).__name__ == "Literal" else env[v] for v in e.invars]
        if e is eqn:
            break
        outs = e.primitive.bind(*values, **e.params)
        env.update(zip(e.outvars, outs if e.primitive.multiple_results else [outs], strict=True))
    got = np.asarray(eqn.primitive.bind(*values, **eqn.params))
    f = model("gather", eqn.params, [grounded(v) for v in values], np.float32)
    assert f is not None and f.centre.shape == got.shape
    assert np.array_equal(f.centre, got.astype(np.float64), equal_nan=True)
    # A new operand's bound moves with its elements.
    fresh = model("add", {}, [grounded(values[0]), grounded(values[0])], np.float32)
    assert fresh is not None
    moved = model("gather", eqn.params, [fresh, grounded(values[1])], np.float32)
    assert moved is not None and moved.depth == 1
    filled = (f.centre == -7.0) | np.isnan(f.centre)
    assert np.array_equal(moved.centre, np.where(filled, f.centre, 2 * f.centre), equal_nan=True)
