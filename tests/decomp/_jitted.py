"""A target's three forwards, each jitted once for the test modules of tests/decomp (run
eagerly, every op would compile on its own). `x`: tokens `[batch, seq]` of a GLU target, or
a toy's inputs `[batch, d_in]`; `wanted`, a tuple of tap keys, is static."""

from __future__ import annotations

import functools

import jax


@jax.jit
def clean(model, x):
    return model.clean_output(x)


@functools.partial(jax.jit, static_argnames="wanted")
def read(model, x, wanted):
    return model.read_activations(x, wanted)


@functools.partial(jax.jit, static_argnames="wanted")
def fused(model, x, wanted):
    return model.clean_output_and_activations(x, wanted)
