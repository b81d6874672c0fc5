"""The per-site components init of the per-site train step, as it was before the step was
stacked per site kind (`decomp.components.init_components_by_kind`)."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from decomp.components import Components, SiteComponents


def init_components(
    site_shapes: Mapping[str, tuple[int, int]], n_components: int | Mapping[str, int], *, key: Array
) -> Components:
    """Initialise components for every site.

    One key per V and one per U from a single split, in the order of `site_shapes`:
    `V ~ N(0, 1) / sqrt(d_in)`, `U ~ N(0, 1) / sqrt(C)`.

    **Arguments:**

    - `site_shapes`: `{site: (d_in, d_out)}` in canonical order.
    - `n_components`: `C` for every site, or per site.
    - `key`: a PRNG key (keyword-only).

    **Returns:** `{site: SiteComponents(V [d_in, C], U [C, d_out])}` in fp32.
    """
    names = list(site_shapes)
    keys = jax.random.split(key, 2 * len(names))
    out: Components = {}
    for i, name in enumerate(names):
        d_in, d_out = site_shapes[name]
        c = n_components if isinstance(n_components, int) else n_components[name]
        if c < 1:
            raise ValueError(f"site {name!r}: the number of components C must be >= 1, got {c}")
        v = jax.random.normal(keys[2 * i], (d_in, c), jnp.float32) / np.sqrt(d_in)
        u = jax.random.normal(keys[2 * i + 1], (c, d_out), jnp.float32) / np.sqrt(c)
        out[name] = SiteComponents(v, u)
    return out
