"""The layers of the GLU transformer, written as the equations in docs/design.md.

Every function here is pure and shape-polymorphic over leading batch axes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import Array


def rms_norm(x: Array, w: Array | None, eps: float) -> Array:
    """RMS norm computed in fp32, cast back, then scaled: HF's LlamaRMSNorm.

    **Arguments:**

    - `x`: `[..., d]`.
    - `w`: `[d]` scale, or `None` for a weightless norm.
    - `eps`: added to the mean square.

    **Returns:** `[..., d]` in `x.dtype`.
    """
    x32 = x.astype(jnp.float32)
    normed = (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(
        x.dtype
    )
    return normed if w is None else normed * w


def rope_inv_freq(
    head_dim: int,
    theta: float,
    *,
    llama3_factor: float | None = None,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_max_position: int = 8192,
) -> Array:
    """Inverse frequencies of rotary embeddings, `[head_dim // 2]`, fp32.

    With `llama3_factor` set, long wavelengths are divided by the factor and the band
    between the two wavelength thresholds is interpolated (Llama 3.1's "llama3" scaling).
    """
    exponents = jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if llama3_factor is None:
        return inv_freq
    low_freq_wavelen = original_max_position / low_freq_factor
    high_freq_wavelen = original_max_position / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > low_freq_wavelen, inv_freq / llama3_factor, inv_freq)
    smooth = (original_max_position / wavelen - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / llama3_factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return jnp.where(is_medium, smoothed, scaled)


def rope_cos_sin(inv_freq: Array, seq_len: int) -> tuple[Array, Array]:
    """Cosine and sine tables `[seq_len, head_dim]` for positions `0 .. seq_len - 1`."""
    positions = jnp.arange(seq_len, dtype=jnp.float32)
    freqs = positions[:, None] * inv_freq[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def _rotate_half(x: Array) -> Array:
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
    """Rotate-half RoPE. `x`: `[batch, seq, heads, head_dim]`; `cos`, `sin`: `[seq, head_dim]`."""
    cos = cos[:, None, :].astype(x.dtype)
    sin = sin[:, None, :].astype(x.dtype)
    return x * cos + _rotate_half(x) * sin


def attention(q: Array, k: Array, v: Array, *, causal: bool) -> Array:
    """Scaled dot-product attention with grouped-query heads.

    **Arguments:**

    - `q`: `[batch, seq, n_head, head_dim]`.
    - `k`, `v`: `[batch, seq, n_kv_head, head_dim]`, `n_kv_head` dividing `n_head`.
    - `causal`: mask out keys after each query.

    **Returns:** `[batch, seq, n_head * head_dim]`.
    """
    b, t, n_head, head_dim = q.shape
    n_kv_head = k.shape[2]
    group = n_head // n_kv_head
    # Each kv head serves `group` consecutive query heads (HF's repeat_kv layout).
    k = jnp.repeat(k, group, axis=2)
    v = jnp.repeat(v, group, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
    scores = scores.astype(jnp.float32)
    if causal:
        mask = jnp.tril(jnp.ones((t, t), dtype=bool))
        scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    y = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
    return y.reshape(b, t, n_head * head_dim)
