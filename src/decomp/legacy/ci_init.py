"""The pre-refactor CI-function init: a Python loop over chunks, then a stack.

Each chunk's init body is traced once per chunk, so under `jax.jit` the graph holds
`n_chunks` copies of it and compile time grows with the number of chunks. Same signature
and bit-identical result as `decomp.ci_function.init_ci_function`, kept as the live reference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
from jax import Array

from decomp.ci_function import (
    CIConfig,
    CIFunction,
    _assemble,
    _init_chunk,
    _layout,
    chunk_sites,
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
    chunks = chunk_sites(site_names, site_dims, config.sites_per_chunk)
    layout = _layout(chunks[0], site_dims)
    per_chunk = [
        _init_chunk(config, layout, jax.random.fold_in(key, i)) for i in range(len(chunks))
    ]
    params = jax.tree.map(lambda *xs: jnp.stack(xs), *per_chunk)
    return _assemble(config, chunks, layout, params)
