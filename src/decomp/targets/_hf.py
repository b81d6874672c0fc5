"""Hugging Face state-dict naming for the GLU transformer (load and export).

`decomp.targets.glu_transformer` imports this module (its `from_hf_state_dict` and
`to_hf_state_dict` call it) and this module imports nothing of it: the config, the model and
its class arrive as arguments, read by their fields (`family`, `n_layer`, the widths,
`tie_word_embeddings`; `embed`, `layers`, `norm`, `lm_head`), so the import goes one way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

#: The GLU config, the model and its class, as this module sees them (see the docstring).
GLUConfig = Any
GLUTransformer = Any

# Our stacked-layer field -> the HF module path inside `model.layers.{i}`.
_LAYER_PATHS = {
    "q": "self_attn.q_proj.weight",
    "k": "self_attn.k_proj.weight",
    "v": "self_attn.v_proj.weight",
    "o": "self_attn.o_proj.weight",
    "gate": "mlp.gate_proj.weight",
    "up": "mlp.up_proj.weight",
    "down": "mlp.down_proj.weight",
    "ln1": "input_layernorm.weight",
    "ln2": "post_attention_layernorm.weight",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
}


def _expected_shapes(cfg: GLUConfig) -> dict[str, tuple[str, int | None, tuple[int, ...]]]:
    """HF key -> (field, layer or None, shape)."""
    per_layer: dict[str, tuple[int, ...]] = {
        kind: (d_out, d_in) for kind, (d_in, d_out) in cfg.site_shapes().items()
    }
    per_layer["ln1"] = per_layer["ln2"] = (cfg.d_model,)
    if cfg.family == "qwen3":
        per_layer["q_norm"] = per_layer["k_norm"] = (cfg.head_dim,)
    out: dict[str, tuple[str, int | None, tuple[int, ...]]] = {
        "model.embed_tokens.weight": ("embed", None, (cfg.vocab_size, cfg.d_model)),
        "model.norm.weight": ("norm", None, (cfg.d_model,)),
    }
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = ("lm_head", None, (cfg.vocab_size, cfg.d_model))
    for i in range(cfg.n_layer):
        for field, shape in per_layer.items():
            out[f"model.layers.{i}.{_LAYER_PATHS[field]}"] = (field, i, shape)
    return out


def load_state_dict(cls: Any, cfg: GLUConfig, state_dict: Mapping[str, Any]) -> GLUTransformer:
    expected = _expected_shapes(cfg)
    arrays = {k: np.asarray(v) for k, v in state_dict.items()}
    problems: list[str] = []
    tied_head = arrays.pop("lm_head.weight", None) if cfg.tie_word_embeddings else None
    missing = sorted(set(expected) - set(arrays))
    extra = sorted(set(arrays) - set(expected))
    if missing:
        problems.append(f"missing: {', '.join(missing)}")
    if extra:
        problems.append(f"unexpected: {', '.join(extra)}")
    for key, (_, _, shape) in expected.items():
        if key in arrays:
            a = arrays[key]
            if a.shape != shape:
                problems.append(f"{key} has shape {a.shape}, expected {shape}")
            elif not np.issubdtype(a.dtype, np.floating) and a.dtype.name != "bfloat16":
                problems.append(f"{key} has dtype {a.dtype}, expected a float dtype")
    embed = arrays.get("model.embed_tokens.weight")
    if (
        tied_head is not None
        and embed is not None
        and (tied_head.shape != embed.shape or not np.array_equal(tied_head, embed))
    ):
        problems.append(
            "lm_head.weight differs from model.embed_tokens.weight, but the config ties them "
            "(tie_word_embeddings=True): drop lm_head.weight or set tie_word_embeddings=False"
        )
    if problems:
        raise ValueError(
            f"state dict does not fit GLUConfig(family={cfg.family!r}, n_layer={cfg.n_layer}, "
            f"d_model={cfg.d_model}, ...): " + "; ".join(problems)
        )

    def f32(a: np.ndarray) -> jnp.ndarray:
        return jnp.asarray(np.asarray(a, dtype=np.float32))

    layer_fields = sorted({field for field, layer, _ in expected.values() if layer is not None})
    layers = {
        field: f32(
            np.stack(
                [arrays[f"model.layers.{i}.{_LAYER_PATHS[field]}"] for i in range(cfg.n_layer)]
            )
        )
        for field in layer_fields
    }
    return cls(
        config=cfg,
        embed=f32(arrays["model.embed_tokens.weight"]),
        layers=layers,
        norm=f32(arrays["model.norm.weight"]),
        lm_head=None if cfg.tie_word_embeddings else f32(arrays["lm_head.weight"]),
    )


def export_state_dict(model: GLUTransformer) -> dict[str, np.ndarray]:
    cfg = model.config
    out: dict[str, np.ndarray] = {}
    for key, (field, layer, _) in _expected_shapes(cfg).items():
        if layer is None:
            value = getattr(model, field)
            out[key] = np.asarray(value)
        else:
            out[key] = np.asarray(model.layers[field][layer])
    return out
