"""The CI function: vmapped init against the legacy loop init, chunk validation, the chunk
transformer against a from-scratch reference, and the lower/upper importances."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from decomp import legacy, nn
from decomp.ci_function import (
    LEAK,
    CIFunction,
    _apply_chunk,
    _init_chunk,
    chunk_sites,
    ci_lower,
    ci_upper,
    init_ci_function,
)
from decomp.config import CIConfig
from decomp.legacy import causal_importances, ci_pre_activations
from decomp.taps import SITE_KINDS, parse_site, site_names
from parity import assert_equivalent

# d_mlp = d_hidden keeps the number of distinct draw shapes (so of eager compiles) small.
CFG = dict(d_hidden=8, n_blocks=2, n_head=2, d_mlp=8)


def _glu_layout(n_layer: int = 2, c: int = 3) -> tuple[tuple[str, ...], dict[str, tuple[int, int]]]:
    """Sites of a small GLU model (d_model 8, d_mlp 16): one chunk per layer of 7 sites."""
    d_in = {"q": 8, "k": 8, "v": 8, "o": 8, "gate": 8, "up": 8, "down": 16}
    names = site_names(n_layer)
    return names, {n: (d_in[parse_site(n)[1]], c) for n in names}


def _alternating_layout() -> tuple[tuple[str, ...], dict[str, tuple[int, int]]]:
    names = tuple(f"s{i}" for i in range(6))
    return names, {n: ((4, 2) if i % 2 == 0 else (6, 3)) for i, n in enumerate(names)}


def _single_site_layout() -> tuple[tuple[str, ...], dict[str, tuple[int, int]]]:
    names = ("a", "b", "c")
    return names, {n: (5, 4) for n in names}


LAYOUTS = {
    "glu_2x7": (_glu_layout, 7),
    "alternating_3x2": (_alternating_layout, 2),
    "single_site_3x1": (_single_site_layout, 1),
}


def _setup(layout: str) -> tuple[CIConfig, tuple[str, ...], dict[str, tuple[int, int]]]:
    make, spc = LAYOUTS[layout]
    names, dims = make()
    return CIConfig(**CFG, sites_per_chunk=spc), names, dims


@functools.cache
def _jitted_init(layout: str):
    cfg, names, dims = _setup(layout)
    return jax.jit(lambda key: init_ci_function(cfg, names, dims, key=key))


def _init(layout: str, seed: int = 0) -> CIFunction:
    """The layout's CI function, from a jit compiled once per layout for the whole module."""
    return _jitted_init(layout)(jax.random.key(seed))


def _assert_leaves_bit_identical(new: CIFunction, old: CIFunction) -> None:
    assert (new.chunks, new.d_ins, new.cs, new.config) == (
        old.chunks,
        old.d_ins,
        old.cs,
        old.config,
    )

    def per_device(a: jax.Array) -> dict[str, np.ndarray]:
        return {f"device{s.device.id}": np.asarray(s.data) for s in a.addressable_shards}

    # Every leaf, on every addressable shard, bit for bit (keys: "blocks.wq.device0").
    assert_equivalent(jax.tree.map(per_device, new), jax.tree.map(per_device, old))


# --- init ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "mode"),
    [
        ("single_site_3x1", "eager"),
        ("glu_2x7", "jit_replicated"),
        ("alternating_3x2", "jit"),
    ],
)
def test_vmapped_init_is_bit_identical_to_legacy_loop_init(layout, mode):
    cfg, names, dims = _setup(layout)
    key = jax.random.key(42)

    def new(k):
        return init_ci_function(cfg, names, dims, key=k)

    def old(k):
        return legacy.init_ci_function(cfg, names, dims, key=k)

    if mode == "jit":
        new, old = _jitted_init(layout), jax.jit(old)
    elif mode == "jit_replicated":
        rep = NamedSharding(Mesh(np.array(jax.devices()), ("dp",)), PartitionSpec())
        new, old = jax.jit(new, out_shardings=rep), jax.jit(old, out_shardings=rep)
    a, b = new(key), old(key)
    n_chunks = len(names) // cfg.sites_per_chunk
    assert a.n_chunks == n_chunks and a.w_in.shape[0] == n_chunks
    assert a.blocks.wq.shape == (n_chunks, cfg.n_blocks, cfg.d_hidden, cfg.d_hidden)
    _assert_leaves_bit_identical(a, b)


def test_chunk_i_is_initialised_from_fold_in_of_key_i():
    cfg = _setup("alternating_3x2")[0]
    key = jax.random.key(5)
    ci = _init("alternating_3x2", 5)
    chunk = jax.jit(lambda k: _init_chunk(cfg, ((4, 2), (6, 3)), k))
    for i in range(ci.n_chunks):
        want = chunk(jax.random.fold_in(key, i))
        for a, b in zip(jax.tree.leaves(ci._params()), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(np.asarray(a[i]), np.asarray(b), err_msg=f"chunk {i}")
    assert not np.array_equal(np.asarray(ci.w_in[0]), np.asarray(ci.w_in[1]))


# --- validation ----------------------------------------------------------------------------


def test_chunk_sites_groups_consecutive_sites_in_order():
    names, dims = _glu_layout(n_layer=2)
    chunks = chunk_sites(names, dims, 7)
    assert chunks == (names[:7], names[7:])
    assert [parse_site(s)[1] for s in chunks[1]] == list(SITE_KINDS)


@pytest.mark.parametrize(
    ("dims", "spc", "match"),
    [
        ({"a": (4, 2), "b": (4, 2), "c": (4, 2)}, 2, r"chunks must partition the sites.*3 sites"),
        ({"a": (4, 2), "b": (4, 2)}, 0, "sites_per_chunk must be at least 1, got 0"),
        (
            {"a": (4, 2), "b": (4, 2), "c": (4, 2), "d": (4, 3)},
            2,
            r"chunk 1 .*total C 5, expected 4",
        ),
        (
            {"a": (4, 2), "b": (4, 2), "c": (4, 2), "d": (5, 2)},
            2,
            r"chunk 1 .*input width 9, expected 8",
        ),
        (
            {"a": (4, 2), "b": (6, 3), "c": (6, 3), "d": (4, 2)},
            2,
            r"chunk 1 .*position 0 is \(6, 3\)",
        ),
        (
            {"a": (4, 2), "b": (4, 2), "c": (4, 2), "d": (4, 2), "e": (4, 2), "f": (4, 1)},
            3,
            "chunk 1",
        ),
    ],
    ids=["non_partition", "zero_per_chunk", "total_c", "input_width", "layout", "later_chunk"],
)
def test_chunk_sites_rejects_bad_chunking_with_a_named_reason(dims, spc, match):
    with pytest.raises(ValueError, match=match):
        chunk_sites(list(dims), dims, spc)


def test_chunk_sites_rejects_missing_dims():
    with pytest.raises(ValueError, match=r"site_dims lacks .*\['b'\]"):
        chunk_sites(["a", "b"], {"a": (4, 2)}, 1)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"d_hidden": 0}, "d_hidden must be a positive int"),
        ({"n_blocks": -1}, "n_blocks must be a positive int"),
        ({"sites_per_chunk": 0}, "sites_per_chunk must be a positive int"),
        ({"d_hidden": 9, "n_head": 2}, "must divide d_hidden"),
        ({"d_hidden": 6, "n_head": 2}, "head dim .* = 3 must be even"),
    ],
)
def test_ci_config_rejects_bad_structure(kw, match):
    args = {**CFG, "sites_per_chunk": 1, **kw}
    with pytest.raises(ValueError, match=match):
        CIConfig(**args)


def test_pre_activations_reject_missing_or_misshapen_taps():
    names = _setup("single_site_3x1")[1]
    ci = _init("single_site_3x1", 0)
    taps = {n: jnp.ones((1, 4, 5)) for n in names}
    with pytest.raises(ValueError, match=r"lack 1 site input.*\['c'\]"):
        ci_pre_activations(ci, {n: taps[n] for n in names[:2]})
    with pytest.raises(ValueError, match=r"'b' .* shape \(1, 4, 6\); expected \[batch, seq, 5\]"):
        ci_pre_activations(ci, {**taps, "b": jnp.ones((1, 4, 6))})


# --- forward -------------------------------------------------------------------------------


def _taps(names, dims, batch=2, seq=5, seed=1):
    rng = np.random.default_rng(seed)
    # Unequal scales per site: the per-site rms norm must take them out.
    return {
        n: jnp.asarray((1 + i) * rng.standard_normal((batch, seq, dims[n][0])), jnp.float32)
        for i, n in enumerate(names)
    }


def test_pre_activations_have_one_batch_seq_c_array_per_site():
    _, names, dims = _setup("glu_2x7")
    ci = _init("glu_2x7", 0)
    taps = {**_taps(names, dims), "resid.0": jnp.zeros(3)}  # extra taps are ignored
    pre = jax.jit(ci_pre_activations)(ci, taps)
    assert set(pre) == set(names)
    for n in names:
        assert pre[n].shape == (2, 5, dims[n][1]) and pre[n].dtype == jnp.float32, n
        assert np.all(np.isfinite(np.asarray(pre[n])))


def _reference_pre_activations(ci: CIFunction, taps):
    """The chunk transformer written out from the equations, one chunk at a time in a Python
    loop, sharing no code with `decomp` (its own norm, RoPE and attention)."""
    cfg = ci.config
    hd = cfg.head_dim

    def norm(x):
        return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + cfg.eps)

    def rope(x):  # [b, t, h, hd]
        t = x.shape[1]
        inv = cfg.rope_theta ** (-jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
        ang = jnp.arange(t, dtype=jnp.float32)[:, None] * inv[None, :]  # [t, hd/2]
        cos, sin = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    out = {}
    for j, chunk in enumerate(ci.chunks):
        z = jnp.concatenate([norm(taps[s]) for s in chunk], -1) @ ci.w_in[j].T + ci.b_in[j]
        b, t, _ = z.shape
        for layer in range(cfg.n_blocks):
            p = jax.tree.map(lambda a, j=j, layer=layer: a[j, layer], ci.blocks)
            h = norm(z)
            q = rope((h @ p.wq.T).reshape(b, t, cfg.n_head, hd))
            k = rope((h @ p.wk.T).reshape(b, t, cfg.n_head, hd))
            v = (h @ p.wv.T).reshape(b, t, cfg.n_head, hd)
            att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd), axis=-1)
            z = z + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, t, -1) @ p.wo.T
            u = norm(z) @ p.w_mlp_in.T + p.b_mlp_in
            gelu = 0.5 * u * (1 + jax.scipy.special.erf(u / math.sqrt(2)))
            z = z + gelu @ p.w_mlp_out.T + p.b_mlp_out
        pre = norm(z) @ ci.w_out[j].T + ci.b_out[j]
        start = 0
        for s, c in zip(chunk, ci.cs, strict=True):
            out[s] = pre[..., start : start + c]
            start += c
    return out


def _perturbed(ci: CIFunction) -> CIFunction:
    """Non-zero biases and distinct chunks, so that a parameter applied to the wrong chunk or
    position shows."""
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda a: a + jnp.asarray(0.1 * rng.standard_normal(a.shape), a.dtype), ci)


def test_vmapped_chunks_match_a_per_chunk_python_loop():
    cfg, names, dims = _setup("glu_2x7")
    ci = _perturbed(_init("glu_2x7", 3))
    taps = _taps(names, dims)

    @jax.jit
    def loop(ci, taps):
        cos, sin = nn.rope_cos_sin(nn.rope_inv_freq(cfg.head_dim, cfg.rope_theta), 5)
        out = {}
        for j, chunk in enumerate(ci.chunks):
            h = jnp.concatenate([nn.rms_norm(taps[s], None, cfg.eps) for s in chunk], -1)
            params = jax.tree.map(lambda a, j=j: a[j], ci._params())
            pre = _apply_chunk(cfg, params, h, cos, sin)
            out.update(zip(chunk, jnp.split(pre, np.cumsum(ci.cs)[:-1].tolist(), -1), strict=True))
        return out

    got = jax.jit(ci_pre_activations)(ci, taps)
    want = loop(ci, taps)
    for n in names:
        np.testing.assert_allclose(got[n], want[n], rtol=1e-6, atol=1e-6, err_msg=n)


def test_pre_activations_match_the_equations_written_out():
    _, names, dims = _setup("alternating_3x2")
    ci = _perturbed(_init("alternating_3x2", 3))
    taps = _taps(names, dims)
    got = jax.jit(ci_pre_activations)(ci, taps)
    want = jax.jit(_reference_pre_activations)(ci, taps)
    # The reference orders its float ops differently (its own norm, RoPE, attention, GELU):
    # agreement to fp32 reassociation error over two blocks, not bits.
    for n in names:
        np.testing.assert_allclose(got[n], want[n], rtol=1e-5, atol=1e-5, err_msg=n)


def test_causal_importances_are_lower_and_upper_of_the_pre_activations():
    _, names, dims = _setup("alternating_3x2")
    ci = _init("alternating_3x2", 0)
    pre, (lower, upper) = jax.jit(
        lambda ci, t: (ci_pre_activations(ci, t), causal_importances(ci, t))
    )(ci, _taps(names, dims))
    assert set(lower) == set(upper) == set(names)
    for n in names:
        np.testing.assert_array_equal(np.asarray(lower[n]), np.clip(np.asarray(pre[n]), 0, 1))
        np.testing.assert_array_equal(np.asarray(upper[n]), np.asarray(ci_upper(pre[n])))


# --- importances ---------------------------------------------------------------------------

X = np.array([-2.0, -0.5, 0.0, 0.3, 1.0, 1.5, 3.0], np.float32)
W = np.array([1.0, -2.0, 3.0, 0.5, -1.0, 2.0, 4.0], np.float32)


def test_ci_lower_clips_forward_and_leaks_backward_outside_unit_interval():
    want = np.array([0, 0, 0, 0.3, 1, 1, 1], np.float32)
    np.testing.assert_array_equal(np.asarray(ci_lower(X)), want)
    grad = jax.grad(lambda x: jnp.sum(W * ci_lower(x)))(jnp.asarray(X))
    # d/dx = 1 on [0, 1] (ends included), LEAK outside.
    slope = np.array([LEAK, LEAK, 1, 1, 1, LEAK, LEAK], np.float32)
    np.testing.assert_allclose(np.asarray(grad), W * slope, rtol=1e-7)
    _, tangent = jax.jvp(ci_lower, (jnp.asarray(X),), (jnp.asarray(W),))
    np.testing.assert_allclose(np.asarray(tangent), W * slope, rtol=1e-7)


def test_ci_upper_is_zero_below_identity_inside_and_leaky_above_one():
    want = np.array([0, 0, 0, 0.3, 1, 1 + 0.5 * LEAK, 1 + 2 * LEAK], np.float32)
    np.testing.assert_allclose(np.asarray(ci_upper(X)), want, rtol=1e-7)
    grad = jax.grad(lambda x: jnp.sum(W * ci_upper(x)))(jnp.asarray(X))
    slope = np.array([0, 0, 1, 1, 1, LEAK, LEAK], np.float32)
    np.testing.assert_allclose(np.asarray(grad), W * slope, rtol=1e-7)


def test_gradients_reach_every_chunk_parameter():
    _, names, dims = _setup("alternating_3x2")
    ci = _init("alternating_3x2", 0)
    taps = _taps(names, dims)

    def loss(ci):
        lower, upper = causal_importances(ci, taps)
        return sum(
            jnp.sum(lo) + jnp.sum(up) for lo, up in zip(lower.values(), upper.values(), strict=True)
        )

    grads = jax.jit(jax.grad(loss))(ci)
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        per_chunk = np.abs(np.asarray(g)).reshape(g.shape[0], -1).sum(-1)
        assert np.all(per_chunk > 0), (jax.tree_util.keystr(path), per_chunk)
