"""The stacked layout (`decomp.stacked`) and every `_by_kind` form against its per-site form,
bitwise: the per-site views, the inits, the masks and routing, the CI function, the frozen
forward's taps, the weight deltas and the components' global norm.

The GLU here has every site input 32 wide, so that CI chunks of 2 sites are alike and mix
kinds (chunk 0 holds layer 0's `q` and `k`, chunk 3 layer 0's `down` and layer 1's `q`):
regrouping from chunk positions to kinds is then no plain reshape.
"""

from __future__ import annotations

import functools
import operator

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from decomp import legacy
from decomp.ci_function import causal_importances_by_kind, init_ci_function
from decomp.components import init_components_by_kind
from decomp.config import CIConfig
from decomp.legacy import causal_importances, init_components, route_chunk, stochastic_masks
from decomp.masks import recon_chunks, route_chunk_by_kind, stochastic_masks_by_kind
from decomp.sources import init_sources, init_sources_by_kind
from decomp.stacked import SiteLayout, gather_rows, sum_in_order
from decomp.targets.glu_transformer import GLUConfig, GLUTransformer
from decomp.targets.toy import ResidMLP, ResidMLPConfig
from decomp.train import site_global_norm

C = 3


def assert_bitwise(actual: dict, expected: dict) -> None:
    """Same keys; per key, the same pytree structure and bit-identical leaves."""
    assert sorted(actual) == sorted(expected)
    for k in expected:
        assert jax.tree.structure(actual[k]) == jax.tree.structure(expected[k]), k
        for a, e in zip(jax.tree.leaves(actual[k]), jax.tree.leaves(expected[k]), strict=True):
            a, e = np.asarray(a), np.asarray(e)
            assert a.shape == e.shape and a.dtype == e.dtype, (k, a.shape, e.shape)
            assert a.tobytes() == e.tobytes(), f"{k}: not bit-identical"


@functools.cache
def glu() -> tuple[GLUTransformer, SiteLayout]:
    cfg = GLUConfig(n_layer=2, d_model=32, n_head=2, n_kv_head=1, head_dim=16, d_mlp=32,
                    vocab_size=64)  # fmt: skip
    model = jax.jit(lambda k: GLUTransformer.init(cfg, key=k))(jax.random.key(0))
    return model, SiteLayout.of(model)


# --- the layout ------------------------------------------------------------------------------


def test_layout_must_partition_the_sites():
    with pytest.raises(ValueError, match="partition"):
        SiteLayout(("a", "b", "c"), (("x", ("a", "b")),))
    with pytest.raises(ValueError, match="partition"):
        SiteLayout(("a", "b"), (("x", ("a", "b")), ("y", ("a",))))
    layout = SiteLayout(("a", "b"), (("x", ("b", "a")),))
    with pytest.raises(ValueError, match="missing 1: b"):
        layout.from_sites({"a": jnp.zeros(2)})


def test_views_round_trip_and_canonical_order_with_interleaved_kinds():
    layout = SiteLayout(("a", "b", "c", "d", "e"), (("x", ("a", "c", "e")), ("y", ("b", "d"))))
    per_site = {s: jnp.full((2,), i, jnp.float32) for i, s in enumerate(layout.names)}
    stacked = layout.from_sites(per_site)
    assert stacked["x"].shape == (3, 2) and stacked["y"].shape == (2, 2)
    assert_bitwise(layout.to_sites(stacked), per_site)
    canonical = np.asarray(layout.canonical(stacked))
    np.testing.assert_array_equal(canonical[:, 0], np.arange(5))
    np.testing.assert_array_equal(layout.positions("x"), [0, 2, 4])


def test_gather_rows_takes_any_rows_in_any_order():
    rng = np.random.default_rng(0)
    sources = {"p": rng.normal(size=(4, 3)), "q": rng.normal(size=(2, 3))}
    sources = {k: v.astype(np.float32) for k, v in sources.items()}
    picks = [("q", 1), ("p", 3), ("p", 0), ("q", 0), ("p", 3)]
    got = np.asarray(gather_rows({k: jnp.asarray(v) for k, v in sources.items()}, picks))
    np.testing.assert_array_equal(got, np.stack([sources[k][r] for k, r in picks]))


def test_sum_in_order_adds_one_at_a_time_as_python_sum_does():
    # Magnitudes far apart, so that the order of additions shows in the last bits.
    values = np.asarray([1e8, 3.0, -1e8, 0.3, 7e-3, 5e7, 1.1, -5e7, 0.9], np.float32)
    want = functools.reduce(operator.add, (np.float32(v) for v in values), np.float32(0))
    got = jax.jit(sum_in_order)(jnp.asarray(values))
    assert np.asarray(got).tobytes() == np.float32(want).tobytes()


# --- inits -----------------------------------------------------------------------------------


def test_components_and_sources_by_kind_are_the_per_site_draws_stacked():
    model, layout = glu()
    shapes = model.site_shapes()
    key = jax.random.key(3)
    per_site = jax.jit(lambda k: init_components(shapes, C, key=k))(key)
    stacked = jax.jit(lambda k: init_components_by_kind(layout, shapes, C, key=k))(key)
    assert_bitwise(layout.to_sites(stacked), per_site)
    for dtype in (jnp.float32, jnp.bfloat16):
        src = init_sources(dict.fromkeys(layout.names, C), 5, key=key, dtype=dtype)
        src_by_kind = init_sources_by_kind(layout, C, 5, key=key, dtype=dtype)
        assert_bitwise(layout.to_sites(src_by_kind), src)


# --- masks and routing ----------------------------------------------------------------------


def _lower(layout: SiteLayout, shape: tuple[int, ...]) -> dict[str, jax.Array]:
    key = jax.random.key(8)
    return {
        s: jax.random.uniform(jax.random.fold_in(key, i), (*shape, C))
        for i, s in enumerate(layout.names)
    }


def test_stochastic_masks_and_routing_by_kind_match_the_per_site_ones():
    _, layout = glu()
    key = jax.random.key(9)
    # The importances are made inside each jit: a dict passed into a jit arrives in sorted-key
    # order, and the per-site draw numbers the sites in its mapping's (canonical) order.
    masks = jax.jit(lambda: stochastic_masks(_lower(layout, (2, 5)), key=key))()
    by_kind = jax.jit(
        lambda: stochastic_masks_by_kind(layout.from_sites(_lower(layout, (2, 5))), layout, key=key)
    )()
    assert_bitwise(layout.to_sites(by_kind), masks)
    chunks = recon_chunks(layout.names, 7)
    for c in range(len(chunks)):
        want = jax.jit(lambda m, c=c: route_chunk(m, chunks, c, key=key))(masks)
        got = jax.jit(lambda m, c=c: route_chunk_by_kind(m, layout, chunks, c, key=key))(by_kind)
        assert_bitwise(layout.to_sites(got), want)


# --- CI function, taps, weight deltas, norm ---------------------------------------------------


@pytest.mark.parametrize("sites_per_chunk", [2, 7])
def test_causal_importances_by_kind_match_the_per_site_ones(sites_per_chunk):
    model, layout = glu()
    config = CIConfig(d_hidden=16, n_blocks=1, n_head=2, d_mlp=32, sites_per_chunk=sites_per_chunk)
    dims = {s: (32, C) for s in layout.names}
    ci = jax.jit(lambda k: init_ci_function(config, layout.names, dims, key=k))(jax.random.key(4))
    tokens = jax.random.randint(jax.random.key(5), (2, 6), 0, 64)
    _, taps = jax.jit(lambda m, x: m.clean_output_and_activations(x, m.site_names))(model, tokens)
    lower, upper = jax.jit(causal_importances)(ci, taps)
    lower_k, upper_k = jax.jit(lambda c, t: causal_importances_by_kind(c, t, layout))(
        ci, layout.from_sites(taps)
    )
    assert_bitwise(layout.to_sites(lower_k), lower)
    assert_bitwise(layout.to_sites(upper_k), upper)


def test_frozen_forward_by_kind_is_the_per_site_taps_stacked():
    model, layout = glu()
    tokens = jax.random.randint(jax.random.key(5), (2, 6), 0, 64)
    logits, taps = jax.jit(lambda m, x: m.clean_output_and_activations(x, m.site_names))(
        model, tokens
    )
    logits_k, taps_k = jax.jit(lambda m, x: m.clean_output_and_taps_by_kind(x))(model, tokens)
    assert np.asarray(logits_k).tobytes() == np.asarray(logits).tobytes()
    assert_bitwise(layout.to_sites(taps_k), taps)


@pytest.mark.parametrize("target", ["glu", "resid_mlp"])
def test_weight_deltas_and_norm_by_kind_match_the_per_site_ones(target):
    if target == "glu":
        model, layout = glu()
    else:
        cfg = ResidMLPConfig(n_features=6, d_embed=5, d_mlp=7, n_layers=3)
        model = jax.jit(lambda k: ResidMLP.init(cfg, key=k))(jax.random.key(0))
        layout = SiteLayout.of(model)
        assert [k for k, _ in layout.kinds] == ["mlp_in", "mlp_out"]
    comps = jax.jit(lambda k: init_components(model.site_shapes(), C, key=k))(jax.random.key(6))
    deltas = jax.jit(legacy.weight_deltas)(model, comps)
    deltas_k = jax.jit(lambda m, c: m.weight_deltas_by_kind(c))(model, layout.from_sites(comps))
    got = layout.to_sites(deltas_k)
    for s in layout.names:
        np.testing.assert_allclose(np.asarray(got[s]), np.asarray(deltas[s]), rtol=0, atol=1e-6)
    norm = jax.jit(optax.tree.norm)(comps)
    norm_k = jax.jit(lambda c: site_global_norm(c, layout))(layout.from_sites(comps))
    assert np.asarray(norm_k).tobytes() == np.asarray(norm).tobytes()
