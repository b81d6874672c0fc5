"""Component masks: stochastic draws, persistent sources, uniform-k routing.

A site's mask has the shape of its causal importances, `[..., C]` (`[batch, seq, C]` for
the GLU transformer, `[batch, C]` for the toys); its weight-delta mask and routing are
`[...]`. Random channels come in `C + 1`: the first `C` scale components, the last drives
the weight delta, the same layout as the persistent sources (docs/design.md, "The subject:
SPD training").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from decomp.components import SiteMask
from decomp.stacked import SiteLayout


def mask_from_draw(ci: Array, u: Array) -> SiteMask:
    """`mask = ci + (1 - ci) * u[..., :C]`, `delta = u[..., C]`.

    **Arguments:**

    - `ci`: lower causal importances `[..., C]`.
    - `u`: draws in `[0, 1]`, `[..., C + 1]`, or anything broadcastable to it (the
      persistent sources `[1, seq, C + 1]` broadcast over the batch).

    **Returns:** `SiteMask(mask [..., C], delta [...])`, fp32, no routing.
    """
    u = u.astype(jnp.float32)
    c = ci.shape[-1]
    if u.shape[-1] != c + 1:
        raise ValueError(f"draws need C + 1 = {c + 1} channels, got shape {u.shape}")
    mask = ci + (1 - ci) * u[..., :c]
    delta = jnp.broadcast_to(u[..., c], ci.shape[:-1])
    return SiteMask(mask=mask, delta=delta)


def stochastic_masks_by_kind(
    ci_lower: Mapping[str, Array], layout: SiteLayout, *, key: Array
) -> dict[str, SiteMask]:
    """One stochastic mask per site, stacked per kind: `ci_lower` is `{kind: [n_kind, ...,
    C]}` and row `l` of a kind draws `u ~ U[0, 1)` of shape `[..., C + 1]` from
    `fold_in(key, i)`, `i` the canonical position of the kind's `l`-th site: a site's draw
    does not depend on which other sites exist or on how the batch is sharded, and it is
    bit-identical, row by row, to the per-site masks (`decomp.legacy.stochastic_masks`).

    Kinds whose masks have one shape draw under one `vmap` over all their sites (one copy of
    the generator in the graph for a GLU, not one per kind), then take their rows.

    **Returns:** `{kind: SiteMask(mask [n_kind, ..., C], delta [n_kind, ...])}`.
    """
    by_shape: dict[tuple[int, ...], list[str]] = {}
    for kind, ci in ci_lower.items():
        by_shape.setdefault((*ci.shape[1:-1], ci.shape[-1] + 1), []).append(kind)
    out = {}
    for shape, kinds in by_shape.items():
        positions = np.concatenate([layout.positions(k) for k in kinds])
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.asarray(positions))
        u = jax.vmap(lambda k, shape=shape: jax.random.uniform(k, shape, jnp.float32))(keys)
        start = 0
        for kind in kinds:
            n = ci_lower[kind].shape[0]
            out[kind] = mask_from_draw(ci_lower[kind], u[start : start + n])
            start += n
    return {kind: out[kind] for kind in ci_lower}


def source_masks(
    ci_lower: Mapping[str, Array], sources: Mapping[str, Array]
) -> dict[str, SiteMask]:
    """Masks driven by persistent sources: `ci + (1 - ci) * source[..., :C]`, delta
    `source[..., C]`, every site at every position (no routing).

    **Arguments:**

    - `ci_lower`: `{site: [..., C]}`.
    - `sources`: `{site: [1, ..., C + 1]}` in `[0, 1]`, broadcast over the batch.

    **Returns:** `{site: SiteMask(mask [..., C], delta [...])}`.
    """
    return {name: mask_from_draw(ci, sources[name]) for name, ci in ci_lower.items()}


def constant_masks(ci_lower: Mapping[str, Array], mask: float, delta: float) -> dict[str, SiteMask]:
    """Every component scaled by `mask` and the weight delta by `delta` everywhere."""
    return {
        name: SiteMask(
            mask=jnp.full(ci.shape, mask, jnp.float32),
            delta=jnp.full(ci.shape[:-1], delta, jnp.float32),
        )
        for name, ci in ci_lower.items()
    }


def recon_chunks(site_names: Sequence[str], sites_per_chunk: int) -> tuple[tuple[str, ...], ...]:
    """Sites grouped into reconstruction chunks of `sites_per_chunk`, in canonical order."""
    n = len(site_names)
    if sites_per_chunk < 1 or n % sites_per_chunk:
        raise ValueError(
            f"sites_per_chunk must be >= 1 and divide the {n} sites, got {sites_per_chunk}"
        )
    names = tuple(site_names)
    return tuple(names[i : i + sites_per_chunk] for i in range(0, n, sites_per_chunk))


def route_chunk_by_kind(
    masks: Mapping[str, SiteMask],
    layout: SiteLayout,
    chunks: Sequence[Sequence[str]],
    chunk: Array | int,
    *,
    key: Array,
) -> dict[str, SiteMask]:
    """Masks for the masked forward of one reconstruction chunk, stacked per kind.

    The chunk's sites are routed by `uniform_k_routing` (one draw; the site at chunk
    position `j` reads column `j`); every other site runs its plain weight everywhere.
    `chunk` may be traced (the chunks are mapped over with one forward in the graph), so
    membership is a comparison, not a Python branch. Row `l` of a kind gets the routing its
    site gets from the per-site `decomp.legacy.route_chunk`, in two operations per kind.

    **Arguments:**

    - `masks`: `{kind: SiteMask(mask [n_kind, ..., C], delta [n_kind, ...])}`.
    - `layout`: which sites each kind stacks.
    - `chunks`: the sites of each chunk, from `recon_chunks`.
    - `chunk`: index of the chunk to route, int or int32 scalar.
    - `key`: the chunk's routing key (keyword-only).

    **Returns:** `{kind: SiteMask(mask, delta, routing [n_kind, ...])}`.
    """
    chunk_of = {name: (c, j) for c, sites in enumerate(chunks) for j, name in enumerate(sites)}
    first = next(iter(masks.values()))
    positions = first.mask.shape[1:-1]
    routed = uniform_k_routing(key, positions, len(chunks[0]))
    out = {}
    for kind, m in masks.items():
        rows = [chunk_of[s] for s in layout.sites(kind)]
        in_chunk = jnp.asarray([c for c, _ in rows], jnp.int32) == jnp.asarray(chunk)
        column = jnp.moveaxis(routed[..., np.asarray([j for _, j in rows])], -1, 0)
        routing = jnp.logical_and(in_chunk.reshape((-1,) + (1,) * len(positions)), column)
        out[kind] = m._replace(routing=routing)
    return out


def uniform_k_routing(key: Array, shape: tuple[int, ...], n_sites: int) -> Array:
    """Uniform-k subset routing.

    At every position, draw `k` uniformly from `{1, ..., n_sites}`, then a uniformly random
    subset of `k` of the `n_sites` sites (the sites whose rank in a random permutation is
    below `k`). Every position routes at least one site; every site is routed with
    probability `(n_sites + 1) / (2 * n_sites)`, none favoured by its place in the chunk.

    **Arguments:**

    - `key`: a PRNG key.
    - `shape`: the position shape, `[batch, seq]` or `[batch]`.
    - `n_sites`: the number of sites in the chunk.

    **Returns:** bool `[*shape, n_sites]`, true where the site runs through its components.
    """
    k_key, perm_key = jax.random.split(key)
    k = jax.random.randint(k_key, (*shape, 1), 1, n_sites + 1)
    ranks = jnp.argsort(jnp.argsort(jax.random.uniform(perm_key, (*shape, n_sites)), -1), -1)
    return ranks < k
