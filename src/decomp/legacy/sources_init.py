"""The pre-refactor persistent-sources init: one jit, one draw and one sharded output per site.

The graph holds one copy of the uniform draw per site, so compile time grows with the number
of sites. Same signature and bits as `decomp.sources.init_sources`, kept as the live reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.sharding import Sharding

from decomp.sources import _check, _draw_site


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
