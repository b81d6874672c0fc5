"""The pre-refactor GLU forward: a Python loop over layers, kept as the live reference.

Each layer's weights are sliced out of the stacks and the block is traced once per layer, so
the HLO grows with depth. Taps are collected as the loop goes and the loop stops after the
last tapped layer. Same signatures as the methods of `GLUTransformer`, so a test can swap one
for the other. Self-contained: the block, the RoPE frequency choice and the final norm and
head are this module's own copies of the equations in docs/design.md; only the layer primitives
of `decomp.nn` and the tap-key parser are shared (see `decomp.legacy`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import jax
from jax import Array

from decomp import nn
from decomp.taps import parse_wanted
from decomp.targets.glu_transformer import GLUConfig, GLUTransformer


def _inv_freq(cfg: GLUConfig) -> Array:
    """RoPE inverse frequencies: llama3-scaled for the llama family unless the scaling factor
    is `None`; plain for qwen3."""
    llama3 = cfg.family == "llama" and cfg.rope_scaling_factor is not None
    return nn.rope_inv_freq(
        cfg.head_dim,
        cfg.rope_theta,
        llama3_factor=cfg.rope_scaling_factor if llama3 else None,
        low_freq_factor=cfg.rope_low_freq_factor,
        high_freq_factor=cfg.rope_high_freq_factor,
        original_max_position=cfg.rope_original_max_position,
    )


def _block(
    cfg: GLUConfig,
    layer: Mapping[str, Array],
    x: Array,
    cos: Array,
    sin: Array,
    site: Callable[[str, Array], Array],
) -> tuple[Array, dict[str, Array]]:
    """One pre-norm block. Returns the next residual and the block's intermediates by class."""
    b, t, _ = x.shape
    h1 = nn.rms_norm(x, layer["ln1"], cfg.rms_norm_eps)
    q = site("q", h1).reshape(b, t, cfg.n_head, cfg.head_dim)
    k = site("k", h1).reshape(b, t, cfg.n_kv_head, cfg.head_dim)
    v = site("v", h1).reshape(b, t, cfg.n_kv_head, cfg.head_dim)
    if cfg.family == "qwen3":
        q = nn.rms_norm(q, layer["q_norm"], cfg.rms_norm_eps)
        k = nn.rms_norm(k, layer["k_norm"], cfg.rms_norm_eps)
    q, k = nn.apply_rope(q, cos, sin), nn.apply_rope(k, cos, sin)
    y = nn.attention(q, k, v, causal=True)
    post = x + site("o", y)
    mlp_in = nn.rms_norm(post, layer["ln2"], cfg.rms_norm_eps)
    inner = jax.nn.silu(site("gate", mlp_in)) * site("up", mlp_in)
    x_next = post + site("down", inner)
    acts = {"resid": x, "post_ln1": h1, "attn_out": y, "post_ln2": mlp_in, "mlp_inner": inner}
    return x_next, acts


def _run_layers(
    model: GLUTransformer, inputs: Array, wanted: Iterable[str] | None, to_logits: bool
) -> tuple[Array | None, dict[str, Array]]:
    cfg = model.config
    taps = () if wanted is None else parse_wanted(wanted, cfg.n_layer)
    by_layer: dict[int, list] = {}
    for tap in taps:
        by_layer.setdefault(tap.layer, []).append(tap)
    last = cfg.n_layer if to_logits else 1 + max(by_layer, default=-1)
    x = model.embed[inputs]
    cos, sin = nn.rope_cos_sin(_inv_freq(cfg), inputs.shape[1])
    out: dict[str, Array] = {}
    for i in range(last):
        layer = {name: w[i] for name, w in model.layers.items()}
        x, acts = _block(cfg, layer, x, cos, sin, lambda kind, h, layer=layer: h @ layer[kind].T)
        for tap in by_layer.get(i, ()):
            out[tap.key] = acts[tap.tap_class]
    if not to_logits:
        return None, {t.key: out[t.key] for t in taps}
    logits = nn.rms_norm(x, model.norm, cfg.rms_norm_eps) @ model.head.T
    return logits, {t.key: out[t.key] for t in taps}


def clean_output(model: GLUTransformer, inputs: Array) -> Array:
    """Logits `[batch, seq, vocab]` from the unrolled forward."""
    logits, _ = _run_layers(model, inputs, None, True)
    assert logits is not None
    return logits


def read_activations(
    model: GLUTransformer, inputs: Array, wanted: Iterable[str]
) -> dict[str, Array]:
    """Taps `{key: [batch, seq, width]}` from the unrolled forward, stopping after the last
    tapped layer."""
    _, taps = _run_layers(model, inputs, wanted, False)
    return taps


def clean_output_and_activations(
    model: GLUTransformer, inputs: Array, wanted: Iterable[str]
) -> tuple[Array, dict[str, Array]]:
    """The old two-pass form: a clean forward for logits, then a second one for taps."""
    return clean_output(model, inputs), read_activations(model, inputs, wanted)


__all__ = ["clean_output", "clean_output_and_activations", "read_activations"]
