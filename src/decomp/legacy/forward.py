"""The pre-refactor GLU forward: a Python loop over layers, kept as the live reference.

Each layer's weights are sliced out of the stacks and the block is traced once per layer, so
the HLO grows with depth. Taps are collected as the loop goes and the loop stops after the
last tapped layer. Same signatures as the methods of `GLUTransformer`, so a test can swap one
for the other.
"""

from __future__ import annotations

from collections.abc import Iterable

from jax import Array

from decomp import nn
from decomp.taps import parse_wanted
from decomp.targets.glu_transformer import GLUTransformer, _block


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
    cos, sin = nn.rope_cos_sin(cfg.inv_freq(), inputs.shape[1])
    out: dict[str, Array] = {}
    for i in range(last):
        layer = {name: w[i] for name, w in model.layers.items()}
        x, acts = _block(cfg, layer, x, cos, sin, lambda kind, h, layer=layer: h @ layer[kind].T)
        for tap in by_layer.get(i, ()):
            out[tap.key] = acts[tap.tap_class]
    if not to_logits:
        return None, {t.key: out[t.key] for t in taps}
    return model._logits(x), {t.key: out[t.key] for t in taps}


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
