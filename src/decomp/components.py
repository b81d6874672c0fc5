"""SPD components: per site, `V [d_in, C]` and `U [C, d_out]` in fp32.

A site's weight `W [d_out, d_in]` is approximated by `(V @ U).T`; the remainder
`dW = W - (V @ U).T` is the weight delta. Under a component mask `m [..., C]`, a
weight-delta mask `d [...]` and a routing flag `r [...]`:

    out = ((x @ V) * m) @ U + d[..., None] * (x @ dW.T)     where r
    out = x @ W.T                                            elsewhere
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from decomp.stacked import SiteLayout


class SiteComponents(NamedTuple):
    """Components of one site: `V [d_in, C]`, `U [C, d_out]`."""

    V: Array
    U: Array


Components = dict[str, SiteComponents]


class SiteMask(NamedTuple):
    """How one site runs in a masked forward.

    `mask [..., C]` scales components; `delta [...]` (or `None`: 0) scales the weight-delta
    path; `routing [...]` bool (or `None`: everywhere) marks the positions that use the
    components at all; elsewhere the site applies its original weight.
    """

    mask: Array
    delta: Array | None = None
    routing: Array | None = None


def init_components_by_kind(
    layout: SiteLayout, site_shapes: Mapping[str, tuple[int, int]], n_components: int, *, key: Array
) -> dict[str, SiteComponents]:
    """Components for every site, stacked per kind: `V ~ N(0, 1) / sqrt(d_in)`,
    `U ~ N(0, 1) / sqrt(C)` in fp32.

    One key per V and one per U from a single split: site number `i` in canonical order
    takes keys `2i` (V) and `2i + 1` (U); each kind draws its rows under one `vmap` (flat,
    then reshaped: the same bits, and a batched draw over a flat shape compiles faster on
    XLA CPU). Row by row bit-identical to the per-site `decomp.legacy.init_components`.

    **Arguments:**

    - `layout`: which sites each kind stacks.
    - `site_shapes`: `{site: (d_in, d_out)}`.
    - `n_components`: `C` for every site.
    - `key`: a PRNG key (keyword-only).

    **Returns:** `{kind: SiteComponents(V [n_kind, d_in, C], U [n_kind, C, d_out])}`.
    """
    if n_components < 1:
        raise ValueError(f"the number of components C must be >= 1, got {n_components}")
    keys = jax.random.split(key, 2 * len(layout.names))
    out = {}
    for kind, sites in layout.kinds:
        d_in, d_out = site_shapes[sites[0]]
        pos = layout.positions(kind)
        c = n_components

        def draw(k: Array, shape: tuple[int, int]) -> Array:
            return jax.random.normal(k, (shape[0] * shape[1],), jnp.float32).reshape(shape)

        v = jax.vmap(lambda k, s=(d_in, c): draw(k, s))(keys[2 * pos]) / np.sqrt(d_in)
        u = jax.vmap(lambda k, s=(c, d_out): draw(k, s))(keys[2 * pos + 1]) / np.sqrt(c)
        out[kind] = SiteComponents(v, u)
    return out


def weight_delta(w: Array, comp: SiteComponents) -> Array:
    """`dW = W - (V @ U).T`, `[..., d_out, d_in]` (leading axes: stacked sites)."""
    return w - jnp.swapaxes(comp.V @ comp.U, -1, -2)


def site_output(x: Array, w: Array, comp: SiteComponents, site_mask: SiteMask) -> Array:
    """Output of one site under a mask.

    **Arguments:**

    - `x`: input `[..., d_in]`.
    - `w`: the original weight `[d_out, d_in]`.
    - `comp`: the site's components.
    - `site_mask`: mask `[..., C]`, delta mask `[...]`, routing `[...]`.

    **Returns:** `[..., d_out]`.
    """
    out = ((x @ comp.V) * site_mask.mask) @ comp.U
    if site_mask.delta is not None:
        out = out + site_mask.delta[..., None] * (x @ weight_delta(w, comp).T)
    if site_mask.routing is not None:
        out = jnp.where(site_mask.routing[..., None], out, x @ w.T)
    return out
