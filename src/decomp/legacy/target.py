"""The per-site masked forward and weight deltas of the per-site steps, as they were before
the steps were stacked per site kind: functions of any `DecomposedModel`, over its by-kind
forms (`masked_output_by_kind`, `site_weight`).

Components and masks are per-site dicts `{site: ...}` covering every site; the masked
forward stacks them per kind (an exact regrouping) for the target's one forward.
"""

from __future__ import annotations

from collections.abc import Mapping

from jax import Array

from decomp.components import SiteComponents, SiteMask, weight_delta
from decomp.config import Remat
from decomp.model import DecomposedModel
from decomp.stacked import SiteLayout


def masked_output(
    model: DecomposedModel,
    inputs: Array,
    components: Mapping[str, SiteComponents],
    masks: Mapping[str, SiteMask],
    *,
    remat: Remat = None,
) -> Array:
    """The model's output with every site run through its components under its mask.

    **Arguments:**

    - `model`: the target.
    - `inputs`: the target's inputs (int32 tokens `[batch, seq]`, or `[batch, d_in]`
      floats).
    - `components`: `{site: SiteComponents(V [d_in, C], U [C, d_out])}` for every site.
    - `masks`: `{site: SiteMask}` for every site (mask `[..., C]`, optional delta and
      routing `[...]`).
    - `remat`: `None`, or checkpoint the target's scan over blocks saving `"nothing"` or
      `"dots"` (ignored by a target without one).

    **Returns:** the output (logits `[batch, seq, vocab]`, or `[batch, d_out]`). A
    `ValueError` names the sites either mapping misses.
    """
    names = model.site_names
    for what, given in (("components", components), ("masks", masks)):
        missing = [s for s in names if s not in given]
        if missing:
            raise ValueError(
                f"{what} must cover every site; missing {len(missing)}: {', '.join(missing[:8])}"
                + (" ..." if len(missing) > 8 else "")
            )
    layout = SiteLayout.of(model)
    return model.masked_output_by_kind(
        inputs, layout.from_sites(components), layout.from_sites(masks), remat=remat
    )


def weight_deltas(
    model: DecomposedModel, components: Mapping[str, SiteComponents]
) -> dict[str, Array]:
    """`{site: W - (V @ U).T}`, each `[d_out, d_in]`, for every site in canonical order."""
    return {
        name: weight_delta(model.site_weight(name), components[name]) for name in model.site_names
    }
