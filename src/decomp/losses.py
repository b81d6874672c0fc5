"""The four SPD loss terms, each a small pure function, on per-site data stacked per kind,
and `SPD_LOSSES`, the table of them that the train step walks.

Components, masks, causal importances and sources are `{kind: [n_kind, ...]}`
(`decomp.stacked`); every loss runs a constant number of operations per kind, whatever the
depth. `MaskedForward(components, masks) -> output` is the target's masked forward
(`masked_output_by_kind`) with the inputs bound; `divergence(clean, masked) -> scalar`
compares outputs per position and averages (the target's `divergence`: `kl_divergence` for
logits, `mse` for the toys' real-valued outputs). See docs/design.md, "The subject: SPD
training".

A row of `SPD_LOSSES` is `(name, coefficient, loss)`: the metric's name, the term's weight
read from an `SPDConfig`, and `loss(LossInputs) -> TermValue`. Adding a loss is one row
(and its weight in `SPDConfig`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import Array

from decomp.components import SiteComponents, SiteMask
from decomp.config import SPDConfig
from decomp.masks import recon_chunks, route_chunk_by_kind, source_masks, stochastic_masks_by_kind
from decomp.stacked import SiteLayout, sum_in_order

if TYPE_CHECKING:
    # The targets import this module's divergences; the contract is only named here.
    from decomp.model import DecomposedModel

MaskedForward = Callable[[Any, Mapping[str, SiteMask]], Array]
Divergence = Callable[[Array, Array], Array]

#: Added to `ci_upper` before the power, so that `p < 1` has a finite gradient at 0.
IMPORTANCE_EPS = 1e-12


def faithfulness_loss(weight_deltas: Mapping[str, Array], layout: SiteLayout) -> Array:
    """`sum_sites ||dW||^2 / sum_sites numel(W)`.

    Each site's sum is taken on its own and the sites are added in canonical order, one at
    a time, as the per-site step added them: the value is bit-identical to it.

    **Arguments:**

    - `weight_deltas`: `{kind: dW [n_kind, d_out, d_in]}`.
    - `layout`: which sites each kind stacks.

    **Returns:** fp32 scalar.
    """
    per_site = {
        k: jnp.sum(jnp.square(dw.astype(jnp.float32)), axis=(-2, -1))
        for k, dw in weight_deltas.items()
    }
    count = sum(dw.size for dw in weight_deltas.values())
    return sum_in_order(layout.canonical(per_site)) / count


def importance_minimality_loss(
    ci_upper: Mapping[str, Array],
    p: Array | float,
    layout: SiteLayout,
    *,
    eps: float = IMPORTANCE_EPS,
) -> Array:
    """`sum_sites sum_c (ci_upper + eps)^p`, averaged over positions.

    **Arguments:**

    - `ci_upper`: `{kind: [n_kind, ..., C]}`, non-negative.
    - `p`: the exponent (annealed by the caller).
    - `layout`: which sites each kind stacks (the sites are summed in canonical order).
    - `eps`: keeps the gradient finite at 0 for `p < 1`.

    **Returns:** fp32 scalar.
    """
    per_site = {
        k: jnp.mean(jnp.sum((ci + eps) ** p, axis=-1), axis=tuple(range(1, ci.ndim - 1)))
        for k, ci in ci_upper.items()
    }
    return jnp.sum(layout.canonical(per_site))


def kl_divergence(clean_logits: Array, masked_logits: Array) -> Array:
    """`KL(softmax(clean) || softmax(masked))` per position, averaged over positions.

    **Arguments:**

    - `clean_logits`, `masked_logits`: `[..., vocab]`, computed in fp32.

    **Returns:** fp32 scalar; exactly 0 when the logits are equal.
    """
    log_p = jax.nn.log_softmax(clean_logits.astype(jnp.float32), axis=-1)
    log_q = jax.nn.log_softmax(masked_logits.astype(jnp.float32), axis=-1)
    return jnp.mean(jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1))


def mse(clean: Array, masked: Array) -> Array:
    """Squared error averaged over features and positions (the toys' real outputs)."""
    return jnp.mean(jnp.square(masked.astype(jnp.float32) - clean.astype(jnp.float32)))


def stochastic_recon_loss(
    forward: MaskedForward,
    components: Any,
    clean: Array,
    ci_lower: Mapping[str, Array],
    layout: SiteLayout,
    chunks: Sequence[Sequence[str]],
    *,
    key: Array,
    n_mask_samples: int,
    divergence: Divergence = kl_divergence,
) -> Array:
    """Stochastic reconstruction: the divergence of masked from clean outputs, averaged over
    `n_mask_samples` mask draws, over the reconstruction chunks and over positions.

    Draw `d` takes its masks from `stochastic_masks_by_kind(key=fold_in(k_mask, d))`; chunk `c` of
    draw `d` routes its sites with `fold_in(fold_in(k_route, d), c)` (uniform-k subsets) and
    runs every other site plain, where `k_mask, k_route = split(key)`. The (draw, chunk)
    pairs are walked by one `lax.map`: one masked forward in the graph and one live at a
    time, whatever the number of chunks.

    **Arguments:**

    - `forward`: the masked forward with the inputs bound.
    - `components`: passed to `forward`.
    - `clean`: the clean output (logits `[batch, seq, vocab]`).
    - `ci_lower`: `{kind: [n_kind, ..., C]}`.
    - `layout`: which sites each kind stacks.
    - `chunks`: from `masks.recon_chunks`.
    - `key`, `n_mask_samples`, `divergence`: keyword-only.

    **Returns:** fp32 scalar.
    """
    k_mask, k_route = jax.random.split(key)
    n_chunks = len(chunks)

    def per_run(r: Array) -> Array:
        # One flat map over (draw, chunk) pairs: a draw's masks are recomputed per chunk
        # (cheap, and bit-identical), which saves a level of scan nesting under the grad.
        d, c = r // n_chunks, r % n_chunks
        masks = stochastic_masks_by_kind(ci_lower, layout, key=jax.random.fold_in(k_mask, d))
        route_key = jax.random.fold_in(jax.random.fold_in(k_route, d), c)
        routed = route_chunk_by_kind(masks, layout, chunks, c, key=route_key)
        return divergence(clean, forward(components, routed))

    n_runs = n_mask_samples * n_chunks
    if n_runs == 1:
        return per_run(jnp.zeros((), jnp.int32))
    return jnp.mean(jax.lax.map(per_run, jnp.arange(n_runs)))


def pgd_ascend(
    forward: MaskedForward,
    components: Any,
    clean: Array,
    ci_lower: Mapping[str, Array],
    sources: Mapping[str, Array],
    *,
    steps: int,
    lr: float,
    divergence: Divergence = kl_divergence,
) -> dict[str, Array]:
    """Ascend the reconstruction divergence w.r.t. the sources.

    `steps` of `optax.adam(lr)` on `-divergence` (a fresh Adam state each call), each
    followed by a clip to `[0, 1]`, in a `fori_loop`. Components and CI enter under
    `stop_gradient`: the ascent moves the sources only, and the outer gradient does not
    trace through the loop.

    **Arguments:**

    - `forward`, `components`, `clean`, `ci_lower`: as for `stochastic_recon_loss`.
    - `sources`: `{kind: [n_kind, 1, ..., C + 1]}` in `[0, 1]`, any float dtype.
    - `steps`, `lr`, `divergence`: keyword-only.

    **Returns:** the ascended sources, fp32, same shapes.
    """
    components = jax.lax.stop_gradient(components)
    ci_lower = jax.lax.stop_gradient(ci_lower)
    src = {k: v.astype(jnp.float32) for k, v in sources.items()}
    if steps == 0:
        return src
    opt = optax.adam(lr)

    def objective(s: dict[str, Array]) -> Array:
        return divergence(clean, forward(components, source_masks(ci_lower, s)))

    def body(_: Array, carry: tuple[dict[str, Array], Any]) -> tuple[dict[str, Array], Any]:
        s, opt_state = carry
        grads = jax.grad(objective)(s)
        # Ascent: descend on the negated gradient.
        updates, opt_state = opt.update(jax.tree.map(jnp.negative, grads), opt_state, s)
        s = jax.tree.map(lambda a: jnp.clip(a, 0.0, 1.0), optax.apply_updates(s, updates))
        return s, opt_state

    src, _ = jax.lax.fori_loop(0, steps, body, (src, opt.init(src)))
    return src


def pgd_recon_loss(
    forward: MaskedForward,
    components: Any,
    clean: Array,
    ci_lower: Mapping[str, Array],
    sources: Mapping[str, Array],
    *,
    steps: int,
    lr: float,
    divergence: Divergence = kl_divergence,
) -> tuple[Array, dict[str, Array]]:
    """Persistent-PGD reconstruction: ascend the sources (`pgd_ascend`), then the
    divergence at the ascended sources, every site through its components everywhere.

    The ascended sources enter under `stop_gradient`; the gradient flows to components and
    CI through the final masked forward only.

    **Arguments:** as for `pgd_ascend`.

    **Returns:** `(fp32 scalar, ascended sources, as given, in fp32)`.
    """
    src = pgd_ascend(
        forward, components, clean, ci_lower, sources, steps=steps, lr=lr, divergence=divergence
    )
    src = jax.lax.stop_gradient(src)
    loss = divergence(clean, forward(components, source_masks(ci_lower, src)))
    return loss, src


# --- the table ----------------------------------------------------------------------------


class LossInputs(NamedTuple):
    """What a loss term may read: one train step's data, per-site data stacked per kind.

    - `model`, `config`: the target and the SPD configuration.
    - `components`: `{kind: SiteComponents(V [n_kind, d_in, C], U [n_kind, C, d_out])}`,
      what the gradient is taken of (with the CI function, through `ci_lower`, `ci_upper`).
    - `ci_lower`, `ci_upper`: `{kind: [n_kind, ..., C]}`.
    - `clean`: the clean output, from the frozen forward.
    - `forward`: the masked forward with the inputs bound.
    - `sources`: the persistent sources, `{kind: [n_kind, 1, ..., C + 1]}` (no seq axis:
      `[n_kind, 1, C + 1]`), any float dtype.
    - `p`: the importance exponent at this step.
    - `layout`: which sites each kind stacks.
    - `key`: the stochastic masks' key.
    """

    model: DecomposedModel
    config: SPDConfig
    components: dict[str, SiteComponents]
    ci_lower: dict[str, Array]
    ci_upper: dict[str, Array]
    clean: Array
    forward: MaskedForward
    sources: dict[str, Array]
    p: Array
    layout: SiteLayout
    key: Array


class TermValue(NamedTuple):
    """A term's fp32 scalar and, for a term that moves them, the new persistent sources
    (fp32, the shapes of `LossInputs.sources`)."""

    value: Array
    sources: dict[str, Array] | None = None


class LossTerm(NamedTuple):
    """One row of the loss table: the metric's `name`, its weight `coefficient(config)` (a
    term of weight 0 is not computed) and `loss(inputs) -> TermValue`."""

    name: str
    coefficient: Callable[[SPDConfig], float]
    loss: Callable[[LossInputs], TermValue]


def _faithfulness(x: LossInputs) -> TermValue:
    return TermValue(faithfulness_loss(x.model.weight_deltas_by_kind(x.components), x.layout))


def _importance(x: LossInputs) -> TermValue:
    return TermValue(importance_minimality_loss(x.ci_upper, x.p, x.layout))


def _stochastic_recon(x: LossInputs) -> TermValue:
    chunks = recon_chunks(x.model.site_names, x.config.recon_sites_per_chunk)
    value = stochastic_recon_loss(
        x.forward,
        x.components,
        x.clean,
        x.ci_lower,
        x.layout,
        chunks,
        key=x.key,
        n_mask_samples=x.config.n_mask_samples,
        divergence=x.model.divergence,
    )
    return TermValue(value)


def _pgd_recon(x: LossInputs) -> TermValue:
    value, sources = pgd_recon_loss(
        x.forward,
        x.components,
        x.clean,
        x.ci_lower,
        x.sources,
        steps=x.config.pgd_warmup_steps,
        lr=x.config.pgd_lr,
        divergence=x.model.divergence,
    )
    return TermValue(value, sources)


#: The SPD loss terms, in the order the step computes and sums them and metrics report them.
SPD_LOSSES: tuple[LossTerm, ...] = (
    LossTerm("faithfulness", lambda c: c.faithfulness_coeff, _faithfulness),
    LossTerm("importance", lambda c: c.importance_coeff, _importance),
    LossTerm("stochastic_recon", lambda c: c.stochastic_recon_coeff, _stochastic_recon),
    LossTerm("pgd_recon", lambda c: c.pgd_recon_coeff, _pgd_recon),
)
