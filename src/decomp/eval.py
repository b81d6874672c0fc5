"""The SPD eval step: masked runs against the clean run, and L0 per site.

Mask modes (every site at every position, no routing):

| mode          | component mask `m`            | weight-delta mask `d` |
|---------------|-------------------------------|-----------------------|
| `ci_masked`   | `ci_lower`                    | 0                     |
| `unmasked`    | 1                             | 1 (the original model)|
| `stochastic`  | `ci + (1 - ci) * u`           | `u` (last channel)    |
| `random`      | `u`                           | 0                     |
| `rounded`     | `ci_lower > 0.5`              | 0                     |
| `zero_masked` | 0                             | 0 (sites output 0)    |

`u ~ U[0, 1)` per site as in training (`masks.stochastic_masks_by_kind`), from two keys
split off the step's key. As in the train step, everything per site is stacked per kind on a
leading layer axis (`decomp.stacked`); only the `l0/{site}` metrics are per site. The
per-site step this replaced is `decomp.legacy.eval`. Metrics are named by the target's
`divergence_name`: sequence targets (`has_seq_axis`) report `kl/{mode}`
(KL of clean against masked logits, averaged over positions) and `ce_diff/{mode}`
(next-token cross-entropy of the masked logits minus that of the clean ones, plus
`ce/clean`); the toys, whose outputs are not logits, report `mse/{mode}` and no
cross-entropy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
from jax import Array
from jax.sharding import Mesh

from decomp.components import SiteMask
from decomp.config import SPDConfig
from decomp.jitted import JittedStep, jit_step
from decomp.masks import constant_masks, stochastic_masks_by_kind
from decomp.model import DecomposedModel
from decomp.stacked import SiteLayout
from decomp.train import TrainState, frozen_forward, importances

#: The masked runs, in the order the eval step computes them.
MODES = ("ci_masked", "unmasked", "stochastic", "random", "rounded", "zero_masked")


def next_token_ce(logits: Array, tokens: Array) -> Array:
    """Mean cross-entropy of `logits[:, :-1]` against `tokens[:, 1:]`.

    **Arguments:**

    - `logits`: `[batch, seq, vocab]`.
    - `tokens`: int `[batch, seq]`.

    **Returns:** fp32 scalar.
    """
    log_q = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(log_q, tokens[:, 1:, None], axis=-1)[..., 0]
    return -jnp.mean(picked)


def mode_masks(
    lower: Mapping[str, Array], layout: SiteLayout, *, key: Array
) -> tuple[Callable[[], dict[str, SiteMask]], ...]:
    """One mask builder per mode in `MODES`, all returning the same structure (mask and
    delta arrays, no routing), so that `lax.switch` can pick one inside a map.

    **Arguments:**

    - `lower`: `{kind: [n_kind, ..., C]}`, `ci_lower` stacked per kind.
    - `layout`: which sites each kind stacks.
    - `key`: the eval step's key (keyword-only); split into the stochastic and random keys.

    **Returns:** builders, each `() -> {kind: SiteMask(mask [n_kind, ..., C], delta
    [n_kind, ...])}`.
    """
    k_stoch, k_random = jax.random.split(key)

    def zero_delta(masks: Mapping[str, SiteMask]) -> dict[str, SiteMask]:
        return {
            s: m._replace(delta=jnp.zeros(m.mask.shape[:-1], m.mask.dtype))
            for s, m in masks.items()
        }

    def ci_masked() -> dict[str, SiteMask]:
        return {s: SiteMask(ci, jnp.zeros(ci.shape[:-1], ci.dtype)) for s, ci in lower.items()}

    def unmasked() -> dict[str, SiteMask]:
        return constant_masks(lower, 1.0, 1.0)

    def stochastic() -> dict[str, SiteMask]:
        return stochastic_masks_by_kind(lower, layout, key=k_stoch)

    def random() -> dict[str, SiteMask]:
        # `ci = 0` turns the stochastic mask into the bare draw.
        zeros = {s: jnp.zeros_like(ci) for s, ci in lower.items()}
        return zero_delta(stochastic_masks_by_kind(zeros, layout, key=k_random))

    def rounded() -> dict[str, SiteMask]:
        return {
            s: SiteMask((ci > 0.5).astype(ci.dtype), jnp.zeros(ci.shape[:-1], ci.dtype))
            for s, ci in lower.items()
        }

    def zero_masked() -> dict[str, SiteMask]:
        return constant_masks(lower, 0.0, 0.0)

    builders = {
        "ci_masked": ci_masked,
        "unmasked": unmasked,
        "stochastic": stochastic,
        "random": random,
        "rounded": rounded,
        "zero_masked": zero_masked,
    }
    return tuple(builders[m] for m in MODES)


def _eval_step(
    config: SPDConfig, model: DecomposedModel, state: TrainState, inputs: Array, key: Array
) -> dict[str, Array]:
    clean, taps = frozen_forward(model, inputs)
    sequence = model.has_seq_axis
    lower, _ = importances(state.ci, taps, state.layout, has_seq_axis=sequence)
    builders = mode_masks(lower, state.layout, key=key)

    def run(i: Array) -> tuple[Array, Array]:
        # One masked forward in the graph: the mode's masks are built inside the map by a
        # switch, so only the chosen builder runs.
        masks = jax.lax.switch(i, builders)
        out = model.masked_output_by_kind(inputs, state.components, masks, remat=None)
        div = model.divergence(clean, out)
        return div, (next_token_ce(out, inputs) if sequence else jnp.zeros((), jnp.float32))

    divs, ces = jax.lax.map(run, jnp.arange(len(MODES)))
    metrics: dict[str, Array] = {}
    ce_clean = next_token_ce(clean, inputs) if sequence else None
    if ce_clean is not None:
        metrics["ce/clean"] = ce_clean
    for i, mode in enumerate(MODES):
        metrics[f"{model.divergence_name}/{mode}"] = divs[i]
        if ce_clean is not None:
            metrics[f"ce_diff/{mode}"] = ces[i] - ce_clean
    per_kind = {
        k: jnp.mean(
            jnp.sum(ci > config.l0_threshold, axis=-1, dtype=jnp.float32),
            axis=tuple(range(1, ci.ndim - 1)),
        )
        for k, ci in lower.items()
    }
    l0 = state.layout.canonical(per_kind)
    metrics.update({f"l0/{s}": l0[i] for i, s in enumerate(state.layout.names)})
    metrics["l0/total"] = jnp.sum(l0)
    return metrics


def make_eval_step(
    model: DecomposedModel, config: SPDConfig, *, mesh: Mesh | None = None
) -> JittedStep[TrainState, dict[str, Array]]:
    """A jitted eval step, `eval_step(state, inputs, key) -> metrics`.

    Sharded as the train step: model and state replicated, inputs on `dp`.

    **Arguments:**

    - `model`: the target.
    - `config`: the SPD configuration (`l0_threshold`).
    - `mesh`: the data-parallel mesh (default: every visible device).

    **Returns:** the step; metrics are a flat dict of fp32 scalars: `kl/{mode}`,
    `ce_diff/{mode}` and `ce/clean` (sequence targets) or `mse/{mode}` (toys), for each
    mode in `MODES`; `l0/{site}` (mean number of components with `ci_lower >
    l0_threshold` per position) and `l0/total`.
    """
    return jit_step(_eval_step, model, config, mesh=mesh, returns_state=False)
