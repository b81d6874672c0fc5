"""SPD losses, masks and config against independent implementations (numpy, hand-written
loops, Adam's first step in closed form)."""

from __future__ import annotations

import dataclasses
import functools

import _reference as reference
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from producers import spd_configs

from decomp.components import SiteMask
from decomp.config import CIConfig, SPDConfig
from decomp.legacy import init_components, masked_output, route_chunk, stochastic_masks
from decomp.losses import (
    IMPORTANCE_EPS,
    faithfulness_loss,
    importance_minimality_loss,
    kl_divergence,
    mse,
    pgd_ascend,
    pgd_recon_loss,
    stochastic_recon_loss,
)
from decomp.masks import (
    constant_masks,
    mask_from_draw,
    recon_chunks,
    source_masks,
    uniform_k_routing,
)
from decomp.stacked import SiteLayout
from decomp.targets.glu_transformer import GLUTransformer

CI_CFG = spd_configs(None)[1].ci


# --- losses against numpy ------------------------------------------------------------------


def own_kinds(names: tuple[str, ...]) -> SiteLayout:
    """Every site a kind of its own (stacks of one row)."""
    return SiteLayout(names, tuple((n, (n,)) for n in names))


def test_faithfulness_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    deltas = {
        "a": rng.normal(size=(3, 5)),
        "b": rng.normal(size=(7, 2)),
        "c": rng.normal(size=(4, 4)),
    }
    want = sum(float(np.sum(d**2)) for d in deltas.values()) / (15 + 14 + 16)
    layout = own_kinds(tuple(deltas))
    stacked = layout.from_sites({k: jnp.asarray(v, jnp.float32) for k, v in deltas.items()})
    got = faithfulness_loss(stacked, layout)
    np.testing.assert_allclose(float(got), want, rtol=1e-6)


@functools.cache
def tiny_glu() -> tuple[GLUTransformer, dict]:
    """The tiny GLU and components, each made by one jitted program (not op by op)."""
    cfg, _ = spd_configs(None)
    model = jax.jit(lambda k: GLUTransformer.init(cfg, key=k))(jax.random.key(0))
    shapes = model.site_shapes()
    comps = jax.jit(lambda k: init_components(shapes, 4, key=k))(jax.random.key(1))
    return model, comps


def test_faithfulness_of_a_glu_model_matches_numpy() -> None:
    model, comps = tiny_glu()
    total, count = 0.0, 0
    for name in model.site_names:
        w = np.asarray(model.site_weight(name), np.float64)
        v, u = np.asarray(comps[name].V, np.float64), np.asarray(comps[name].U, np.float64)
        total += float(np.sum((w - (v @ u).T) ** 2))
        count += w.size
    layout = SiteLayout.of(model)
    stacked = layout.from_sites(comps)
    got = jax.jit(lambda m, c: faithfulness_loss(m.weight_deltas_by_kind(c), layout))(
        model, stacked
    )
    np.testing.assert_allclose(float(got), total / count, rtol=1e-5)


@pytest.mark.parametrize("p", [1.0, 0.5, 2.0])
def test_importance_minimality_matches_hand_sum(p: float) -> None:
    rng = np.random.default_rng(1)
    upper = {"a": rng.uniform(0, 1.2, size=(2, 3, 4)), "b": rng.uniform(0, 1.2, size=(2, 3, 4))}
    # Sum over sites and components, mean over the 2 * 3 positions.
    want = sum(float(np.sum((u + IMPORTANCE_EPS) ** p)) for u in upper.values()) / 6
    layout = SiteLayout(("a", "b"), (("ab", ("a", "b")),))
    stacked = layout.from_sites({k: jnp.asarray(v, jnp.float32) for k, v in upper.items()})
    got = importance_minimality_loss(stacked, p, layout)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)


def test_importance_with_p_1_is_the_plain_sum() -> None:
    upper = {"a": jnp.array([[0.0, 0.5], [1.0, 0.25]]), "b": jnp.array([[1.0, 1.0], [0.0, 0.0]])}
    layout = own_kinds(("a", "b"))
    got = importance_minimality_loss(layout.from_sites(upper), 1.0, layout, eps=0.0)
    assert float(got) == pytest.approx((1.75 + 2.0) / 2)


def test_kl_matches_numpy_and_is_zero_on_equal_logits() -> None:
    rng = np.random.default_rng(2)
    p, q = rng.normal(size=(2, 5, 11)) * 3, rng.normal(size=(2, 5, 11)) * 3
    got = kl_divergence(jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32))
    np.testing.assert_allclose(float(got), reference.kl(p, q), rtol=1e-5)
    assert float(kl_divergence(jnp.asarray(p, jnp.float32), jnp.asarray(p, jnp.float32))) == 0.0


def test_mse_matches_numpy() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
    np.testing.assert_allclose(
        float(mse(jnp.asarray(a), jnp.asarray(b))), np.mean((a - b) ** 2), rtol=1e-6
    )


def test_unmasked_glu_reproduces_clean_logits() -> None:
    """All-ones mask with delta 1 is the original model: KL against clean ~ 0."""
    model, comps = tiny_glu()
    x = jax.random.randint(jax.random.key(2), (4, 8), 0, 64)

    def kl(model: GLUTransformer, comps: dict, x: jax.Array) -> jax.Array:
        ones = {s: jnp.ones((4, 8, 4)) for s in model.site_names}
        masked = masked_output(model, x, comps, constant_masks(ones, 1.0, 1.0))
        return kl_divergence(model.clean_output(x), masked)

    got = float(jax.jit(kl)(model, comps, x))
    assert abs(got) <= 1e-6, got


# --- masks ---------------------------------------------------------------------------------


def test_stochastic_masks_draw_per_site_from_fold_in() -> None:
    rng = np.random.default_rng(4)
    ci = {
        f"s{i}": jnp.asarray(rng.uniform(size=(2, 3, 4 if i % 2 else 6)), jnp.float32)
        for i in range(5)
    }
    key = jax.random.key(9)
    got = stochastic_masks(ci, key=key)
    assert list(got) == list(ci)
    for i, (name, c) in enumerate(ci.items()):
        u = np.asarray(
            jax.random.uniform(jax.random.fold_in(key, i), (*c.shape[:-1], c.shape[-1] + 1))
        )
        c = np.asarray(c)
        np.testing.assert_allclose(got[name].mask, c + (1 - c) * u[..., :-1], atol=1e-7)
        np.testing.assert_array_equal(got[name].delta, u[..., -1])
        assert np.all(got[name].mask >= c - 1e-7) and np.all(got[name].mask <= 1.0)


def test_source_masks_broadcast_sources_over_the_batch() -> None:
    ci = {"a": jnp.full((3, 2, 4), 0.5)}
    src = {"a": jnp.linspace(0, 1, 10).reshape(1, 2, 5)}
    m = source_masks(ci, src)["a"]
    assert m.mask.shape == (3, 2, 4) and m.delta.shape == (3, 2)
    np.testing.assert_allclose(m.mask[1], 0.5 + 0.5 * src["a"][0, :, :4], rtol=1e-6)
    np.testing.assert_allclose(m.delta[2], src["a"][0, :, 4])
    with pytest.raises(ValueError, match="C \\+ 1 = 5 channels"):
        mask_from_draw(ci["a"], jnp.zeros((1, 2, 4)))


def test_uniform_k_routing_draws_k_then_a_uniform_subset() -> None:
    n, shape = 4, (200, 50)
    routed = np.asarray(uniform_k_routing(jax.random.key(0), shape, n))
    k = routed.sum(-1)
    assert routed.shape == (*shape, n) and k.min() >= 1 and k.max() <= n
    # k uniform on 1..n: each value ~ 1/4 of the 10_000 positions (sd ~ 43).
    counts = np.bincount(k.ravel(), minlength=n + 1)[1:]
    assert np.all(np.abs(counts - 2500) < 250), counts
    # No site favoured by its place in the chunk: P(routed) = (n + 1) / (2n) = 0.625.
    np.testing.assert_allclose(routed.mean((0, 1)), 0.625, atol=0.02)


def test_route_chunk_routes_only_the_chunks_sites() -> None:
    names = [f"s{i}" for i in range(6)]
    chunks = recon_chunks(names, 2)
    assert chunks == (("s0", "s1"), ("s2", "s3"), ("s4", "s5"))
    masks = constant_masks({s: jnp.zeros((3, 5, 2)) for s in names}, 0.5, 0.5)
    routed = jax.jit(lambda c: route_chunk(masks, chunks, c, key=jax.random.key(1)))(jnp.int32(1))
    for s in ("s0", "s1", "s4", "s5"):
        assert not np.any(routed[s].routing), s
    both = np.stack([routed["s2"].routing, routed["s3"].routing], -1)
    assert np.all(both.sum(-1) >= 1)
    with pytest.raises(ValueError, match="divide the 6 sites"):
        recon_chunks(names, 4)


# --- stochastic and PGD reconstruction on a linear stand-in model ---------------------------


SITES = ("a", "b", "c", "d")
B, T, C, V = 3, 4, 2, 5


def _linear_forward(comps: dict, masks: dict) -> jax.Array:
    """Logits = sum over sites of (mask @ U_s + delta * w_s), the plain value where unrouted."""
    out = jnp.zeros((B, T, V))
    for s in SITES:
        m: SiteMask = masks[s]
        y = m.mask @ comps[s]["U"] + m.delta[..., None] * comps[s]["w"]
        if m.routing is not None:
            y = jnp.where(m.routing[..., None], y, comps[s]["plain"])
        out = out + y
    return out


def _linear_setup() -> tuple[dict, jax.Array, dict]:
    keys = iter(jax.random.split(jax.random.key(5), 3 * len(SITES) + 2))
    comps = {
        s: {
            "U": jax.random.normal(next(keys), (C, V)),
            "w": jax.random.normal(next(keys), (V,)),
            "plain": jax.random.normal(next(keys), (V,)),
        }
        for s in SITES
    }
    clean = jax.random.normal(next(keys), (B, T, V))
    ci_key = next(keys)
    ci = {
        s: jax.random.uniform(jax.random.fold_in(ci_key, i), (B, T, C)) for i, s in enumerate(SITES)
    }
    return comps, clean, ci


@pytest.mark.parametrize(("n_draws", "per_chunk"), [(1, 4), (3, 2)])
def test_stochastic_recon_matches_a_loop_over_draws_and_chunks(
    n_draws: int, per_chunk: int
) -> None:
    comps, clean, ci = _linear_setup()
    chunks = recon_chunks(SITES, per_chunk)
    key = jax.random.key(3)
    # Kinds that interleave the canonical order, so that rows and positions differ.
    layout = SiteLayout(SITES, (("x", ("a", "c")), ("y", ("b", "d"))))

    def forward(comps: dict, masks: dict) -> jax.Array:
        return _linear_forward(comps, layout.to_sites(masks))

    got = stochastic_recon_loss(
        forward, comps, clean, layout.from_sites(ci), layout, chunks, key=key,
        n_mask_samples=n_draws,
    )  # fmt: skip
    k_mask, k_route = jax.random.split(key)
    values = []
    for d in range(n_draws):
        masks = {}
        for i, s in enumerate(SITES):
            u = jax.random.uniform(
                jax.random.fold_in(jax.random.fold_in(k_mask, d), i), (B, T, C + 1)
            )
            masks[s] = SiteMask(ci[s] + (1 - ci[s]) * u[..., :C], u[..., C])
        for c, sites in enumerate(chunks):
            r = uniform_k_routing(
                jax.random.fold_in(jax.random.fold_in(k_route, d), c), (B, T), len(sites)
            )
            routed = {s: masks[s]._replace(routing=jnp.zeros((B, T), bool)) for s in SITES}
            for j, s in enumerate(sites):
                routed[s] = masks[s]._replace(routing=r[..., j])
            values.append(
                reference.kl(
                    np.asarray(clean, np.float64),
                    np.asarray(_linear_forward(comps, routed), np.float64),
                )
            )
    np.testing.assert_allclose(float(got), np.mean(values), rtol=1e-5)


def test_one_pgd_step_is_lr_times_the_gradient_sign() -> None:
    """Adam's first step is `lr * g / (|g| + eps)`; then the clip to [0, 1]."""
    comps, clean, ci = _linear_setup()
    src = {
        s: jax.random.uniform(jax.random.fold_in(jax.random.key(8), i), (1, T, C + 1))
        for i, s in enumerate(SITES)
    }
    lr = 0.1

    def objective(s: dict) -> jax.Array:
        return kl_divergence(clean, _linear_forward(comps, source_masks(ci, s)))

    g = jax.grad(objective)(src)
    got = pgd_ascend(_linear_forward, comps, clean, ci, src, steps=1, lr=lr)
    for s in SITES:
        gs = np.asarray(g[s], np.float64)
        want = np.clip(np.asarray(src[s], np.float64) + lr * gs / (np.abs(gs) + 1e-8), 0, 1)
        np.testing.assert_allclose(got[s], want, atol=1e-6)


def test_pgd_ascent_raises_the_divergence_and_stays_in_the_box() -> None:
    comps, clean, ci = _linear_setup()
    src = {s: jnp.full((1, T, C + 1), 0.5, jnp.bfloat16) for s in SITES}
    before = kl_divergence(clean, _linear_forward(comps, source_masks(ci, src)))
    loss, new = pgd_recon_loss(_linear_forward, comps, clean, ci, src, steps=5, lr=0.2)
    assert float(loss) > float(before)
    for s in SITES:
        assert new[s].dtype == jnp.float32 and new[s].shape == (1, T, C + 1)
        assert float(new[s].min()) >= 0.0 and float(new[s].max()) <= 1.0
    unchanged = pgd_ascend(_linear_forward, comps, clean, ci, src, steps=0, lr=0.2)
    for s in SITES:
        np.testing.assert_array_equal(unchanged[s], np.asarray(src[s], np.float32))


def test_pgd_loss_gradient_reaches_components_but_not_sources() -> None:
    comps, clean, ci = _linear_setup()
    src = {s: jnp.full((1, T, C + 1), 0.3) for s in SITES}

    def f(comps: dict, src: dict) -> jax.Array:
        return pgd_recon_loss(_linear_forward, comps, clean, ci, src, steps=2, lr=0.1)[0]

    g_comps, g_src = jax.grad(f, argnums=(0, 1))(comps, src)
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(g_src))
    assert float(jnp.abs(g_comps["a"]["U"]).max()) > 0.0


# --- config --------------------------------------------------------------------------------


def _config(**kw: object) -> SPDConfig:
    return SPDConfig(**{"n_components": 4, "ci": CI_CFG, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("importance_coeff", -1.0, ">= 0"),
        ("faithfulness_coeff", -0.5, ">= 0"),
        ("stochastic_recon_coeff", float("nan"), ">= 0"),
        ("pgd_recon_coeff", -1e-3, ">= 0"),
        ("n_components", 0, ">= 1"),
        ("recon_sites_per_chunk", 0, ">= 1"),
        ("n_mask_samples", 0, ">= 1"),
        ("pgd_lr", 0.0, "> 0"),
        ("grad_clip", -1.0, "> 0"),
        ("remat", "everything", "'nothing' or 'dots'"),
        ("sources_dtype", "float16", "'bfloat16'"),
    ],
)
def test_config_rejects_bad_values_naming_field_value_and_rule(
    field: str, value: object, allowed: str
) -> None:
    with pytest.raises(ValueError) as err:
        _config(**{field: value})
    msg = str(err.value)
    assert f"SPDConfig.{field}" in msg and repr(value) in msg and allowed in msg, msg


def test_config_rejects_zero_ci_sites_per_chunk() -> None:
    with pytest.raises(ValueError, match="sites_per_chunk"):
        _config(ci=CIConfig(d_hidden=16, n_blocks=1, n_head=2, d_mlp=32, sites_per_chunk=0))
    # A config object that skipped CIConfig's own check is still caught here.
    bad = dataclasses.replace(CI_CFG)
    object.__setattr__(bad, "sites_per_chunk", 0)
    with pytest.raises(
        ValueError, match=r"SPDConfig\.ci\.sites_per_chunk must be an int >= 1, got 0"
    ):
        _config(ci=bad)


def test_check_sites_names_the_chunk_size_that_does_not_divide() -> None:
    names = [f"s{i}" for i in range(14)]
    _config(recon_sites_per_chunk=7).check_sites(names)
    with pytest.raises(
        ValueError, match=r"recon_sites_per_chunk must divide the model's 14 sites, got 4"
    ):
        _config(recon_sites_per_chunk=4).check_sites(names)


def test_p_anneals_linearly_then_stays() -> None:
    cfg = _config(p_start=2.0, p_end=1.0, p_anneal_steps=4)
    assert [float(cfg.p_at(s)) for s in (0, 1, 2, 4, 10)] == [2.0, 1.75, 1.5, 1.0, 1.0]
    assert float(_config(p_anneal_steps=0, p_end=0.9).p_at(0)) == pytest.approx(0.9)
