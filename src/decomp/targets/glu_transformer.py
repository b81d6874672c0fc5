"""GLU transformer target: the llama and qwen3 families with stacked per-layer weights.

Weights are `[d_out, d_in]` (the Hugging Face convention, applied as `x @ W.T`) and every
per-layer weight is stacked on a leading `n_layer` axis, so the forward is one `lax.scan`
over blocks. See docs/design.md, "The subject: GLU transformer target".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Literal

import equinox as eqx
import jax
import numpy as np
from jax import Array

from decomp import nn
from decomp.components import SiteComponents, SiteMask, site_output, weight_delta
from decomp.config import Remat
from decomp.losses import kl_divergence
from decomp.taps import (
    KIND_CLASS,
    SITE_KINDS,
    TAP_CLASSES,
    Tap,
    parse_site,
    parse_wanted,
    site_name,
    site_names,
)
from decomp.targets._hf import export_state_dict, load_state_dict

Family = Literal["llama", "qwen3"]

#: `site_apply(kind, W, site_x, x) -> y`: how a block applies the site weight `W` of `kind`
#: (`[d_out, d_in]`) to its input `x` (`[b, t, d_in]`); `site_x` is this layer's slice of
#: whatever the caller stacked on the leading layer axis (components, masks, ...).
SiteApply = Callable[[str, Array, Any, Array], Array]


@dataclasses.dataclass(frozen=True)
class GLUConfig:
    """Structure of a GLU transformer.

    `family="llama"` applies llama3-scaled RoPE frequencies (unless `rope_scaling_factor` is
    `None`); `family="qwen3"` applies a per-head RMS norm to queries and keys before RoPE.
    """

    family: Family = "llama"
    n_layer: int = 2
    d_model: int = 64
    n_head: int = 4
    n_kv_head: int = 2
    head_dim: int = 16
    d_mlp: int = 128
    vocab_size: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling_factor: float | None = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.family not in ("llama", "qwen3"):
            raise ValueError(f"family must be 'llama' or 'qwen3', got {self.family!r}")
        for name in (
            "n_layer",
            "d_model",
            "n_head",
            "n_kv_head",
            "head_dim",
            "d_mlp",
            "vocab_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.n_head % self.n_kv_head:
            raise ValueError(
                f"n_kv_head ({self.n_kv_head}) must divide n_head ({self.n_head}) "
                "for grouped-query attention"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotate-half RoPE, got {self.head_dim}")
        if self.rms_norm_eps <= 0:
            raise ValueError(f"rms_norm_eps must be positive, got {self.rms_norm_eps}")

    def site_shapes(self) -> dict[str, tuple[int, int]]:
        """`(d_in, d_out)` of each site kind."""
        d, hq, hkv = self.d_model, self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        return {
            "q": (d, hq),
            "k": (d, hkv),
            "v": (d, hkv),
            "o": (hq, d),
            "gate": (d, self.d_mlp),
            "up": (d, self.d_mlp),
            "down": (self.d_mlp, d),
        }

    def inv_freq(self) -> Array:
        llama3 = self.family == "llama" and self.rope_scaling_factor is not None
        return nn.rope_inv_freq(
            self.head_dim,
            self.rope_theta,
            llama3_factor=self.rope_scaling_factor if llama3 else None,
            low_freq_factor=self.rope_low_freq_factor,
            high_freq_factor=self.rope_high_freq_factor,
            original_max_position=self.rope_original_max_position,
        )


def _plain_site(kind: str, w: Array, site_x: Any, x: Array) -> Array:
    del kind, site_x
    return x @ w.T


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


def _layer_slice(tree: Any, start: int, stop: int | None) -> Any:
    return jax.tree.map(lambda a: a[start:stop], tree)


def _emitting_depth(tapped_depth: int, n_layer: int, to_logits: bool) -> int:
    """How many leading blocks the ys-emitting scan runs: `tapped_depth`, lengthened so that
    no scan segment is a single block unless the model has only one.

    XLA inlines a while loop whose trip count is 1 and fuses its body with what surrounds
    it, which moves the last bits of that block's taps and of the logits away from the same
    block run inside a loop. With every segment at least two blocks long, a tap does not
    depend on which other keys were wanted, and clean logits are bit-identical whatever the
    tapped depth.
    """
    if tapped_depth == 0:
        return 0
    depth = min(max(tapped_depth, 2), n_layer)
    if to_logits and n_layer - depth == 1:
        depth = n_layer
    return depth


class GLUTransformer(eqx.Module):
    """A llama or qwen3 decoder with per-layer weights stacked on a leading `n_layer` axis.

    Fields: `embed` `[vocab, d_model]`; `layers`, a dict of stacked weights (`ln1`, `ln2`
    `[n_layer, d_model]`; `q`, `k`, `v`, `o`, `gate`, `up`, `down` `[n_layer, d_out, d_in]`;
    qwen3 only: `q_norm`, `k_norm` `[n_layer, head_dim]`); `norm` `[d_model]`; `lm_head`
    `[vocab, d_model]`, or `None` when tied to `embed`.
    """

    config: GLUConfig = eqx.field(static=True)
    embed: Array
    layers: dict[str, Array]
    norm: Array
    lm_head: Array | None

    @classmethod
    def init(cls, config: GLUConfig, *, key: Array) -> GLUTransformer:
        """Random weights: projections `N(0, 1/d_in)`, embeddings `N(0, 1)`, norm scales
        `1 + N(0, 0.1^2)` (not all ones, so that a swapped norm is visible in the output).
        """
        cfg = config
        k_embed, k_head, k_norm, k_layers = jax.random.split(key, 4)
        shapes = cfg.site_shapes()
        kind_keys = jax.random.split(k_layers, len(SITE_KINDS) + 4)
        layers: dict[str, Array] = {}
        for kind, k in zip(SITE_KINDS, kind_keys, strict=False):
            d_in, d_out = shapes[kind]
            layers[kind] = jax.random.normal(k, (cfg.n_layer, d_out, d_in)) / np.sqrt(d_in)
        norm_keys = kind_keys[len(SITE_KINDS) :]
        layers["ln1"] = 1 + 0.1 * jax.random.normal(norm_keys[0], (cfg.n_layer, cfg.d_model))
        layers["ln2"] = 1 + 0.1 * jax.random.normal(norm_keys[1], (cfg.n_layer, cfg.d_model))
        if cfg.family == "qwen3":
            layers["q_norm"] = 1 + 0.1 * jax.random.normal(
                norm_keys[2], (cfg.n_layer, cfg.head_dim)
            )
            layers["k_norm"] = 1 + 0.1 * jax.random.normal(
                norm_keys[3], (cfg.n_layer, cfg.head_dim)
            )
        embed = jax.random.normal(k_embed, (cfg.vocab_size, cfg.d_model))
        lm_head = (
            None
            if cfg.tie_word_embeddings
            else jax.random.normal(k_head, (cfg.vocab_size, cfg.d_model)) / np.sqrt(cfg.d_model)
        )
        norm = 1 + 0.1 * jax.random.normal(k_norm, (cfg.d_model,))
        return cls(config=cfg, embed=embed, layers=layers, norm=norm, lm_head=lm_head)

    @classmethod
    def from_hf_state_dict(cls, config: GLUConfig, state_dict: Mapping[str, Any]) -> GLUTransformer:
        """Load Hugging Face `LlamaForCausalLM` / `Qwen3ForCausalLM` weights.

        **Arguments:**

        - `config`: the structure the weights must have.
        - `state_dict`: arrays (numpy, jax, or anything `np.asarray` takes) keyed
          `model.embed_tokens.weight`, `model.layers.{i}.self_attn.q_proj.weight`, ...,
          `model.norm.weight`, `lm_head.weight` (optional when the head is tied; then it must
          equal the embeddings).

        **Returns:** the model. Raises a `ValueError` naming every missing, extra or
        mis-shaped tensor at once.
        """
        return load_state_dict(cls, config, state_dict)

    def to_hf_state_dict(self) -> dict[str, np.ndarray]:
        """The weights as a Hugging Face style state dict of numpy arrays."""
        return export_state_dict(self)

    # --- structure -----------------------------------------------------------------------

    @property
    def site_names(self) -> tuple[str, ...]:
        """Decomposed sites in canonical order."""
        return site_names(self.config.n_layer)

    #: Int tokens `[batch, seq]` in, next-token logits `[batch, seq, vocab]` out.
    has_seq_axis: ClassVar[bool] = True
    divergence_name: ClassVar[str] = "kl"

    def divergence(self, clean: Array, masked: Array) -> Array:
        """`kl_divergence` of the masked logits from the clean ones, averaged over positions."""
        return kl_divergence(clean, masked)

    @property
    def head(self) -> Array:
        """The unembedding `[vocab, d_model]` (the embeddings when tied)."""
        return self.embed if self.lm_head is None else self.lm_head

    # --- forward -------------------------------------------------------------------------

    def _scan(
        self,
        x: Array,
        start: int,
        stop: int | None,
        classes: tuple[str, ...],
        site_apply: SiteApply,
        site_xs: Any,
        remat: Remat,
    ) -> tuple[Array, dict[str, Array]]:
        cfg = self.config
        cos, sin = nn.rope_cos_sin(cfg.inv_freq(), x.shape[1])

        def body(x: Array, xs: tuple[dict[str, Array], Any]) -> tuple[Array, dict[str, Array]]:
            layer, site_x = xs

            def site(kind: str, inp: Array) -> Array:
                return site_apply(kind, layer[kind], site_x, inp)

            x_next, acts = _block(cfg, layer, x, cos, sin, site)
            return x_next, {c: acts[c] for c in classes}

        if remat == "nothing":
            body = jax.checkpoint(body, policy=jax.checkpoint_policies.nothing_saveable)
        elif remat == "dots":
            body = jax.checkpoint(body, policy=jax.checkpoint_policies.checkpoint_dots)
        elif remat is not None:
            raise ValueError(f"remat must be None, 'nothing' or 'dots', got {remat!r}")
        xs = (_layer_slice(self.layers, start, stop), _layer_slice(site_xs, start, stop))
        return jax.lax.scan(body, x, xs)

    def _clean_forward(
        self,
        inputs: Array,
        wanted: Iterable[str] | None,
        to_logits: bool,
        *,
        site_apply: SiteApply = _plain_site,
        site_xs: Any = None,
        remat: Remat = None,
    ) -> tuple[Array | None, dict[str, Array]]:
        """The single forward: one scan over blocks, taps emitted as scan ys.

        Only the intermediate classes that `wanted` needs are emitted, and only by the
        prefix of blocks up to the last tapped one (`tapped_depth`, lengthened by at most one
        block, see `_emitting_depth`); the remaining blocks are scanned without ys, and only
        when `to_logits`.

        **Arguments:**

        - `inputs`: int32 tokens `[batch, seq]`.
        - `wanted`: tap keys, or `None` for no taps.
        - `to_logits`: whether to finish the forward to logits.
        - `site_apply`, `site_xs`: how sites apply their weights (default `x @ W.T`) and the
          per-layer data they need, stacked on a leading `n_layer` axis.
        - `remat`: `None`, or checkpoint the scan body saving `"nothing"` or `"dots"`.

        **Returns:** `(logits [batch, seq, vocab] or None, {tap key: [batch, seq, width]})`.
        """
        cfg = self.config
        taps: tuple[Tap, ...] = () if wanted is None else parse_wanted(wanted, cfg.n_layer)
        x = self.embed[inputs]
        tapped_depth = 1 + max((t.layer for t in taps), default=-1)
        needed = {t.tap_class for t in taps}
        classes = tuple(c for c in TAP_CLASSES if c in needed)
        depth = _emitting_depth(tapped_depth, cfg.n_layer, to_logits)
        out: dict[str, Array] = {}
        if depth:
            x, ys = self._scan(x, 0, depth, classes, site_apply, site_xs, remat)
            out = {t.key: ys[t.tap_class][t.layer] for t in taps}
        if not to_logits:
            return None, out
        if depth < cfg.n_layer:
            x, _ = self._scan(x, depth, None, (), site_apply, site_xs, remat)
        return self._logits(x), out

    def _logits(self, x: Array) -> Array:
        return nn.rms_norm(x, self.norm, self.config.rms_norm_eps) @ self.head.T

    def clean_output(self, inputs: Array) -> Array:
        """Logits `[batch, seq, vocab]` of the unmodified model on int32 tokens `[batch, seq]`."""
        logits, _ = self._clean_forward(inputs, None, True)
        assert logits is not None
        return logits

    def read_activations(self, inputs: Array, wanted: Iterable[str]) -> dict[str, Array]:
        """Taps of the clean forward, `{key: [batch, seq, width]}`.

        `wanted` holds `resid.{i}` and site names (the input of that site's weight); it
        must be non-empty and every key known, else a `ValueError` lists the valid forms.
        The forward stops after the last tapped block (after block 1 when only block 0 is
        tapped: see `_emitting_depth`).
        """
        _, taps = self._clean_forward(inputs, wanted, False)
        return taps

    def clean_output_and_activations(
        self, inputs: Array, wanted: Iterable[str]
    ) -> tuple[Array, dict[str, Array]]:
        """Clean logits and taps of the same batch from one frozen forward."""
        logits, taps = self._clean_forward(inputs, wanted, True)
        assert logits is not None
        return logits, taps

    def masked_output_by_kind(
        self,
        inputs: Array,
        components: Mapping[str, SiteComponents],
        masks: Mapping[str, SiteMask],
        *,
        remat: Remat = None,
    ) -> Array:
        """Logits with every site run through its components under its mask; components and
        masks stacked per kind on the layer axis, as the scan consumes them.

        **Arguments:**

        - `inputs`: int32 tokens `[batch, seq]`.
        - `components`: `{kind: SiteComponents(V [n_layer, d_in, C], U [n_layer, C,
          d_out])}` for every kind.
        - `masks`: `{kind: SiteMask(mask [n_layer, batch, seq, C], ...)}` for every kind
          (optional delta and routing `[n_layer, batch, seq]`).
        - `remat`: `None`, or checkpoint the scan body saving `"nothing"` or `"dots"`.

        **Returns:** logits `[batch, seq, vocab]`.
        """
        missing = [k for k in SITE_KINDS if k not in components or k not in masks]
        if missing:
            raise ValueError(f"components and masks need every site kind; missing {missing}")
        site_xs = {k: (components[k], masks[k]) for k in SITE_KINDS}

        def site_apply(kind: str, w: Array, site_x: Any, x: Array) -> Array:
            comp, site_mask = site_x[kind]
            return site_output(x, w, comp, site_mask)

        logits, _ = self._clean_forward(
            inputs, None, True, site_apply=site_apply, site_xs=site_xs, remat=remat
        )
        assert logits is not None
        return logits

    def clean_output_and_taps_by_kind(self, inputs: Array) -> tuple[Array, dict[str, Array]]:
        """Clean logits and the input of every site, stacked per kind: `{kind: [n_layer,
        batch, seq, d_in]}` (the scan's ys, which the per-site taps are rows of)."""
        classes = tuple(c for c in TAP_CLASSES if c in KIND_CLASS.values())
        x, ys = self._scan(self.embed[inputs], 0, None, classes, _plain_site, None, None)
        return self._logits(x), {k: ys[KIND_CLASS[k]] for k in SITE_KINDS}

    def weight_deltas_by_kind(self, components: Mapping[str, SiteComponents]) -> dict[str, Array]:
        """`{kind: W - (V @ U).T}`, `[n_layer, d_out, d_in]`, from components stacked per
        kind."""
        return {k: weight_delta(self.layers[k], components[k]) for k in SITE_KINDS}

    @property
    def site_kinds(self) -> dict[str, tuple[str, ...]]:
        """`{kind: its sites, layer ascending}` for the kinds `q`, `k`, ..., `down`."""
        n = self.config.n_layer
        return {k: tuple(site_name(i, k) for i in range(n)) for k in SITE_KINDS}

    def site_shapes(self) -> dict[str, tuple[int, int]]:
        """`{site: (d_in, d_out)}` in canonical order."""
        shapes = self.config.site_shapes()
        return {name: shapes[parse_site(name)[1]] for name in self.site_names}

    def site_weight(self, name: str) -> Array:
        """The weight `[d_out, d_in]` of one site."""
        layer, kind = parse_site(name)
        if layer >= self.config.n_layer:
            raise ValueError(f"site {name!r} is out of range for {self.config.n_layer} layers")
        return self.layers[kind][layer]


__all__ = ["KIND_CLASS", "SITE_KINDS", "GLUConfig", "GLUTransformer", "SiteApply"]
