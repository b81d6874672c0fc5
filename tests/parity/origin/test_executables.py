"""A recording's own programs (`parity.origin._executables`): each operation compiled once per
signature, computing what jax's own dispatch computes, bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
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
