"""The SPD train step: one frozen forward, value-and-grad of the weighted loss, optax updates.

    clean, taps   = model.clean_output_and_taps_by_kind(inputs)           # frozen
    lower, upper  = causal_importances_by_kind(ci, taps)
    total         = sum(coefficient(config) * loss(inputs) for each row of SPD_LOSSES)
                  = fc * faithfulness(dW) + ic * importance(upper, p)
                  + sc * stochastic_recon(lower) + pc * pgd_recon(lower, sources)

Components take clipped AdamW, the CI function AdamW; the ascended sources are the next
step's persistent sources. The model is any `decomp.model.DecomposedModel`: the step calls
its by-kind forms and asks it, never its class, whether positions carry a seq axis
(`has_seq_axis`: taps without one get a seq axis of 1 for the CI function) and how to
compare outputs (`divergence`: KL of logits for the GLU transformer, mean squared error
for the toys). See docs/design.md, "The subject: SPD training".

Inside the step, everything per site is stacked per site kind on a leading layer axis
(`decomp.stacked`): components, optimizer states, sources, taps, masks, causal importances
and weight deltas are `{kind: [n_kind, ...]}`, so the program holds a constant number of
operations whatever the depth. `TrainState.site_components` and `TrainState.site_sources`
are the per-site views. The per-site step this replaced is `decomp.legacy.train`, the live
reference.
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

from decomp.ci_function import CIFunction, causal_importances_by_kind, init_ci_function
from decomp.components import Components, SiteComponents, SiteMask, init_components_by_kind
from decomp.config import SPDConfig
from decomp.jitted import JittedStep, jit_step
from decomp.losses import SPD_LOSSES, LossInputs
from decomp.mesh import make_dp_mesh, replicate, replicated
from decomp.model import DecomposedModel
from decomp.sources import init_sources_by_kind
from decomp.stacked import SiteLayout, gather_rows, sum_in_order

#: The loss terms, in the order metrics report them (`decomp.losses.SPD_LOSSES`' names).
TERMS = tuple(term.name for term in SPD_LOSSES)


class TrainState(eqx.Module):
    """Everything a train step updates, per-site data stacked per kind.

    - `components`: `{kind: SiteComponents(V [n_kind, d_in, C], U [n_kind, C, d_out])}`.
    - `ci`: the CI function.
    - `opt_state_components`, `opt_state_ci`: optax states (of the stacked components).
    - `sources`: `{kind: [n_kind, 1, seq, C + 1]}` in `SPDConfig.sources_dtype` (toys:
      seq 1).
    - `step`: int32 scalar, the number of steps taken.
    - `layout` (static): which sites each kind stacks.
    """

    components: dict[str, SiteComponents]
    ci: CIFunction
    opt_state_components: Any
    opt_state_ci: Any
    sources: dict[str, Array]
    step: Array
    layout: SiteLayout = eqx.field(static=True)

    def site_components(self) -> Components:
        """`{site: SiteComponents(V [d_in, C], U [C, d_out])}` in canonical order."""
        return self.layout.to_sites(self.components)

    def site_sources(self) -> dict[str, Array]:
        """`{site: [1, seq, C + 1]}` in canonical order."""
        return self.layout.to_sites(self.sources)


def site_global_norm(components: Mapping[str, SiteComponents], layout: SiteLayout) -> Array:
    """The global L2 norm of components stacked per kind, summed as `optax.tree.norm` sums
    the per-site tree `{site: SiteComponents}`: each leaf (a site's V, then its U, sites in
    sorted-name order, as a dict pytree orders them) squared and summed on its own, then
    the leaves added one at a time. A constant number of operations per kind, and the same
    bits as the per-site step's norm."""
    where = layout.where()
    fields = SiteComponents._fields
    per_row = {
        (kind, f): jnp.sum(jnp.square(x), axis=tuple(range(1, x.ndim)))
        for kind, comp in components.items()
        for f, x in zip(fields, comp, strict=True)
    }
    picks = [((where[s][0], f), where[s][1]) for s in sorted(layout.names) for f in fields]
    return jnp.sqrt(sum_in_order(gather_rows(per_row, picks)))


def clip_by_site_global_norm(max_norm: float, layout: SiteLayout) -> optax.GradientTransformation:
    """`optax.clip_by_global_norm` for components stacked per kind, with the norm of
    `site_global_norm`: the clip (and so every update) is bit-identical to the per-site
    step's."""

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        del params
        g_norm = site_global_norm(updates, layout)
        keep = g_norm < max_norm
        return jax.tree.map(
            lambda t: jax.lax.select(keep, t, (t / g_norm.astype(t.dtype)) * max_norm), updates
        ), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def component_optimizer(config: SPDConfig, layout: SiteLayout) -> optax.GradientTransformation:
    """Global-norm clip at `grad_clip` (`clip_by_site_global_norm`), then AdamW."""
    return optax.chain(
        clip_by_site_global_norm(config.grad_clip, layout),
        optax.adamw(config.lr_components, weight_decay=config.weight_decay),
    )


def ci_optimizer(config: SPDConfig) -> optax.GradientTransformation:
    """AdamW, unclipped."""
    return optax.adamw(config.lr_ci, weight_decay=config.weight_decay)


@functools.lru_cache(maxsize=16)
def _param_init(
    config: SPDConfig,
    layout: SiteLayout,
    shapes: tuple[tuple[str, tuple[int, int]], ...],
    mesh: Mesh,
) -> Callable[[Array, Array], tuple[dict[str, SiteComponents], CIFunction, Any, Any]]:
    """One jitted program for every parameter and optimiser state (not one dispatch per
    site), replicated where it is made; cached, so a second state of the same structure
    reuses the compiled program. `shapes`: `((site, (d_in, d_out)), ...)` in canonical
    order."""
    site_shapes = dict(shapes)
    c = config.n_components
    dims = {s: (site_shapes[s][0], c) for s in layout.names}

    def init_params(
        k_comp: Array, k_ci: Array
    ) -> tuple[dict[str, SiteComponents], CIFunction, Any, Any]:
        components = init_components_by_kind(layout, site_shapes, c, key=k_comp)
        ci = init_ci_function(config.ci, layout.names, dims, key=k_ci)
        opt_comp = component_optimizer(config, layout).init(components)
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
    """Fresh components, CI function, optimiser states and sources, replicated on `mesh`.

    `key` is split into three: components (`init_components_by_kind`), CI function
    (`init_ci_function`), sources (`init_sources_by_kind`): each bit-identical, site by
    site, to the per-site init of `decomp.legacy.train`.

    **Arguments:**

    - `model`: the target (GLU transformer or toy).
    - `config`: the SPD configuration.
    - `key`: a PRNG key (keyword-only).
    - `seq_len`: the training sequence length `T` (required for sequence targets; toys take
      `None` or 1).
    - `mesh`: where to replicate the state (default: every visible device).

    **Returns:** a `TrainState` at step 0.
    """
    names = tuple(model.site_names)
    config.check_sites(names)
    t = _sources_seq_len(model, seq_len)
    c = config.n_components
    shapes = model.site_shapes()
    k_comp, k_ci, k_src = jax.random.split(key, 3)
    mesh = make_dp_mesh() if mesh is None else mesh
    layout = SiteLayout.of(model)
    init = _param_init(config, layout, tuple((s, shapes[s]) for s in names), mesh)
    components, ci, opt_comp, opt_ci = init(k_comp, k_ci)
    sources = init_sources_by_kind(
        layout, c, t, key=k_src, dtype=config.sources_jnp_dtype, sharding=replicated(mesh)
    )
    state = TrainState(
        components=components,
        ci=ci,
        opt_state_components=opt_comp,
        opt_state_ci=opt_ci,
        sources=sources,
        step=jnp.zeros((), jnp.int32),
        layout=layout,
    )
    return replicate(state, mesh)


def _sources_seq_len(model: DecomposedModel, seq_len: int | None) -> int:
    """The sources' seq length: `seq_len` for a target with a seq axis, 1 for one without."""
    if model.has_seq_axis:
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(
                f"seq_len must be a positive int for a sequence target, got {seq_len!r}"
            )
        return seq_len
    if seq_len not in (None, 1):
        raise ValueError(f"toy targets have no seq axis: seq_len must be None or 1, got {seq_len}")
    return 1


# --- the step ------------------------------------------------------------------------------


def _bind_forward(
    model: DecomposedModel, inputs: Array, config: SPDConfig
) -> Callable[[Any, Mapping[str, SiteMask]], Array]:
    return lambda comps, masks: model.masked_output_by_kind(
        inputs, comps, masks, remat=config.remat
    )


def frozen_forward(model: DecomposedModel, inputs: Array) -> tuple[Array, dict[str, Array]]:
    """Clean output and every site's input, `{kind: [n_kind, ...]}`, from one forward,
    under `stop_gradient`."""
    clean, taps = model.clean_output_and_taps_by_kind(inputs)
    return jax.lax.stop_gradient((clean, taps))


def importances(
    ci: CIFunction, taps: Mapping[str, Array], layout: SiteLayout, *, has_seq_axis: bool
) -> tuple[dict[str, Array], dict[str, Array]]:
    """`causal_importances_by_kind` for taps with (`[n, b, t, d]`) or without (`[n, b, d]`)
    a seq axis (the target's `has_seq_axis`); the results have the taps' position shape:
    `{kind: [n, b, t, C]}` or `{kind: [n, b, C]}`. The CI function reads a seq axis, so
    taps without one get a seq axis of 1 on the way in."""
    if has_seq_axis:
        return causal_importances_by_kind(ci, taps, layout)
    lower, upper = causal_importances_by_kind(
        ci, {k: x[:, :, None] for k, x in taps.items()}, layout
    )
    return {k: x[:, :, 0] for k, x in lower.items()}, {k: x[:, :, 0] for k, x in upper.items()}


def _check_sources(
    sources: Mapping[str, Array], ci_lower: Mapping[str, Array], has_seq_axis: bool
) -> None:
    for kind, ci in ci_lower.items():
        # `[n, 1, seq, C + 1]` against `[n, batch, seq, C]`; no seq axis: `[n, 1, 1, C + 1]`
        # against `[n, b, C]`.
        n, c = ci.shape[0], ci.shape[-1]
        want = (n, 1, *ci.shape[2:-1], c + 1) if has_seq_axis else (n, 1, 1, c + 1)
        if tuple(sources[kind].shape) != want:
            raise ValueError(
                f"sources[{kind!r}] has shape {tuple(sources[kind].shape)}, expected {want} "
                "(the sources' seq length must equal the inputs'; init the state with "
                "seq_len equal to the training sequence length)"
            )


def spd_losses(
    model: DecomposedModel,
    config: SPDConfig,
    params: tuple[dict[str, SiteComponents], CIFunction],
    sources: Mapping[str, Array],
    clean: Array,
    taps: Mapping[str, Array],
    inputs: Array,
    p: Array,
    layout: SiteLayout,
    *,
    key: Array,
) -> tuple[Array, tuple[dict[str, Array], dict[str, Array]]]:
    """The weighted total and its terms, for `jax.value_and_grad` over `params`.

    **Arguments:**

    - `model`, `config`: the target and the SPD configuration.
    - `params`: `(components, ci)`, what the gradient is taken of; components per kind.
    - `sources`: `{kind: [n_kind, 1, seq, C + 1]}`, any float dtype.
    - `clean`, `taps`: from `frozen_forward`.
    - `inputs`: the batch the masked forwards run on.
    - `p`: the importance exponent.
    - `layout`: which sites each kind stacks.
    - `key`: the stochastic masks' key (keyword-only).

    **Returns:** `(total, (terms, new sources))`; terms in `TERMS`, fp32 scalars, a term of
    weight 0 not computed and reported as 0; new sources `{kind: [n_kind, 1, seq, C + 1]}`
    fp32 (the given ones when PGD is off).
    """
    components, ci = params
    seq = model.has_seq_axis
    lower, upper = importances(ci, taps, layout, has_seq_axis=seq)
    forward = _bind_forward(model, inputs, config)
    _check_sources(sources, lower, seq)
    # No seq axis: the sources' seq axis of 1 is dropped so they broadcast over `[n, batch, C + 1]`.
    src = {k: (v if seq else v[:, :, 0]) for k, v in sources.items()}
    zero = jnp.zeros((), jnp.float32)
    terms: dict[str, Array] = dict.fromkeys(TERMS, zero)
    new_src = {k: v.astype(jnp.float32) for k, v in src.items()}
    x = LossInputs(model, config, components, lower, upper, clean, forward, src, p, layout, key)
    for term in SPD_LOSSES:
        if term.coefficient(config):
            value, moved = term.loss(x)
            terms[term.name] = value
            new_src = new_src if moved is None else moved
    total = sum(
        (
            term.coefficient(config) * terms[term.name]
            for term in SPD_LOSSES
            if term.coefficient(config)
        ),
        zero,
    )
    if not seq:
        new_src = {k: v[:, :, None] for k, v in new_src.items()}
    return total, (terms, new_src)


def _train_step(
    config: SPDConfig, model: DecomposedModel, state: TrainState, inputs: Array, key: Array
) -> tuple[TrainState, dict[str, Array]]:
    clean, taps = frozen_forward(model, inputs)
    p = config.p_at(state.step)

    def loss_fn(params: tuple[dict[str, SiteComponents], CIFunction]) -> tuple[Array, Any]:
        return spd_losses(
            model, config, params, state.sources, clean, taps, inputs, p, state.layout, key=key
        )

    (total, (terms, new_src)), (g_comp, g_ci) = jax.value_and_grad(loss_fn, has_aux=True)(
        (state.components, state.ci)
    )
    upd_comp, opt_comp = component_optimizer(config, state.layout).update(
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
        layout=state.layout,
    )
    metrics = {
        "total": total,
        **terms,
        "grad_norm_components": site_global_norm(g_comp, state.layout),
        "grad_norm_ci": optax.tree.norm(g_ci),
        "p": p,
    }
    return new_state, metrics


def make_train_step(
    model: DecomposedModel, config: SPDConfig, *, mesh: Mesh | None = None, donate: bool = True
) -> JittedStep[TrainState, tuple[TrainState, dict[str, Array]]]:
    """A jitted train step, `step(state, inputs, key) -> (state, metrics)`.

    Compiled once per input shape: the model is replicated on `mesh` once and passed as an
    argument (not baked into the program as constants); the state and key are replicated,
    the inputs sharded on `dp` (explicit `in_shardings`/`out_shardings`, so the same code
    runs on 1 device and on many).

    **Arguments:**

    - `model`: the target.
    - `config`: the SPD configuration.
    - `mesh`: the data-parallel mesh (default: every visible device).
    - `donate`: donate the incoming state's buffers (keep a copy if you need it after).

    **Returns:** the step, a `decomp.jitted.JittedStep`. `inputs`: int32 tokens `[batch,
    seq]` (sequence targets) or `[batch, d_in]` floats (toys), `batch` a multiple of the
    device count; `key`: the step's PRNG key. Metrics: fp32 scalars `total`, the `TERMS`,
    `grad_norm_components`, `grad_norm_ci` (before clipping) and `p`.
    """
    return jit_step(_train_step, model, config, mesh=mesh, returns_state=True, donate=donate)
