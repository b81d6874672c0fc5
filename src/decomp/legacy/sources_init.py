"""The pre-refactor persistent-sources init: one jit, one draw and one sharded output per site.

The graph holds one copy of the uniform draw per site, so compile time grows with the number
of sites. Same signature and bits as `decomp.sources.init_sources`, kept as the live reference.
Self-contained: the argument checks and the per-site draw are this module's own copies, so an
edit to the two-stage init cannot change its reference (see `decomp.legacy`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.sharding import Sharding


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
    """One site's sources, `U[0, 1)` of shape `[1, seq_len, c + 1]`, drawn directly in
    `dtype` (drawing fp32 and casting to bf16 would round values near 1 up to 1), flat and
    reshaped (the same bits as drawing the shape directly)."""
    return jax.random.uniform(key, (seq_len * (c + 1),), dtype).reshape(1, seq_len, c + 1)


def _draw_all(
    key: Array, *, site_cs: tuple[tuple[str, int], ...], seq_len: int, dtype: np.dtype
) -> dict[str, Array]:
    keys = jax.random.split(key, len(site_cs))
    return {name: _draw_site(keys[i], c, seq_len, dtype) for i, (name, c) in enumerate(site_cs)}


def _jit(site_cs: Mapping[str, int], sharding: Sharding | None) -> Any:
    kw: dict[str, Any] = {}
    if sharding is not None:
        kw["out_shardings"] = {name: sharding for name in site_cs}
    return jax.jit(_draw_all, static_argnames=("site_cs", "seq_len", "dtype"), **kw)


def init_sources(
    site_cs: Mapping[str, int],
    seq_len: int,
    *,
    key: Array,
    dtype: Any = jnp.float32,
    sharding: Sharding | None = None,
) -> dict[str, Array]:
    """Persistent sources of every site, each drawn separately in one jit.

    **Arguments:**

    - `site_cs`: `{site: C}` in canonical order; the order fixes which key each site gets.
    - `seq_len`: `T`.
    - `key`: a PRNG key (keyword-only), split once into one key per site.
    - `dtype`: storage dtype, e.g. `jnp.float32` or `jnp.bfloat16`; drawn directly in it.
    - `sharding`: placement of every per-site array, or `None` for jax's default device.

    **Returns:** `{site: [1, seq_len, C + 1]}` in `[0, 1)`, bit-identical to
    `decomp.sources.init_sources`.
    """
    dt = _check(site_cs, seq_len, dtype)
    out = _jit(site_cs, sharding)(
        key, site_cs=tuple((s, int(c)) for s, c in site_cs.items()), seq_len=seq_len, dtype=dt
    )
    # jit returns dicts in sorted-key order; give them back in the canonical order.
    return {name: out[name] for name in site_cs}
