"""The per-site causal importances of the per-site steps, as they were before the steps
were stacked per site kind (`decomp.ci_function.causal_importances_by_kind`).

Taps, pre-activations and importances are per-site dicts `{site: [batch, seq, ...]}`. The
chunk transformer itself (`ci_pre_activations_by_position`) and `ci_lower`, `ci_upper`
are shared with the stacked form (see `decomp.legacy`): this module only regroups the
per-site taps for it.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax.numpy as jnp
from jax import Array

from decomp.ci_function import CIFunction, ci_lower, ci_pre_activations_by_position, ci_upper


def _check_taps(ci: CIFunction, taps: Mapping[str, Array]) -> tuple[int, int]:
    missing = [s for s in ci.site_names if s not in taps]
    if missing:
        raise ValueError(
            f"taps lack {len(missing)} site input(s) the CI function reads: {missing[:5]}; "
            "read every site name as a tap"
        )
    bt = None
    for j, chunk in enumerate(ci.chunks):
        for p, site in enumerate(chunk):
            shape = tuple(taps[site].shape)
            if len(shape) != 3 or shape[-1] != ci.d_ins[p]:
                raise ValueError(
                    f"tap {site!r} (chunk {j}, position {p}) has shape {shape}; expected "
                    f"[batch, seq, {ci.d_ins[p]}]"
                )
            if bt is None:
                bt = shape[:2]
            elif shape[:2] != bt:
                raise ValueError(
                    f"tap {site!r} has [batch, seq] = {list(shape[:2])}, but "
                    f"{ci.site_names[0]!r} has {list(bt)}; all taps must share them"
                )
    assert bt is not None
    return bt


def ci_pre_activations(ci: CIFunction, taps: Mapping[str, Array]) -> dict[str, Array]:
    """CI pre-activations of every site, all chunks under one vmap.

    **Arguments:**

    - `ci`: the CI function.
    - `taps`: `{site: [batch, seq, d_in]}`, the input of every site (extra keys are ignored).

    **Returns:** `{site: [batch, seq, C]}`, in canonical order (returned from a jit, a dict
    comes back in sorted-key order, as any pytree dict does).
    """
    _, seq = _check_taps(ci, taps)
    positions = [jnp.stack([taps[chunk[p]] for chunk in ci.chunks]) for p in range(len(ci.d_ins))]
    parts = ci_pre_activations_by_position(ci, positions, seq)
    return {site: parts[p][j] for j, chunk in enumerate(ci.chunks) for p, site in enumerate(chunk)}


def causal_importances(
    ci: CIFunction, taps: Mapping[str, Array]
) -> tuple[dict[str, Array], dict[str, Array]]:
    """`ci_lower` and `ci_upper` of the pre-activations of every site.

    **Arguments:**

    - `ci`: the CI function.
    - `taps`: `{site: [batch, seq, d_in]}`.

    **Returns:** `(lower, upper)`, each `{site: [batch, seq, C]}`.
    """
    pre = ci_pre_activations(ci, taps)
    return (
        {s: ci_lower(x) for s, x in pre.items()},
        {s: ci_upper(x) for s, x in pre.items()},
    )
