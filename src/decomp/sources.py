"""Persistent sources for persistent-PGD reconstruction.

Per site, `U[0, 1)` of shape `[1, seq_len, C + 1]` (the last channel drives the weight
delta), one key per site from one `jax.random.split` in the mapping's order, stored in
`dtype`. Values are drawn directly in `dtype`: drawing fp32 and casting to bf16 would round
values near 1 up to exactly 1.

The init is two-stage, so that compile time does not grow with the number of sites:

1. sites are grouped by C; per group, one jit vmaps the per-site draw over the group's keys
   into a stack `[n_group, 1, seq_len, C + 1]`;
2. one jit, with the stacks donated, slices them into per-site arrays placed by `sharding`.

The legacy init (`decomp.legacy.init_sources`) draws every site separately in one jit, one
copy of the draw per site. Both give the same bits.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from decomp.stacked import SiteLayout

#: The slicing jit donates the stacks so that XLA may reuse their buffers for the outputs.
#: jax 0.10 only takes a donation when some output has the stack's element count (a group of
#: one site); otherwise it drops the donation and warns. That is expected here, not a bug in
#: the caller, so the warning is silenced for this one call.
_UNUSED_DONATION = "Some donated buffers were not usable"


def _check(site_cs: Mapping[str, int], seq_len: int, dtype: Any) -> np.dtype:
    if not site_cs:
        raise ValueError("site_cs is empty: persistent sources need at least one site")
    bad = {s: c for s, c in site_cs.items() if isinstance(c, bool) or int(c) != c or c < 1}
    if bad:
        raise ValueError(f"every site's C must be a positive int; got {bad}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
    dt = jnp.dtype(dtype)
    if not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(f"dtype must be a floating dtype (float32, bfloat16), got {dt}")
    return dt


def _draw_site(key: Array, c: int, seq_len: int, dtype: np.dtype) -> Array:
    """One site's sources, `U[0, 1)` of shape `[1, seq_len, c + 1]` in `dtype`.

    Drawn flat and reshaped (the same bits as drawing the shape directly): under vmap, XLA
    CPU compiles a batched draw over a flat shape several times faster.
    """
    return jax.random.uniform(key, (seq_len * (c + 1),), dtype).reshape(1, seq_len, c + 1)


class _Group(NamedTuple):
    """Sites sharing one C: their positions in the mapping's order."""

    c: int
    indices: tuple[int, ...]


def _groups(site_cs: Mapping[str, int]) -> tuple[_Group, ...]:
    by_c: dict[int, list[int]] = {}
    for i, c in enumerate(site_cs.values()):
        by_c.setdefault(int(c), []).append(i)
    return tuple(_Group(c, tuple(idx)) for c, idx in by_c.items())


def _stack_group(
    key: Array, *, n_sites: int, group: _Group, seq_len: int, dtype: np.dtype
) -> Array:
    """Stage 1: `[len(group.indices), 1, seq_len, group.c + 1]`, row `r` being site
    `group.indices[r]`'s sources, drawn from its key in the one split of `key`."""
    keys = jax.random.split(key, n_sites)[np.asarray(group.indices)]
    return jax.vmap(lambda k: _draw_site(k, group.c, seq_len, dtype))(keys)


def _fan_out(stacks: tuple[Array, ...], *, picks: tuple[tuple[int, int], ...]) -> tuple[Array, ...]:
    """Stage 2: per site, in the mapping's order, row `r` of stack `g` for `(g, r)` in
    `picks`."""
    return tuple(stacks[g][r] for g, r in picks)


def _stack_sharding(sharding: Sharding) -> Sharding:
    """Where the stacks live: replicated over the devices of `sharding`, so the slicing jit
    runs on one device set and each output shard is a local slice."""
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, PartitionSpec())
    if sharding.is_fully_replicated:
        return sharding
    raise ValueError(
        f"sharding must be a NamedSharding or fully replicated, got {sharding!r}; "
        "pass NamedSharding(mesh, PartitionSpec())"
    )


class _Plan(NamedTuple):
    """The jits of the two-stage init and their static arguments (the benchmark lowers
    them one by one)."""

    stage_one: tuple[tuple[Any, dict[str, Any]], ...]
    fan_out: tuple[Any, dict[str, Any]]


def _plan(
    site_cs: Mapping[str, int], seq_len: int, dtype: np.dtype, sharding: Sharding | None
) -> _Plan:
    groups = _groups(site_cs)
    stack_kw: dict[str, Any] = {}
    out_kw: dict[str, Any] = {}
    if sharding is not None:
        stack_kw["out_shardings"] = _stack_sharding(sharding)
        out_kw["out_shardings"] = sharding
    stage_one = jax.jit(
        _stack_group, static_argnames=("n_sites", "group", "seq_len", "dtype"), **stack_kw
    )
    fan_out = jax.jit(_fan_out, static_argnames=("picks",), donate_argnums=0, **out_kw)
    row = {i: (g, r) for g, grp in enumerate(groups) for r, i in enumerate(grp.indices)}
    picks = tuple(row[i] for i in range(len(site_cs)))
    n = len(site_cs)
    return _Plan(
        stage_one=tuple(
            (stage_one, {"n_sites": n, "group": g, "seq_len": seq_len, "dtype": dtype})
            for g in groups
        ),
        fan_out=(fan_out, {"picks": picks}),
    )


def init_sources(
    site_cs: Mapping[str, int],
    seq_len: int,
    *,
    key: Array,
    dtype: Any = jnp.float32,
    sharding: Sharding | None = None,
) -> dict[str, Array]:
    """Persistent sources of every site, two-stage (stack per C group, then fan out).

    **Arguments:**

    - `site_cs`: `{site: C}` in canonical order; the order fixes which key each site gets.
    - `seq_len`: `T`.
    - `key`: a PRNG key (keyword-only), split once into one key per site.
    - `dtype`: storage dtype, e.g. `jnp.float32` or `jnp.bfloat16`; drawn directly in it.
    - `sharding`: placement of every per-site array, e.g. `NamedSharding(mesh, P())`; `None`
      for jax's default device. A `NamedSharding`, or any fully replicated sharding.

    **Returns:** `{site: [1, seq_len, C + 1]}` in `[0, 1)`, bit-identical to
    `decomp.legacy.init_sources`.
    """
    dt = _check(site_cs, seq_len, dtype)
    plan = _plan(site_cs, seq_len, dt, sharding)
    stacks = tuple(fn(key, **kw) for fn, kw in plan.stage_one)
    fan_out, kw = plan.fan_out
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_UNUSED_DONATION)
        outs = fan_out(stacks, **kw)
    return dict(zip(site_cs, outs, strict=True))


def _stacked_draws(
    key: Array, *, layout: SiteLayout, c: int, seq_len: int, dtype: np.dtype
) -> dict[str, Array]:
    keys = jax.random.split(key, len(layout.names))
    return {
        kind: jax.vmap(lambda k: _draw_site(k, c, seq_len, dtype))(keys[layout.positions(kind)])
        for kind, _ in layout.kinds
    }


def init_sources_by_kind(
    layout: SiteLayout,
    n_components: int,
    seq_len: int,
    *,
    key: Array,
    dtype: Any = jnp.float32,
    sharding: Sharding | None = None,
) -> dict[str, Array]:
    """Persistent sources stacked per kind, `{kind: [n_kind, 1, seq_len, C + 1]}`: row `l`
    of a kind is bit-identical to `init_sources`' array of the kind's `l`-th site (site `i`
    in canonical order keeps key `i` of the one split), from one jit with one vmapped draw
    per kind.

    **Arguments:** as for `init_sources`, with `layout` (`decomp.stacked.SiteLayout`) in place of
    the per-site `C`s (every site has `n_components`); `sharding` places every stack.
    """
    dt = _check(dict.fromkeys(layout.names, n_components), seq_len, dtype)
    kw: dict[str, Any] = {} if sharding is None else {"out_shardings": sharding}
    draw = jax.jit(_stacked_draws, static_argnames=("layout", "c", "seq_len", "dtype"), **kw)
    return draw(key, layout=layout, c=n_components, seq_len=seq_len, dtype=dt)
