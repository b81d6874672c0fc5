"""Toy targets (SimpleMLP, TMS, ResidMLP): shapes, taps against hand-written forwards, and
masked runs that reduce to the clean one."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
from _jitted import clean, fused, read

from decomp import DecomposedModel, legacy
from decomp.components import SiteComponents, SiteMask
from decomp.stacked import SiteLayout
from decomp.targets import (
    TMS,
    ResidMLP,
    ResidMLPConfig,
    SimpleMLP,
    SimpleMLPConfig,
    TMSConfig,
)

BATCH, C = 5, 3


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


def manual_simple_mlp(m: SimpleMLP, x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    w = [np.asarray(a) for a in m.weights]
    b = [np.asarray(a) for a in m.biases]
    x0 = x
    x1 = relu(x0 @ w[0].T + b[0])
    x2 = relu(x1 @ w[1].T + b[1])
    out = x2 @ w[2].T + b[2]
    return out, {"layers.0": x0, "layers.1": x1, "layers.2": x2}


def manual_tms(m: TMS, x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    w, b = np.asarray(m.W), np.asarray(m.b)
    h = x @ w.T
    return relu(h @ w + b), {"linear1": x, "linear2": h}


def manual_resid_mlp(m: ResidMLP, x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    w_e, w_in, b_in, w_out = (np.asarray(a) for a in (m.W_E, m.W_in, m.b_in, m.W_out))
    r0 = x @ w_e.T
    h0 = relu(r0 @ w_in[0].T + b_in[0])
    r1 = r0 + h0 @ w_out[0].T
    h1 = relu(r1 @ w_in[1].T + b_in[1])
    r2 = r1 + h1 @ w_out[1].T
    taps = {
        "layers.0.mlp_in": r0,
        "layers.0.mlp_out": h0,
        "layers.1.mlp_in": r1,
        "layers.1.mlp_out": h1,
    }
    return r2 @ w_e, taps


def init(cls, config, seed: int):
    """`cls.init(config)` in one compiled program (eager random ops compile one by one)."""
    return jax.jit(lambda s: cls.init(config, key=jax.random.key(s)))(seed)


# name: (model, d_in, d_out, sites {name: (d_in, d_out)}, manual forward). Smaller and more
# uneven widths than the toy golden's (`producers.toy_group`): no two widths of a model agree,
# so a transposed or misrouted weight fails on its shape.
TOYS = {
    "simple_mlp": (
        init(SimpleMLP, SimpleMLPConfig(d_in=6, d_hidden=(8, 7), d_out=4), 0),
        6,
        4,
        {"layers.0": (6, 8), "layers.1": (8, 7), "layers.2": (7, 4)},
        manual_simple_mlp,
    ),
    "tms": (
        init(TMS, TMSConfig(n_features=5, n_hidden=2), 1),
        5,
        5,
        {"linear1": (5, 2), "linear2": (2, 5)},
        manual_tms,
    ),
    "resid_mlp": (
        init(ResidMLP, ResidMLPConfig(n_features=6, d_embed=4, d_mlp=9, n_layers=2), 2),
        6,
        6,
        {
            "layers.0.mlp_in": (4, 9),
            "layers.0.mlp_out": (9, 4),
            "layers.1.mlp_in": (4, 9),
            "layers.1.mlp_out": (9, 4),
        },
        manual_resid_mlp,
    ),
}


@jax.jit
def masked(model, x, components, masks):
    """The toy's own masked forward (`masked_output_by_kind`) on per-site data."""
    layout = SiteLayout.of(model)
    return model.masked_output_by_kind(x, layout.from_sites(components), layout.from_sites(masks))


@functools.cache
def components(name: str) -> dict[str, SiteComponents]:
    """Random components at `init_components_by_kind`'s scales, drawn with numpy (no
    compile)."""
    rng = np.random.default_rng(4)
    out = {}
    for site, (d_in, d_out) in TOYS[name][0].site_shapes().items():
        v = rng.standard_normal((d_in, C)) / np.sqrt(d_in)
        u = rng.standard_normal((C, d_out)) / np.sqrt(C)
        out[site] = SiteComponents(v.astype(np.float32), u.astype(np.float32))
    return out


@pytest.fixture(params=sorted(TOYS))
def toy(request):
    return TOYS[request.param]


@pytest.fixture
def comps(request, toy):
    return components(request.node.callspec.params["toy"])


def inputs_for(d_in: int) -> np.ndarray:
    return np.random.default_rng(3).uniform(size=(BATCH, d_in)).astype(np.float32)


def test_sites_shapes_and_protocol(toy):
    model, d_in, d_out, sites, _ = toy
    assert isinstance(model, DecomposedModel)
    assert model.site_names == tuple(sites)
    assert model.site_shapes() == sites
    for name, (i, o) in sites.items():
        assert model.site_weight(name).shape == (o, i), name
    assert clean(model, inputs_for(d_in)).shape == (BATCH, d_out)


def test_tms_linear2_weight_is_the_transpose_of_linear1():
    model = TOYS["tms"][0]
    np.testing.assert_array_equal(model.site_weight("linear2"), model.site_weight("linear1").T)


def test_output_and_taps_equal_hand_written_forward(toy):
    model, d_in, _, sites, manual = toy
    x = inputs_for(d_in)
    want_out, want_taps = manual(model, np.asarray(x))
    np.testing.assert_allclose(clean(model, x), want_out, rtol=1e-5, atol=1e-6)
    taps = read(model, x, tuple(sites))
    assert set(taps) == set(sites)
    for name in sites:
        np.testing.assert_allclose(taps[name], want_taps[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_fused_accessor_equals_the_two_calls(toy):
    model, d_in, _, sites, _ = toy
    x = inputs_for(d_in)
    wanted = tuple(sites)[::-2]
    out, taps = fused(model, x, wanted)
    np.testing.assert_array_equal(out, clean(model, x))
    separate = read(model, x, wanted)
    assert set(taps) == set(wanted)
    for name in wanted:
        np.testing.assert_array_equal(taps[name], separate[name], err_msg=name)


@pytest.mark.parametrize(
    "wanted", [(), "linear1", ["no.such.site"]], ids=["empty", "bare_string", "unknown"]
)
def test_bad_wanted_raises_value_error_listing_the_sites(toy, wanted):
    model, d_in, _, sites, _ = toy
    with pytest.raises(ValueError) as info:
        model.read_activations(inputs_for(d_in), wanted)
    assert all(name in str(info.value) for name in sites), str(info.value)


def test_all_ones_mask_with_full_delta_reproduces_clean_output(toy, comps):
    """`(x @ V) @ U + x @ (W - (V @ U).T).T = x @ W.T` up to fp32 rounding."""
    model, d_in, _, sites, _ = toy
    x = inputs_for(d_in)
    masks = {
        s: SiteMask(np.ones((BATCH, C), np.float32), delta=np.ones((BATCH,), np.float32))
        for s in sites
    }
    out = masked(model, x, comps, masks)
    np.testing.assert_allclose(out, clean(model, x), rtol=0, atol=1e-5)


def test_all_false_routing_is_exactly_the_clean_output(toy, comps):
    model, d_in, _, sites, _ = toy
    x = inputs_for(d_in)
    masks = {
        s: SiteMask(np.zeros((BATCH, C), np.float32), routing=np.zeros((BATCH,), dtype=bool))
        for s in sites
    }
    out = masked(model, x, comps, masks)
    np.testing.assert_array_equal(out, clean(model, x))


def test_zero_mask_without_delta_changes_the_output(toy, comps):
    """The masked path is live: with every component off and no delta, sites output 0."""
    model, d_in, _, sites, _ = toy
    x = inputs_for(d_in)
    masks = {s: SiteMask(np.zeros((BATCH, C), np.float32)) for s in sites}
    out = masked(model, x, comps, masks)
    assert not np.allclose(out, clean(model, x))


def test_masks_missing_a_site_are_rejected_by_name(toy, comps):
    model, d_in, _, sites, _ = toy
    dropped = list(sites)[-1]
    masks = {s: SiteMask(np.ones((BATCH, C), np.float32)) for s in sites if s != dropped}
    with pytest.raises(ValueError, match=f"missing 1: {dropped}"):
        legacy.masked_output(model, inputs_for(d_in), comps, masks)
    layout = SiteLayout.of(model)
    by_kind = layout.from_sites({**masks, dropped: masks[next(iter(masks))]})
    (kind,) = [k for k, sites in layout.kinds if dropped in sites]
    del by_kind[kind]
    with pytest.raises(ValueError, match=f"missing \\['{kind}'\\]"):
        model.masked_output_by_kind(inputs_for(d_in), layout.from_sites(comps), by_kind)


def test_weight_deltas_are_weight_minus_components(toy, comps):
    model, _, _, sites, _ = toy
    layout = SiteLayout.of(model)
    deltas = layout.to_sites(model.weight_deltas_by_kind(layout.from_sites(comps)))
    assert list(deltas) == list(sites)
    for name in sites:
        v, u = np.asarray(comps[name].V), np.asarray(comps[name].U)
        want = np.asarray(model.site_weight(name)) - (v @ u).T
        np.testing.assert_allclose(deltas[name], want, rtol=1e-6, atol=1e-6, err_msg=name)


@pytest.mark.parametrize(
    "make",
    [
        lambda: SimpleMLPConfig(d_in=0, d_hidden=(), d_out=1),
        lambda: SimpleMLPConfig(d_in=2, d_hidden=[3], d_out=1),  # type: ignore[arg-type]
        lambda: TMSConfig(n_features=5, n_hidden=0),
        lambda: ResidMLPConfig(n_features=5, d_embed=4, d_mlp=3, n_layers=0),
    ],
    ids=["mlp_zero_width", "mlp_list_hidden", "tms_zero_hidden", "resid_zero_layers"],
)
def test_bad_configs_are_rejected(make):
    with pytest.raises(ValueError):
        make()
