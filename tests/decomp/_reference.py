"""An independent float64 numpy implementation of the GLU transformer forward, the oracle.

Written from the equations in docs/design.md ("The subject: GLU transformer target") and the
published Llama / Qwen3 definitions, not from decomp: it reads Hugging Face style weights
(`model.layers.{i}.self_attn.q_proj.weight`, ...) and imports nothing from decomp. RoPE is
written as a rotation of the pairs `(x[j], x[j + head_dim/2])`, the llama3 frequency scaling
as Meta's per-frequency loop, and grouped-query attention by indexing the kv head of each
query head, so that a slip in the vectorised forms does not repeat here.

Beside the forward, the losses and metrics the SPD tests hold decomp's to (`log_softmax`,
`kl`, `next_token_ce`): one copy, in float64 whatever the input's dtype.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

_KINDS = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}


@dataclasses.dataclass(frozen=True)
class RefConfig:
    """What the weights do not say: heads, norm epsilon and RoPE.

    `llama3_factor=None` means plain RoPE frequencies (always so for qwen3).
    """

    family: str
    n_head: int
    n_kv_head: int
    head_dim: int
    eps: float
    theta: float
    llama3_factor: float | None
    low_freq_factor: float
    high_freq_factor: float
    original_max_position: int


def rms(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """`x / sqrt(mean(x^2) + eps) * w` over the last axis."""
    out = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return out if w is None else out * w


def log_softmax(x: np.ndarray) -> np.ndarray:
    """`log softmax(x)` over the last axis, in float64."""
    x = np.asarray(x, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """`KL(softmax(p) || softmax(q))` over the last axis, averaged over the leading axes."""
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float(np.mean(np.sum(np.exp(lp) * (lp - lq), -1)))


def next_token_ce(logits: np.ndarray, tokens: np.ndarray) -> float:
    """Mean cross-entropy of `tokens[:, 1:]` under `logits[:, :-1]` (`[batch, seq, vocab]`)."""
    lq = log_softmax(logits[:, :-1])
    return float(-np.mean(np.take_along_axis(lq, tokens[:, 1:, None], -1)))


def inv_freq(cfg: RefConfig) -> np.ndarray:
    """RoPE inverse frequencies `[head_dim // 2]`, llama3-scaled when the config says so."""
    base = [cfg.theta ** (-2.0 * j / cfg.head_dim) for j in range(cfg.head_dim // 2)]
    if cfg.llama3_factor is None:
        return np.array(base)
    # Meta's `apply_scaling` (Llama 3.1), one frequency at a time.
    low_wavelen = cfg.original_max_position / cfg.low_freq_factor
    high_wavelen = cfg.original_max_position / cfg.high_freq_factor
    scaled = []
    for freq in base:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            scaled.append(freq)
        elif wavelen > low_wavelen:
            scaled.append(freq / cfg.llama3_factor)
        else:
            smooth = (cfg.original_max_position / wavelen - cfg.low_freq_factor) / (
                cfg.high_freq_factor - cfg.low_freq_factor
            )
            scaled.append((1 - smooth) * freq / cfg.llama3_factor + smooth * freq)
    return np.array(scaled)


def rope(x: np.ndarray, freqs: np.ndarray) -> np.ndarray:
    """Rotate each pair `(x[..., j], x[..., j + half])` at position `p` by `p * freqs[j]`.

    `x`: `[batch, seq, heads, head_dim]`.
    """
    half = x.shape[-1] // 2
    angle = np.arange(x.shape[1])[:, None] * freqs[None, :]  # [seq, half]
    cos, sin = np.cos(angle)[None, :, None, :], np.sin(angle)[None, :, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def causal_gqa(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal attention; query head `h` reads kv head `h // (n_head // n_kv_head)`.

    `q`: `[b, t, n_head, d]`; `k`, `v`: `[b, t, n_kv_head, d]`. Returns `[b, t, n_head * d]`.
    """
    b, t, n_head, d = q.shape
    group = n_head // k.shape[2]
    out = np.zeros_like(q)
    future = np.triu(np.ones((t, t), dtype=bool), k=1)
    for h in range(n_head):
        kv = h // group
        scores = q[:, :, h, :] @ k[:, :, kv, :].transpose(0, 2, 1) / math.sqrt(d)
        scores = np.where(future, -np.inf, scores)
        scores = scores - scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out[:, :, h, :] = probs @ v[:, :, kv, :]
    return out.reshape(b, t, n_head * d)


def forward(
    state_dict: Mapping[str, np.ndarray], cfg: RefConfig, tokens: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Logits and every tap of the clean forward, in float64.

    **Arguments:**

    - `state_dict`: Hugging Face style weights; `lm_head.weight` absent means tied.
    - `cfg`: heads, epsilon and RoPE settings.
    - `tokens`: int `[batch, seq]`.

    **Returns:** `(logits [batch, seq, vocab], {tap key: [batch, seq, width]})` with keys
    `resid.{i}` and every site name `layers.{i}.self_attn.q_proj`, ... (the input of that
    site's weight).
    """
    sd = {k: np.asarray(v, dtype=np.float64) for k, v in state_dict.items()}
    n_layer = sum(1 for k in sd if k.endswith(".input_layernorm.weight"))
    freqs = inv_freq(cfg)
    b, t = tokens.shape
    x = sd["model.embed_tokens.weight"][tokens]
    taps: dict[str, np.ndarray] = {}
    for i in range(n_layer):
        p = f"model.layers.{i}."

        def w(kind: str, p: str = p) -> np.ndarray:
            return sd[f"{p}{_KINDS[kind]}.weight"]

        h1 = rms(x, sd[p + "input_layernorm.weight"], cfg.eps)
        q = (h1 @ w("q").T).reshape(b, t, cfg.n_head, cfg.head_dim)
        k = (h1 @ w("k").T).reshape(b, t, cfg.n_kv_head, cfg.head_dim)
        v = (h1 @ w("v").T).reshape(b, t, cfg.n_kv_head, cfg.head_dim)
        if cfg.family == "qwen3":
            q = rms(q, sd[p + "self_attn.q_norm.weight"], cfg.eps)
            k = rms(k, sd[p + "self_attn.k_norm.weight"], cfg.eps)
        y = causal_gqa(rope(q, freqs), rope(k, freqs), v)
        post = x + y @ w("o").T
        mlp_in = rms(post, sd[p + "post_attention_layernorm.weight"], cfg.eps)
        gate = mlp_in @ w("gate").T
        inner = gate / (1 + np.exp(-gate)) * (mlp_in @ w("up").T)
        inputs = {"q": h1, "k": h1, "v": h1, "o": y, "gate": mlp_in, "up": mlp_in, "down": inner}
        taps[f"resid.{i}"] = x
        for kind, path in _KINDS.items():
            taps[f"layers.{i}.{path}"] = inputs[kind]
        x = post + inner @ w("down").T
    head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    return rms(x, sd["model.norm.weight"], cfg.eps) @ head.T, taps
