"""A recording's own programs (`parity.origin._executables`): each operation compiled once per
signature, computing what jax's own dispatch computes, bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings, strategies as st
from jax import lax
from jax.extend import core as jex

from parity.origin._executables import Executables


def _equations(closed, args, out):
    """Each equation of the program `closed` with its operands, run in order, into calls (an
    interpreter over jax's own dispatch: the independent path), appended to `out`; returns
    the program's results."""
    env = dict(zip(closed.jaxpr.invars, args, strict=True))
    env.update(zip(closed.jaxpr.constvars, closed.consts, strict=True))

    def read(v):
        return v.val if isinstance(v, jex.Literal) else env[v]

    for eqn in closed.jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        if eqn.primitive.name in ("pjit", "jit"):
            outs = _equations(eqn.params["jaxpr"], ins, out)
        else:
            outs = eqn.primitive.bind(*ins, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
            out.append((eqn, ins, outs))
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in closed.jaxpr.outvars]


def _model(x, w, key):
    h = jnp.tanh(x @ w + 0.5) * jax.nn.sigmoid(x @ w)
    noise = jax.random.normal(jax.random.fold_in(key, 3), h.shape)
    return jnp.cumsum(h, axis=1).sum(axis=0) / 7.0, jnp.exp(-h) + noise, jnp.argmax(h, axis=1)


def test_every_operation_equals_jaxs_own_run_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal(s).astype(np.float32) for s in ((6, 40), (40, 24)))
    run = Executables()
    seen = set()
    args = (jnp.asarray(x), jnp.asarray(w), jax.random.key(1))
    ran: list = []
    _equations(jax.make_jaxpr(_model)(*args), args, ran)
    for eqn, ins, outs in ran:
        mine = run.bind(eqn.primitive, ins, dict(eqn.params))
        mine = mine if eqn.primitive.multiple_results else [mine]
        for a, b in zip(mine, outs, strict=True):
            if jnp.issubdtype(b.dtype, jax.dtypes.extended):
                a, b = jax.random.key_data(a), jax.random.key_data(b)
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), eqn
        seen.add(eqn.primitive.name)
    # the model's operations reach every path: compiled ones, and ones jax runs its own way
    assert {"dot_general", "tanh", "cumsum", "argmax", "random_bits"} <= seen, seen
    assert 0 < len(run) < len(seen) + 10


def test_one_program_per_signature() -> None:
    run = Executables()
    a, b = jnp.ones((3, 4), jnp.float32), jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    out = run.bind(lax.add_p, [a, b], {})
    again = run.bind(lax.add_p, [b, b], {})  # other numbers, the same signature
    assert len(run) == 1
    np.testing.assert_array_equal(np.asarray(out), np.asarray(a) + np.asarray(b))
    np.testing.assert_array_equal(np.asarray(again), 2 * np.asarray(b))
    run.bind(lax.add_p, [a[:2], b[:2]], {})  # another shape
    run.bind(lax.add_p, [a, 2.0], {})  # a Python scalar: weakly typed
    run.bind(lax.add_p, [a, np.float32(2.0)], {})  # a numpy scalar: not weak
    assert len(run) == 4
    weak = run.bind(lax.add_p, [a, 3.0], {})
    assert len(run) == 4 and float(np.asarray(weak)[0, 0]) == 4.0
    run.clear()
    assert len(run) == 0


#: Each move `HOST_MOVES` makes with numpy, as jax writes it (the parameters come from jax's
#: own trace of these functions of a 2-d array).
_MOVES = {
    "slice": lambda x: lax.slice(x, (1, 0), x.shape, (2, 3)),
    "broadcast_in_dim": lambda x: lax.broadcast_in_dim(x, (2, *x.shape, 3), (1, 2)),
    "reshape": lambda x: x.reshape(x.shape[1], 1, x.shape[0]),
    "squeeze": lambda x: lax.squeeze(x, (0,)),
    "transpose": lambda x: x.T,
    "concatenate": lambda x: lax.concatenate([x, lax.rev(x, (1,)), x], 1),
    "rev": lambda x: lax.rev(x, (0, 1)),
}


def _bits(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    """An array of `dtype` whose bits are drawn at random (NaNs with payloads, infinities,
    negative zeros and subnormals included, for the float types)."""
    import ml_dtypes

    np_dtype = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    rng = np.random.default_rng(seed)
    if np_dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    raw = rng.integers(0, 256, (*shape, np_dtype.itemsize), np.uint8)
    return raw.view(np_dtype).reshape(shape)


@settings(max_examples=30, deadline=None)
@given(
    move=st.sampled_from(sorted(_MOVES)),
    rows=st.integers(1, 5),
    cols=st.integers(4, 9),
    dtype=st.sampled_from(["float32", "bfloat16", "int32", "uint32", "bool"]),
    seed=st.integers(0, 2**16),
)
def test_a_move_on_the_host_is_jaxs_program_bit_for_bit(move, rows, cols, dtype, seed) -> None:
    """Moves are made with numpy in a process with one device, and compile nothing: the
    same bits, dtype, shape and weak type as the program jax compiles for each. Not those of
    bfloat16, which XLA moves through float32 (a signalling NaN comes back quiet)."""
    shape = (1, cols) if move == "squeeze" else (rows, cols)
    x = jnp.asarray(_bits(shape, dtype, seed))
    (eqn,) = [e for e in jax.make_jaxpr(_MOVES[move])(x).eqns if e.primitive.name == move]
    ins = [jnp.asarray(_bits(v.aval.shape, dtype, seed + j)) for j, v in enumerate(eqn.invars)]
    run = Executables()
    mine = run.bind(eqn.primitive, ins, dict(eqn.params))
    theirs = jax.jit(lambda *xs: eqn.primitive.bind(*xs, **eqn.params))(*ins)
    assert isinstance(mine, jax.Array)
    assert (mine.shape, mine.dtype, mine.weak_type) == (
        theirs.shape,
        theirs.dtype,
        theirs.weak_type,
    )
    assert np.asarray(mine).tobytes() == np.asarray(theirs).tobytes()
    on_host = jax.device_count() == 1 and jax.devices()[0].platform == "cpu"
    assert len(run) == (0 if on_host and dtype != "bfloat16" else 1)


def test_a_scans_rows_and_results_are_moved_on_the_host_bit_for_bit() -> None:
    x = jnp.asarray(_bits((3, 4, 5), "float32", 7))
    run = Executables()
    parts = [run.row(x, k) for k in range(3)]
    assert all(np.asarray(p).tobytes() == np.asarray(x[k]).tobytes() for k, p in enumerate(parts))
    stacked = run.stack(parts)
    assert isinstance(stacked, jax.Array) and stacked.dtype == x.dtype
    assert np.asarray(stacked).tobytes() == np.asarray(x).tobytes()
    # The rows of a vector are scalars, and stack back into it.
    v = jnp.arange(4, dtype=jnp.int32)
    scalars = [run.row(v, k) for k in range(4)]
    assert all(s.shape == () for s in scalars)
    assert np.asarray(run.stack(scalars)).tolist() == [0, 1, 2, 3]
    squeezed = run.bind(lax.squeeze_p, [v[:1].reshape(1, 1)], {"dimensions": (0, 1)})
    assert squeezed.shape == () and int(squeezed) == 0
    # A PRNG key's rows are not plain numbers: indexed and stacked by jax.
    keys = jax.random.split(jax.random.key(0), 3)
    again = run.stack([run.row(keys, k) for k in range(3)])
    assert np.array_equal(jax.random.key_data(again), jax.random.key_data(keys))


def test_a_weakly_typed_move_or_one_with_a_parameter_numpy_does_not_read_runs_jaxs_program():
    w = lax.broadcast_in_dim(jnp.asarray(3.0), (2, 3), ())
    assert w.weak_type
    run = Executables()
    moved = run.bind(lax.transpose_p, [w], {"permutation": (1, 0)})
    assert moved.weak_type and moved.shape == (3, 2) and len(run) == 1
    # A reshape that transposes first (`dimensions`): numpy's reshape would not.
    x = jnp.arange(8, dtype=jnp.int32).reshape(2, 4)
    (eqn,) = jax.make_jaxpr(lambda x: lax.reshape(x, (4, 2), dimensions=(1, 0)))(x).eqns
    assert eqn.params["dimensions"] == (1, 0)
    mine = run.bind(eqn.primitive, [x], dict(eqn.params))
    assert np.array_equal(mine, np.asarray(x).T.reshape(4, 2)) and len(run) == 2


def test_the_two_sides_of_a_comparison_share_their_operations_programs() -> None:
    """`localise` and `assert_equivalent` record both sides with one `Executables`: the
    second side's operations of a signature the first ran hand nothing to XLA (neither a
    compile nor a load from the persistent cache); on its own, a side hands each again."""
    from parity.machinery import _compile_count
    from parity.origin._record import record

    _compile_count.install()

    def handed() -> int:  # programs handed to XLA: compiled, or loaded from the cache
        counts = _compile_count.counts()
        return counts.compiled + counts.loaded

    w = jnp.asarray(np.random.default_rng(3).standard_normal((7, 5)), jnp.float32)

    def new(x):
        return jnp.tanh(x @ w) * 2.0 + jnp.sum(x)

    def old(x):  # another function, the same operations
        return jnp.tanh(x @ w) * 2.0 + jnp.sum(x)

    x = jnp.ones((3, 7), jnp.float32)
    shared = Executables()
    before = handed()
    record(new, x, executables=shared)
    first = handed() - before
    record(old, x, executables=shared)
    second = handed() - before - first
    record(old, x)
    alone = handed() - before - first - second
    assert first > 0 and second == 0 and alone > 0, (first, second, alone)
