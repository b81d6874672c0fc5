"""The per-site masks of the per-site steps, as they were before the steps were stacked per
site kind (`decomp.masks`' `stochastic_masks_by_kind`, `route_chunk_by_kind`).

A site's mask has the shape of its causal importances, `[..., C]`; masks are per-site dicts
`{site: SiteMask}` in canonical order. The draw-to-mask formula (`mask_from_draw`) and the
uniform-k draw (`uniform_k_routing`) are shared with the stacked forms (see
`decomp.legacy`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
from jax import Array

from decomp.components import SiteMask
from decomp.masks import mask_from_draw, uniform_k_routing


def stochastic_masks(ci_lower: Mapping[str, Array], *, key: Array) -> dict[str, SiteMask]:
    """One stochastic mask per site.

    Site number `i` (its position in `ci_lower`, which is in canonical order) draws
    `u ~ U[0, 1)` of shape `[..., C + 1]` from `fold_in(key, i)`: a site's draw does not
    depend on which other sites exist or on how the batch is sharded. Sites of one shape
    draw under one `vmap` (the same bits as one draw per site, but one copy of the
    generator in the graph instead of one per site).

    **Arguments:**

    - `ci_lower`: `{site: [..., C]}` in canonical order.
    - `key`: a PRNG key (keyword-only).

    **Returns:** `{site: SiteMask(mask [..., C], delta [...])}`.
    """
    by_shape: dict[tuple[int, ...], list[int]] = {}
    names = list(ci_lower)
    for i, name in enumerate(names):
        ci = ci_lower[name]
        by_shape.setdefault((*ci.shape[:-1], ci.shape[-1] + 1), []).append(i)
    out = {}
    for shape, idx in by_shape.items():
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.asarray(idx))
        u = jax.vmap(lambda k, shape=shape: jax.random.uniform(k, shape, jnp.float32))(keys)
        for row, i in enumerate(idx):
            out[names[i]] = mask_from_draw(ci_lower[names[i]], u[row])
    return {name: out[name] for name in names}


def route_chunk(
    masks: Mapping[str, SiteMask],
    chunks: Sequence[Sequence[str]],
    chunk: Array | int,
    *,
    key: Array,
) -> dict[str, SiteMask]:
    """Masks for the masked forward of one reconstruction chunk.

    The chunk's sites are routed by `uniform_k_routing`; every other site runs its plain
    weight everywhere. `chunk` may be traced (the chunks are mapped over with one forward in
    the graph), so membership is a comparison, not a Python branch.

    **Arguments:**

    - `masks`: `{site: SiteMask(mask [..., C], delta [...])}` for every site.
    - `chunks`: the sites of each chunk, from `recon_chunks`.
    - `chunk`: index of the chunk to route, int or int32 scalar.
    - `key`: the chunk's routing key (keyword-only).

    **Returns:** `{site: SiteMask(mask, delta, routing [...])}`.
    """
    first = next(iter(masks.values()))
    positions = first.mask.shape[:-1]
    routed = uniform_k_routing(key, positions, len(chunks[0]))
    out = {}
    for c, sites in enumerate(chunks):
        for j, name in enumerate(sites):
            routing = jnp.logical_and(jnp.asarray(chunk) == c, routed[..., j])
            out[name] = masks[name]._replace(routing=routing)
    return out
