"""Causal-importance (CI) function: a chunkwise transformer over site-input taps.

Sites are grouped into chunks of `sites_per_chunk` consecutive sites in canonical order. Per
chunk, with `x_s [batch, seq, d_in_s]` the input tap of site `s`:

    h     = concat_s rms_norm(x_s)                    [batch, seq, sum d_in]
    z     = h @ w_in.T + b_in                         [batch, seq, d_hidden]
    z     = z + attn(rms_norm(z))                     bidirectional, RoPE over seq  } n_blocks
    z     = z + mlp(rms_norm(z))                      GELU                          }
    pre   = rms_norm(z) @ w_out.T + b_out             [batch, seq, sum C]

and `pre` is split back per site into `[batch, seq, C_s]`. Every rms norm here is weightless.
Chunk parameters are stacked on a leading `n_chunks` axis and all chunks run under one vmap,
so the traced graph holds one chunk body whatever the number of chunks; this is why chunks
must be alike (same per-position `(d_in, C)` layout). See docs/design.md, "The subject: SPD
training".

Linear weights are `[d_out, d_in]`, applied as `x @ W.T`, as in the target model.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from decomp import nn
from decomp.config import CIConfig
from decomp.stacked import SiteLayout, gather_rows

#: Slope of the leaky parts of `ci_lower`'s backward and of `ci_upper` above 1. Small, so the
#: leak barely moves the forward of `ci_upper` and only nudges gradients outside [0, 1].
LEAK: float = 0.01

#: Per position in a chunk, `(d_in, C)` of the site there; the same for every chunk.
Layout = tuple[tuple[int, int], ...]


# --- chunks --------------------------------------------------------------------------------


def chunk_sites(
    site_names: Sequence[str],
    site_dims: Mapping[str, tuple[int, int]],
    sites_per_chunk: int,
) -> tuple[tuple[str, ...], ...]:
    """Group sites into consecutive chunks, in the given (canonical) order.

    Chunk parameters are stacked, so every chunk must be alike: the same number of taps,
    the same total C, the same concatenated input width and the same `(d_in, C)` at each
    position.

    **Arguments:**

    - `site_names`: the sites in canonical order.
    - `site_dims`: `{site: (d_in, C)}`, covering every site.
    - `sites_per_chunk`: sites per chunk, at least 1, dividing `len(site_names)`.

    **Returns:** the chunks, a tuple of tuples of site names. Raises a `ValueError` naming
    the first chunk that differs from chunk 0 and what differs.
    """
    names = tuple(site_names)
    if isinstance(sites_per_chunk, bool) or not isinstance(sites_per_chunk, int):
        raise ValueError(f"sites_per_chunk must be an int, got {sites_per_chunk!r}")
    if sites_per_chunk < 1:
        raise ValueError(f"sites_per_chunk must be at least 1, got {sites_per_chunk}")
    if not names:
        raise ValueError("no sites given: the CI function needs at least one site")
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"site names must be unique; repeated: {dupes}")
    missing = [n for n in names if n not in site_dims]
    if missing:
        raise ValueError(f"site_dims lacks (d_in, C) for {len(missing)} site(s): {missing[:5]}")
    for n in names:
        d_in, c = site_dims[n]
        if d_in < 1 or c < 1:
            raise ValueError(f"site {n!r}: d_in and C must be at least 1, got ({d_in}, {c})")
    if len(names) % sites_per_chunk:
        raise ValueError(
            f"chunks must partition the sites: sites_per_chunk={sites_per_chunk} does not "
            f"divide the {len(names)} sites; pick a divisor of {len(names)}"
        )
    chunks = tuple(names[i : i + sites_per_chunk] for i in range(0, len(names), sites_per_chunk))
    ref = _layout(chunks[0], site_dims)
    for j, chunk in enumerate(chunks[1:], start=1):
        lay = _layout(chunk, site_dims)
        what = _layout_difference(ref, lay)
        if what is not None:
            raise ValueError(
                f"chunks must be alike (their parameters are stacked), but chunk {j} "
                f"{list(chunk)} differs from chunk 0 {list(chunks[0])}: {what}"
            )
    return chunks


def _layout(chunk: Sequence[str], site_dims: Mapping[str, tuple[int, int]]) -> Layout:
    return tuple((int(site_dims[n][0]), int(site_dims[n][1])) for n in chunk)


def _layout_difference(ref: Layout, lay: Layout) -> str | None:
    if len(lay) != len(ref):
        return f"{len(lay)} taps, expected {len(ref)}"
    c_ref, c = sum(c for _, c in ref), sum(c for _, c in lay)
    if c != c_ref:
        return f"total C {c}, expected {c_ref}"
    d_ref, d = sum(d for d, _ in ref), sum(d for d, _ in lay)
    if d != d_ref:
        return f"concatenated input width {d}, expected {d_ref}"
    for p, (a, b) in enumerate(zip(ref, lay, strict=True)):
        if a != b:
            return f"(d_in, C) at position {p} is {b}, expected {a}"
    return None


# --- parameters ----------------------------------------------------------------------------


class CIBlocks(eqx.Module):
    """Weights of the chunk transformer's blocks; leading axes `[n_chunks, n_blocks]` in a
    `CIFunction`, `[n_blocks]` for one chunk.

    `wq`, `wk`, `wv`, `wo`: `[..., d_hidden, d_hidden]`; `w_mlp_in [..., d_mlp, d_hidden]`,
    `b_mlp_in [..., d_mlp]`, `w_mlp_out [..., d_hidden, d_mlp]`, `b_mlp_out [..., d_hidden]`.
    """

    wq: Array
    wk: Array
    wv: Array
    wo: Array
    w_mlp_in: Array
    b_mlp_in: Array
    w_mlp_out: Array
    b_mlp_out: Array


class _ChunkParams(NamedTuple):
    """One chunk's parameters (or, stacked, all chunks')."""

    w_in: Array
    b_in: Array
    blocks: CIBlocks
    w_out: Array
    b_out: Array


class CIFunction(eqx.Module):
    """The CI function: chunk parameters stacked on a leading `n_chunks` axis.

    - `w_in [n_chunks, d_hidden, sum d_in]`, `b_in [n_chunks, d_hidden]`.
    - `blocks`: `CIBlocks` with leaves `[n_chunks, n_blocks, ...]`.
    - `w_out [n_chunks, sum C, d_hidden]`, `b_out [n_chunks, sum C]`.
    - static: `config`, `chunks` (site names per chunk), and per position in a chunk
      `d_ins` and `cs`.
    """

    config: CIConfig = eqx.field(static=True)
    chunks: tuple[tuple[str, ...], ...] = eqx.field(static=True)
    d_ins: tuple[int, ...] = eqx.field(static=True)
    cs: tuple[int, ...] = eqx.field(static=True)
    w_in: Array
    b_in: Array
    blocks: CIBlocks
    w_out: Array
    b_out: Array

    @property
    def n_chunks(self) -> int:
        return len(self.chunks)

    @property
    def site_names(self) -> tuple[str, ...]:
        """Sites in canonical order."""
        return tuple(s for chunk in self.chunks for s in chunk)

    def _params(self) -> _ChunkParams:
        return _ChunkParams(self.w_in, self.b_in, self.blocks, self.w_out, self.b_out)


def _normal(key: Array, shape: tuple[int, ...]) -> Array:
    """`N(0, 1) / sqrt(fan_in)` in fp32, fan-in the last axis (weights are `[d_out, d_in]`).

    Drawn flat and reshaped: under vmap, XLA CPU compiles a batched draw over a flat shape
    several times faster than over a 2-D one (the batched key broadcast over the extra axis
    inside the threefry loop is what LLVM spends its time on).
    """
    return jax.random.normal(key, (math.prod(shape),), jnp.float32).reshape(shape) / np.sqrt(
        shape[-1]
    )


def _init_chunk(config: CIConfig, layout: Layout, key: Array) -> _ChunkParams:
    """One chunk's parameters from one key; the body both inits share (the legacy one loops
    over chunks, the new one vmaps), which is what makes them bit-identical.

    One key per weight kind, each drawing that weight for all `n_blocks` blocks at once: the
    body holds 8 draws whatever `n_blocks`, and no vmap over blocks nests inside the vmap
    over chunks (a doubly batched draw is slower still to compile).
    """
    d, m, nb = config.d_hidden, config.d_mlp, config.n_blocks
    d_in = sum(d_in for d_in, _ in layout)
    c = sum(c for _, c in layout)
    k_in, k_out, kq, kk, kv, ko, k_mlp_in, k_mlp_out = jax.random.split(key, 8)
    blocks = CIBlocks(
        wq=_normal(kq, (nb, d, d)),
        wk=_normal(kk, (nb, d, d)),
        wv=_normal(kv, (nb, d, d)),
        wo=_normal(ko, (nb, d, d)),
        w_mlp_in=_normal(k_mlp_in, (nb, m, d)),
        b_mlp_in=jnp.zeros((nb, m), jnp.float32),
        w_mlp_out=_normal(k_mlp_out, (nb, d, m)),
        b_mlp_out=jnp.zeros((nb, d), jnp.float32),
    )
    return _ChunkParams(
        w_in=_normal(k_in, (d, d_in)),
        b_in=jnp.zeros((d,), jnp.float32),
        blocks=blocks,
        w_out=_normal(k_out, (c, d)),
        b_out=jnp.zeros((c,), jnp.float32),
    )


def _assemble(
    config: CIConfig,
    chunks: tuple[tuple[str, ...], ...],
    layout: Layout,
    params: _ChunkParams,
) -> CIFunction:
    return CIFunction(
        config=config,
        chunks=chunks,
        d_ins=tuple(d for d, _ in layout),
        cs=tuple(c for _, c in layout),
        w_in=params.w_in,
        b_in=params.b_in,
        blocks=params.blocks,
        w_out=params.w_out,
        b_out=params.b_out,
    )


def init_ci_function(
    config: CIConfig,
    site_names: Sequence[str],
    site_dims: Mapping[str, tuple[int, int]],
    *,
    key: Array,
) -> CIFunction:
    """Initialise the CI function: chunk `i` from `fold_in(key, i)`, all chunks in one vmap.

    Weights `N(0, 1) / sqrt(fan_in)`, biases zero. The init body is traced once whatever the
    number of chunks (the legacy `decomp.legacy.init_ci_function` traces it once per chunk);
    the two give bit-identical parameters. Call it under `jax.jit` for one compile.

    **Arguments:**

    - `config`: the structure.
    - `site_names`: the sites in canonical order.
    - `site_dims`: `{site: (d_in, C)}`.
    - `key`: a PRNG key (keyword-only).

    **Returns:** a `CIFunction` with `n_chunks = len(site_names) / config.sites_per_chunk`.
    """
    chunks = chunk_sites(site_names, site_dims, config.sites_per_chunk)
    layout = _layout(chunks[0], site_dims)
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(len(chunks)))
    params = jax.vmap(functools.partial(_init_chunk, config, layout))(keys)
    return _assemble(config, chunks, layout, params)


# --- forward -------------------------------------------------------------------------------


def _apply_block(
    config: CIConfig, z: Array, block: CIBlocks, cos: Array, sin: Array
) -> tuple[Array, None]:
    b, t, _ = z.shape
    shape = (b, t, config.n_head, config.head_dim)
    h = nn.rms_norm(z, None, config.eps)
    q = nn.apply_rope((h @ block.wq.T).reshape(shape), cos, sin)
    k = nn.apply_rope((h @ block.wk.T).reshape(shape), cos, sin)
    v = (h @ block.wv.T).reshape(shape)
    z = z + nn.attention(q, k, v, causal=False) @ block.wo.T
    h = nn.rms_norm(z, None, config.eps)
    # Exact (erf) GELU, as torch's nn.GELU() default.
    inner = jax.nn.gelu(h @ block.w_mlp_in.T + block.b_mlp_in, approximate=False)
    return z + inner @ block.w_mlp_out.T + block.b_mlp_out, None


def _apply_chunk(config: CIConfig, params: _ChunkParams, h: Array, cos: Array, sin: Array) -> Array:
    """One chunk: `h [batch, seq, sum d_in]` (normed taps, concatenated) -> `[batch, seq,
    sum C]`."""
    z = h @ params.w_in.T + params.b_in
    z, _ = jax.lax.scan(lambda z, blk: _apply_block(config, z, blk, cos, sin), z, params.blocks)
    return nn.rms_norm(z, None, config.eps) @ params.w_out.T + params.b_out


def ci_pre_activations_by_position(
    ci: CIFunction, by_position: Sequence[Array], seq: int
) -> list[Array]:
    """The chunk transformer, every chunk under one vmap, on taps grouped by chunk position.

    **Arguments:**

    - `ci`: the CI function.
    - `by_position`: `by_position[p] [n_chunks, batch, seq, d_in_p]`, the raw tap at
      position `p` of every chunk.
    - `seq`: the sequence length (the RoPE table's).

    **Returns:** the pre-activations per position, `[n_chunks, batch, seq, C_p]`.
    """
    cfg = ci.config
    # Each norm is one op for all chunks, then the positions are concatenated:
    # [n_chunks, b, t, sum d_in].
    h = jnp.concatenate([nn.rms_norm(x, None, cfg.eps) for x in by_position], axis=-1)
    cos, sin = nn.rope_cos_sin(nn.rope_inv_freq(cfg.head_dim, cfg.rope_theta), seq)
    pre = jax.vmap(lambda params, hc: _apply_chunk(cfg, params, hc, cos, sin))(ci._params(), h)
    return jnp.split(pre, np.cumsum(ci.cs)[:-1].tolist(), axis=-1)


def ci_pre_activations_by_kind(
    ci: CIFunction, taps: Mapping[str, Array], layout: SiteLayout
) -> dict[str, Array]:
    """CI pre-activations of every site, stacked per kind: `taps` is `{kind: [n_kind,
    batch, seq, d_in]}` (row `l`: the input of the kind's `l`-th site) and so is the result,
    `{kind: [n_kind, batch, seq, C]}`. The taps are regrouped by chunk position for
    `ci_pre_activations_by_position`, then back by kind, in a number of operations that does
    not grow with the number of sites (the per-site form, `decomp.legacy.ci_pre_activations`,
    gives the same numbers).
    """
    if sorted(layout.names) != sorted(ci.site_names):
        raise ValueError("the layout's sites are not the CI function's sites")
    where = layout.where()
    for kind, sites in layout.kinds:
        x = taps[kind]
        if x.ndim != 4 or x.shape[0] != len(sites):
            raise ValueError(
                f"taps[{kind!r}] has shape {tuple(x.shape)}; expected "
                f"[{len(sites)}, batch, seq, d_in]"
            )
    seq = next(iter(taps.values())).shape[2]
    positions = [
        gather_rows(taps, [where[chunk[p]] for chunk in ci.chunks]) for p in range(len(ci.d_ins))
    ]
    parts = dict(enumerate(ci_pre_activations_by_position(ci, positions, seq)))
    slot = {site: (p, j) for j, chunk in enumerate(ci.chunks) for p, site in enumerate(chunk)}
    return {kind: gather_rows(parts, [slot[s] for s in sites]) for kind, sites in layout.kinds}


# --- importances ---------------------------------------------------------------------------


@jax.custom_jvp
def ci_lower(x: Array) -> Array:
    """Lower causal importance: `clip(x, 0, 1)` in the forward, leaky in the backward.

    The derivative is 1 on [0, 1] (ends included) and `LEAK` outside, so a pre-activation
    stuck outside the box still gets a (small) gradient back toward it.

    **Arguments:**

    - `x`: pre-activations `[...]`.

    **Returns:** `[...]` in [0, 1].
    """
    return jnp.clip(x, 0, 1)


@ci_lower.defjvp
def _ci_lower_jvp(primals: tuple[Array], tangents: tuple[Array]) -> tuple[Array, Array]:
    (x,), (t,) = primals, tangents
    slope = jnp.where((x >= 0) & (x <= 1), 1.0, LEAK).astype(t.dtype)
    return ci_lower(x), t * slope


def ci_upper(x: Array) -> Array:
    """Upper causal importance: 0 below 0, `x` on [0, 1], `1 + LEAK * (x - 1)` above 1.

    Plain autodiff: derivative 0 below 0, 1 on [0, 1], `LEAK` above 1. Minimality losses use
    it, so values above 1 are still (gently) penalised.

    **Arguments:**

    - `x`: pre-activations `[...]`.

    **Returns:** `[...]`, at least 0.
    """
    return jnp.where(x < 0, 0.0, jnp.where(x > 1, 1 + LEAK * (x - 1), x)).astype(x.dtype)


def causal_importances_by_kind(
    ci: CIFunction, taps: Mapping[str, Array], layout: SiteLayout
) -> tuple[dict[str, Array], dict[str, Array]]:
    """`ci_lower` and `ci_upper` of the pre-activations of every site, stacked per kind.

    **Arguments:**

    - `ci`: the CI function.
    - `taps`: `{kind: [n_kind, batch, seq, d_in]}` (see `ci_pre_activations_by_kind`).
    - `layout`: which sites each kind stacks.

    **Returns:** `(lower, upper)`, each `{kind: [n_kind, batch, seq, C]}`.
    """
    pre = ci_pre_activations_by_kind(ci, taps, layout)
    return (
        {k: ci_lower(x) for k, x in pre.items()},
        {k: ci_upper(x) for k, x in pre.items()},
    )
