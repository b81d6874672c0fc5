"""The SPD eval step against masked forwards and counts computed outside it."""

from __future__ import annotations

import functools

import _reference as reference
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from producers import spd_configs

from decomp import legacy
from decomp.components import SiteMask
from decomp.config import CIConfig, SPDConfig
from decomp.eval import MODES, make_eval_step
from decomp.targets.glu_transformer import GLUTransformer
from decomp.targets.toy import TMS, TMSConfig
from decomp.train import TrainState, importances, init_train_state

BATCH, SEQ, VOCAB, C = 4, 8, 64, 4


@functools.cache
def glu_eval() -> tuple[GLUTransformer, TrainState, jax.Array, dict[str, np.ndarray]]:
    cfg, pinned = spd_configs(None)
    model = jax.jit(lambda k: GLUTransformer.init(cfg, key=k))(jax.random.key(0))
    # The pinned CI function and C, every other field at its default: the eval step alone.
    spd = SPDConfig(n_components=C, ci=pinned.ci, l0_threshold=0.1)
    state = init_train_state(model, spd, key=jax.random.key(7), seq_len=SEQ)
    inputs = jax.random.randint(jax.random.key(1), (BATCH, SEQ), 0, VOCAB, jnp.int32)
    metrics = make_eval_step(model, spd)(state, inputs, jax.random.key(2))
    return model, state, inputs, {k: np.asarray(v) for k, v in metrics.items()}


@pytest.mark.slow
def test_eval_reports_every_mode_and_site() -> None:
    model, _, _, metrics = glu_eval()
    want = {"ce/clean", "l0/total"}
    want |= {f"{kind}/{mode}" for kind in ("kl", "ce_diff") for mode in MODES}
    want |= {f"l0/{s}" for s in model.site_names}
    assert set(metrics) == want
    for k, v in metrics.items():
        assert v.shape == () and v.dtype == np.float32 and np.isfinite(v), (k, v)


def test_unmasked_run_is_the_clean_model() -> None:
    *_, metrics = glu_eval()
    assert abs(metrics["kl/unmasked"]) <= 1e-6, metrics["kl/unmasked"]
    assert abs(metrics["ce_diff/unmasked"]) <= 1e-5, metrics["ce_diff/unmasked"]
    for mode in MODES:
        assert metrics[f"kl/{mode}"] >= -1e-7, (mode, metrics[f"kl/{mode}"])
    assert metrics["kl/zero_masked"] > 1e-3


@jax.jit
def _clean_and_lower(
    model: GLUTransformer, state: TrainState, inputs: jax.Array
) -> tuple[jax.Array, dict[str, jax.Array]]:
    clean, taps = model.clean_output_and_taps_by_kind(inputs)
    return clean, state.layout.to_sites(
        importances(state.ci, taps, state.layout, has_seq_axis=True)[0]
    )


@pytest.mark.parametrize("mode", ["ci_masked", "rounded", "zero_masked"])
def test_deterministic_modes_match_a_masked_forward_outside_the_step(mode: str) -> None:
    model, state, inputs, metrics = glu_eval()
    clean, lower = _clean_and_lower(model, state, inputs)
    masks = {}
    for s, ci in lower.items():
        m = {"ci_masked": ci, "rounded": jnp.where(ci > 0.5, 1.0, 0.0), "zero_masked": 0 * ci}[mode]
        masks[s] = SiteMask(m, jnp.zeros(ci.shape[:-1]))
    components = state.site_components()
    out = np.asarray(jax.jit(legacy.masked_output)(model, inputs, components, masks))
    clean, tokens = np.asarray(clean), np.asarray(inputs)
    np.testing.assert_allclose(
        metrics[f"kl/{mode}"], reference.kl(clean, out), rtol=1e-4, atol=1e-7
    )
    want_ce = reference.next_token_ce(out, tokens) - reference.next_token_ce(clean, tokens)
    np.testing.assert_allclose(metrics[f"ce_diff/{mode}"], want_ce, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        metrics["ce/clean"], reference.next_token_ce(clean, tokens), rtol=1e-5
    )


def test_l0_counts_components_above_the_threshold() -> None:
    model, state, inputs, metrics = glu_eval()
    _, lower = _clean_and_lower(model, state, inputs)
    total = 0.0
    for s, ci in lower.items():
        want = float(np.mean(np.sum(np.asarray(ci) > 0.1, -1)))
        assert metrics[f"l0/{s}"] == pytest.approx(want), s
        assert 0.0 <= want <= C
        total += want
    assert metrics["l0/total"] == pytest.approx(total)
    # The random CI of a fresh state leaves room on both sides of the threshold.
    assert 0.0 < metrics["l0/total"] < C * len(lower)


def test_toy_eval_reports_mse_and_no_cross_entropy() -> None:
    model = jax.jit(lambda k: TMS.init(TMSConfig(n_features=6, n_hidden=3), key=k))(
        jax.random.key(0)
    )
    spd = SPDConfig(
        n_components=5, ci=CIConfig(d_hidden=8, n_blocks=1, n_head=2, d_mlp=16, sites_per_chunk=2)
    )
    state = init_train_state(model, spd, key=jax.random.key(1))
    x = jax.random.uniform(jax.random.key(2), (8, 6))
    metrics = make_eval_step(model, spd)(state, x, jax.random.key(3))
    assert set(metrics) == {f"mse/{m}" for m in MODES} | {"l0/linear1", "l0/linear2", "l0/total"}
    assert float(metrics["mse/unmasked"]) <= 1e-10
    clean = np.asarray(model.clean_output(x))
    # Zero-masked: both sites output 0, so the output is relu(b).
    want = np.mean((np.maximum(np.asarray(model.b), 0)[None] - clean) ** 2)
    np.testing.assert_allclose(metrics["mse/zero_masked"], want, rtol=1e-5)
