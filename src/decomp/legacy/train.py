"""The per-site SPD train step, as it was before the step was stacked per site kind
(`decomp.train`): the live reference of the new-vs-legacy differentials.

Components, masks, importances, sources and optimizer state are per-site dicts
`{site: ...}` throughout, so the program holds one copy of that work per site.

The step: one frozen forward, value-and-grad of the weighted loss, optax updates.

    clean, taps   = model.clean_output_and_activations(inputs, sites)     # frozen
    lower, upper  = causal_importances(ci, taps)
    total         = fc * faithfulness(dW) + ic * importance(upper, p)
                  + sc * stochastic_recon(lower) + pc * pgd_recon(lower, sources)

Components take clipped AdamW, the CI function AdamW; the ascended sources are the next
step's persistent sources. Sequence targets (the GLU transformer: int tokens in, logits
out) compare outputs by KL; the toys (float inputs `[batch, d]`, real outputs) by mean
squared error, and their taps get a seq axis of 1 for the CI function. See docs/design.md,
"The subject: SPD training".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax import Array
from jax.sharding import Mesh

from decomp.ci_function import CIFunction
from decomp.components import Components, SiteMask
from decomp.config import SPDConfig
from decomp.jitted import JittedStep, jit_step
from decomp.legacy.ci_init import init_ci_function
from decomp.legacy.components import init_components
from decomp.legacy.importances import causal_importances
from decomp.legacy.losses import (
    Divergence,
    faithfulness_loss,
    importance_minimality_loss,
    kl_divergence,
    mse,
    pgd_recon_loss,
    stochastic_recon_loss,
)
from decomp.legacy.sources_init import init_sources
from decomp.legacy.target import masked_output, weight_deltas
from decomp.masks import recon_chunks
from decomp.mesh import make_dp_mesh, replicate, replicated
from decomp.model import DecomposedModel

#: The loss terms, in the order metrics report them.
TERMS = ("faithfulness", "importance", "stochastic_recon", "pgd_recon")


class TrainState(eqx.Module):
    """Everything a train step updates.

    - `components`: `{site: SiteComponents(V [d_in, C], U [C, d_out])}`.
    - `ci`: the CI function.
    - `opt_state_components`, `opt_state_ci`: optax states.
    - `sources`: `{site: [1, seq, C + 1]}` in `SPDConfig.sources_dtype` (toys: seq 1).
    - `step`: int32 scalar, the number of steps taken.
    """

    components: Components
    ci: CIFunction
    opt_state_components: Any
    opt_state_ci: Any
    sources: dict[str, Array]
    step: Array

    def site_components(self) -> Components:
        """The per-site view of the components (here, the components themselves; the same
        accessor as the stacked `decomp.train.TrainState`'s)."""
        return self.components

    def site_sources(self) -> dict[str, Array]:
        """The per-site view of the sources (here, the sources themselves)."""
        return self.sources


def output_divergence(model: DecomposedModel) -> Divergence:
    """KL of logits for sequence targets, mean squared error for the toys (this module's
    own copies, `decomp.legacy.losses`)."""
    return kl_divergence if model.has_seq_axis else mse


def component_optimizer(config: SPDConfig) -> optax.GradientTransformation:
    """Global-norm clip at `grad_clip`, then AdamW."""
    return optax.chain(
        optax.clip_by_global_norm(config.grad_clip),
        optax.adamw(config.lr_components, weight_decay=config.weight_decay),
    )


def ci_optimizer(config: SPDConfig) -> optax.GradientTransformation:
    """AdamW, unclipped."""
    return optax.adamw(config.lr_ci, weight_decay=config.weight_decay)


@functools.lru_cache(maxsize=16)
def _param_init(
    config: SPDConfig, layout: tuple[tuple[str, tuple[int, int]], ...], mesh: Mesh
) -> Callable[[Array, Array], tuple[Components, CIFunction, Any, Any]]:
    """One jitted program for every parameter and optimiser state (not one dispatch per
    site), replicated where it is made; cached, so a second state of the same structure
    reuses the compiled program. `layout`: `((site, (d_in, d_out)), ...)` in canonical
    order."""
    shapes = dict(layout)
    names = tuple(shapes)
    c = config.n_components
    dims = {s: (shapes[s][0], c) for s in names}

    def init_params(k_comp: Array, k_ci: Array) -> tuple[Components, CIFunction, Any, Any]:
        components = init_components(shapes, c, key=k_comp)
        ci = init_ci_function(config.ci, names, dims, key=k_ci)
        opt_comp = component_optimizer(config).init(components)
        return components, ci, opt_comp, ci_optimizer(config).init(cast(Any, ci))

    return jax.jit(init_params, out_shardings=replicated(mesh))


def init_train_state(
    model: DecomposedModel,
    config: SPDConfig,
    *,
    key: Array,
    seq_len: int | None = None,
    mesh: Mesh | None = None,
) -> TrainState:
    """Fresh per-site components, CI function, optimiser states and sources, replicated
    on `mesh`: the signature of `decomp.train.init_train_state`, and the same bits site by
    site. `key` is split into three: components (`decomp.legacy.init_components`), CI
    function (`decomp.legacy.init_ci_function`), sources (`decomp.legacy.init_sources`).
    """
    names = tuple(model.site_names)
    config.check_sites(names)
    if model.has_seq_axis:
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(
                f"seq_len must be a positive int for a sequence target, got {seq_len!r}"
            )
    elif seq_len not in (None, 1):
        raise ValueError(f"toy targets have no seq axis: seq_len must be None or 1, got {seq_len}")
    t = seq_len if model.has_seq_axis else 1
    assert t is not None
    c = config.n_components
    shapes = model.site_shapes()
    k_comp, k_ci, k_src = jax.random.split(key, 3)
    mesh = make_dp_mesh() if mesh is None else mesh
    layout = tuple((s, shapes[s]) for s in names)
    components, ci, opt_comp, opt_ci = _param_init(config, layout, mesh)(k_comp, k_ci)
    sources = init_sources(
        {s: c for s in names},
        t,
        key=k_src,
        dtype=config.sources_jnp_dtype,
        sharding=replicated(mesh),
    )
    state = TrainState(
        components=components,
        ci=ci,
        opt_state_components=opt_comp,
        opt_state_ci=opt_ci,
        sources=sources,
        step=jnp.zeros((), jnp.int32),
    )
    return replicate(state, mesh)


# --- the step ------------------------------------------------------------------------------


def _bind_forward(
    model: DecomposedModel, inputs: Array, config: SPDConfig
) -> Callable[[Any, Mapping[str, SiteMask]], Array]:
    if model.has_seq_axis:
        return lambda comps, masks: masked_output(model, inputs, comps, masks, remat=config.remat)
    # The toys have no scan over blocks: nothing to checkpoint, `remat` does not apply.
    return lambda comps, masks: masked_output(model, inputs, comps, masks)


def frozen_forward(model: DecomposedModel, inputs: Array) -> tuple[Array, dict[str, Array]]:
    """Clean output and every site-input tap from one forward, under `stop_gradient`."""
    clean, taps = model.clean_output_and_activations(inputs, model.site_names)
    return jax.lax.stop_gradient((clean, taps))


def importances(
    ci: CIFunction, taps: Mapping[str, Array], *, has_seq_axis: bool
) -> tuple[dict[str, Array], dict[str, Array]]:
    """`causal_importances` for taps with (`[b, t, d]`) or without (`[b, d]`) a seq axis
    (the target's `has_seq_axis`); the results have the taps' position shape: `{site: [b,
    t, C]}` or `{site: [b, C]}`."""
    if has_seq_axis:
        return causal_importances(ci, taps)
    lower, upper = causal_importances(ci, {s: x[:, None] for s, x in taps.items()})
    return {s: x[:, 0] for s, x in lower.items()}, {s: x[:, 0] for s, x in upper.items()}


def _check_sources(
    sources: Mapping[str, Array], ci_lower: Mapping[str, Array], has_seq_axis: bool
) -> None:
    for name, ci in ci_lower.items():
        # `[1, seq, C + 1]` against `[batch, seq, C]`; toys: `[1, 1, C + 1]` against `[b, C]`.
        c = ci.shape[-1]
        want = (1, *ci.shape[1:-1], c + 1) if has_seq_axis else (1, 1, c + 1)
        if tuple(sources[name].shape) != want:
            raise ValueError(
                f"sources[{name!r}] has shape {tuple(sources[name].shape)}, expected {want} "
                "(the sources' seq length must equal the inputs'; init the state with "
                "seq_len equal to the training sequence length)"
            )


def spd_losses(
    model: DecomposedModel,
    config: SPDConfig,
    params: tuple[Components, CIFunction],
    sources: Mapping[str, Array],
    clean: Array,
    taps: Mapping[str, Array],
    inputs: Array,
    p: Array,
    *,
    key: Array,
) -> tuple[Array, tuple[dict[str, Array], dict[str, Array]]]:
    """The weighted total and its terms, for `jax.value_and_grad` over `params`: the
    signature of `decomp.train.spd_losses` without the layout, on per-site dicts
    (`params`: `(components {site: ...}, ci)`; `sources`: `{site: [1, seq, C + 1]}`; the
    new sources likewise, fp32), the four terms one `if` each.
    """
    components, ci = params
    seq = model.has_seq_axis
    lower, upper = importances(ci, taps, has_seq_axis=seq)
    forward = _bind_forward(model, inputs, config)
    divergence = output_divergence(model)
    _check_sources(sources, lower, seq)
    # Toys: the sources' seq axis of 1 is dropped so they broadcast over `[batch, C + 1]`.
    src = {s: (v if seq else v[:, 0]) for s, v in sources.items()}
    zero = jnp.zeros((), jnp.float32)
    terms: dict[str, Array] = dict.fromkeys(TERMS, zero)
    new_src = {s: v.astype(jnp.float32) for s, v in src.items()}
    if config.faithfulness_coeff:
        terms["faithfulness"] = faithfulness_loss(weight_deltas(model, components))
    if config.importance_coeff:
        terms["importance"] = importance_minimality_loss(upper, p)
    if config.stochastic_recon_coeff:
        terms["stochastic_recon"] = stochastic_recon_loss(
            forward,
            components,
            clean,
            lower,
            recon_chunks(model.site_names, config.recon_sites_per_chunk),
            key=key,
            n_mask_samples=config.n_mask_samples,
            divergence=divergence,
        )
    if config.pgd_recon_coeff:
        terms["pgd_recon"], new_src = pgd_recon_loss(
            forward,
            components,
            clean,
            lower,
            src,
            steps=config.pgd_warmup_steps,
            lr=config.pgd_lr,
            divergence=divergence,
        )
    coeffs = {
        "faithfulness": config.faithfulness_coeff,
        "importance": config.importance_coeff,
        "stochastic_recon": config.stochastic_recon_coeff,
        "pgd_recon": config.pgd_recon_coeff,
    }
    total = sum((coeffs[t] * terms[t] for t in TERMS if coeffs[t]), zero)
    if not seq:
        new_src = {s: v[:, None] for s, v in new_src.items()}
    return total, (terms, new_src)


def _train_step(
    config: SPDConfig, model: DecomposedModel, state: TrainState, inputs: Array, key: Array
) -> tuple[TrainState, dict[str, Array]]:
    clean, taps = frozen_forward(model, inputs)
    p = config.p_at(state.step)

    def loss_fn(params: tuple[Components, CIFunction]) -> tuple[Array, Any]:
        return spd_losses(model, config, params, state.sources, clean, taps, inputs, p, key=key)

    (total, (terms, new_src)), (g_comp, g_ci) = jax.value_and_grad(loss_fn, has_aux=True)(
        (state.components, state.ci)
    )
    upd_comp, opt_comp = component_optimizer(config).update(
        g_comp, state.opt_state_components, state.components
    )
    # optax types its trees as arrays; components and the CI function are pytrees of them.
    ci = cast(Any, state.ci)
    upd_ci, opt_ci = ci_optimizer(config).update(g_ci, state.opt_state_ci, ci)
    new_state = TrainState(
        components=cast(Any, optax.apply_updates(state.components, upd_comp)),
        ci=cast(Any, optax.apply_updates(ci, upd_ci)),
        opt_state_components=opt_comp,
        opt_state_ci=opt_ci,
        sources={s: v.astype(config.sources_jnp_dtype) for s, v in new_src.items()},
        step=state.step + 1,
    )
    metrics = {
        "total": total,
        **terms,
        "grad_norm_components": optax.tree.norm(g_comp),
        "grad_norm_ci": optax.tree.norm(g_ci),
        "p": p,
    }
    return new_state, metrics


def make_train_step(
    model: DecomposedModel, config: SPDConfig, *, mesh: Mesh | None = None, donate: bool = True
) -> JittedStep[TrainState, tuple[TrainState, dict[str, Array]]]:
    """The jitted per-site train step, `step(state, inputs, key) -> (state, metrics)`: the
    signature, placement and metrics of `decomp.train.make_train_step` (both through
    `decomp.jitted.jit_step`), with `grad_norm_components` the per-site tree's norm."""
    return jit_step(_train_step, model, config, mesh=mesh, returns_state=True, donate=donate)
