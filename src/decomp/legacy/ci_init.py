"""The pre-refactor CI-function init: a Python loop over chunks, then a stack.

Each chunk's init body is traced once per chunk, so under `jax.jit` the graph holds
`n_chunks` copies of it and compile time grows with the number of chunks. Same signature
and bit-identical result as `decomp.ci_function.init_ci_function`, kept as the live reference.
Self-contained: the chunking, the per-chunk body and its weight draw are this module's own
copies; only the `CIConfig` and `CIFunction` types are shared (see `decomp.legacy`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from decomp.ci_function import CIBlocks, CIFunction
from decomp.config import CIConfig


def _normal(key: Array, shape: tuple[int, ...]) -> Array:
    """`N(0, 1) / sqrt(fan_in)` in fp32, fan-in the last axis, drawn flat and reshaped."""
    return jax.random.normal(key, (math.prod(shape),), jnp.float32).reshape(shape) / np.sqrt(
        shape[-1]
    )


def _init_chunk(
    config: CIConfig, d_in: int, c: int, key: Array
) -> tuple[Array, Array, CIBlocks, Array, Array]:
    """One chunk's `(w_in, b_in, blocks, w_out, b_out)` from one key: one key per weight
    kind, each drawing that weight for all `n_blocks` blocks at once."""
    d, m, nb = config.d_hidden, config.d_mlp, config.n_blocks
    k_in, k_out, kq, kk, kv, ko, k_mlp_in, k_mlp_out = jax.random.split(key, 8)
    blocks = CIBlocks(
        wq=_normal(kq, (nb, d, d)),
        wk=_normal(kk, (nb, d, d)),
        wv=_normal(kv, (nb, d, d)),
        wo=_normal(ko, (nb, d, d)),
        w_mlp_in=_normal(k_mlp_in, (nb, m, d)),
        b_mlp_in=jnp.zeros((nb, m), jnp.float32),
        w_mlp_out=_normal(k_mlp_out, (nb, d, m)),
        b_mlp_out=jnp.zeros((nb, d), jnp.float32),
    )
    return (
        _normal(k_in, (d, d_in)),
        jnp.zeros((d,), jnp.float32),
        blocks,
        _normal(k_out, (c, d)),
        jnp.zeros((c,), jnp.float32),
    )


def init_ci_function(
    config: CIConfig,
    site_names: Sequence[str],
    site_dims: Mapping[str, tuple[int, int]],
    *,
    key: Array,
) -> CIFunction:
    """Initialise the CI function chunk by chunk: chunk `i` from `fold_in(key, i)`, stacked.

    **Arguments:**

    - `config`: the structure.
    - `site_names`: the sites in canonical order.
    - `site_dims`: `{site: (d_in, C)}`.
    - `key`: a PRNG key (keyword-only).

    **Returns:** a `CIFunction`, bit-identical to `decomp.ci_function.init_ci_function`.
    """
    names = tuple(site_names)
    spc = config.sites_per_chunk
    if not names or len(names) % spc:
        raise ValueError(f"sites_per_chunk={spc} must divide the {len(names)} sites (at least one)")
    chunks = tuple(names[i : i + spc] for i in range(0, len(names), spc))
    layouts = {tuple(tuple(int(v) for v in site_dims[n]) for n in chunk) for chunk in chunks}
    if len(layouts) != 1:
        raise ValueError(f"chunks must be alike (same (d_in, C) per position), got {layouts}")
    layout = next(iter(layouts))
    d_ins, cs = tuple(d for d, _ in layout), tuple(c for _, c in layout)
    per_chunk = [
        _init_chunk(config, sum(d_ins), sum(cs), jax.random.fold_in(key, i))
        for i in range(len(chunks))
    ]
    w_in, b_in, blocks, w_out, b_out = jax.tree.map(lambda *xs: jnp.stack(xs), *per_chunk)
    return CIFunction(
        config=config,
        chunks=chunks,
        d_ins=d_ins,
        cs=cs,
        w_in=w_in,
        b_in=b_in,
        blocks=blocks,
        w_out=w_out,
        b_out=b_out,
    )
