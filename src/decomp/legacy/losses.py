"""The four SPD loss terms on per-site dicts, as they were before the train step was
stacked per site kind (`decomp.losses`); the losses of `decomp.legacy.train`.

`MaskedForward(components, masks) -> output` is the target's masked forward with the
inputs bound; `divergence(clean, masked) -> scalar` compares outputs per position and
averages (`kl_divergence` for logits, `mse` for the toys' real-valued outputs). See
docs/design.md, "The subject: SPD training".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import Array

from decomp.components import SiteMask
from decomp.legacy.masks import route_chunk, stochastic_masks
from decomp.masks import source_masks

MaskedForward = Callable[[Any, Mapping[str, SiteMask]], Array]
Divergence = Callable[[Array, Array], Array]

#: Added to `ci_upper` before the power, so that `p < 1` has a finite gradient at 0.
IMPORTANCE_EPS = 1e-12


def faithfulness_loss(weight_deltas: Mapping[str, Array]) -> Array:
    """`sum_sites ||dW||^2 / sum_sites numel(W)`.

    **Arguments:**

    - `weight_deltas`: `{site: dW [d_out, d_in]}`.

    **Returns:** fp32 scalar.
    """
    total = sum(jnp.sum(jnp.square(dw.astype(jnp.float32))) for dw in weight_deltas.values())
    count = sum(dw.size for dw in weight_deltas.values())
    return jnp.asarray(total, jnp.float32) / count


def importance_minimality_loss(
    ci_upper: Mapping[str, Array], p: Array | float, *, eps: float = IMPORTANCE_EPS
) -> Array:
    """`sum_sites sum_c (ci_upper + eps)^p`, averaged over positions.

    **Arguments:**

    - `ci_upper`: `{site: [..., C]}`, non-negative.
    - `p`: the exponent (annealed by the caller).
    - `eps`: keeps the gradient finite at 0 for `p < 1`.

    **Returns:** fp32 scalar.
    """
    terms = [jnp.mean(jnp.sum((ci + eps) ** p, axis=-1)) for ci in ci_upper.values()]
    return jnp.sum(jnp.stack(terms))


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
    chunks: Sequence[Sequence[str]],
    *,
    key: Array,
    n_mask_samples: int,
    divergence: Divergence = kl_divergence,
) -> Array:
    """Stochastic reconstruction: the divergence of masked from clean outputs, averaged over
    `n_mask_samples` mask draws, over the reconstruction chunks and over positions.

    Draw `d` takes its masks from `stochastic_masks(key=fold_in(k_mask, d))`; chunk `c` of
    draw `d` routes its sites with `fold_in(fold_in(k_route, d), c)` (uniform-k subsets) and
    runs every other site plain, where `k_mask, k_route = split(key)`. The (draw, chunk)
    pairs are walked by one `lax.map`: one masked forward in the graph and one live at a
    time, whatever the number of chunks.

    **Arguments:**

    - `forward`: the masked forward with the inputs bound.
    - `components`: passed to `forward`.
    - `clean`: the clean output (logits `[batch, seq, vocab]`).
    - `ci_lower`: `{site: [..., C]}` for every site, canonical order.
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
        masks = stochastic_masks(ci_lower, key=jax.random.fold_in(k_mask, d))
        route_key = jax.random.fold_in(jax.random.fold_in(k_route, d), c)
        routed = route_chunk(masks, chunks, c, key=route_key)
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
    - `sources`: `{site: [1, ..., C + 1]}` in `[0, 1]`, any float dtype.
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

    **Returns:** `(fp32 scalar, ascended sources {site: [1, ..., C + 1]} in fp32)`.
    """
    src = pgd_ascend(
        forward, components, clean, ci_lower, sources, steps=steps, lr=lr, divergence=divergence
    )
    src = jax.lax.stop_gradient(src)
    loss = divergence(clean, forward(components, source_masks(ci_lower, src)))
    return loss, src
