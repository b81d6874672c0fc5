"""Both sides of the line the calibrated classes draw, against the pinned goldens under the
pinned class maps alone (and, off the pin's environment, their calibrated bounds):

- a rewrite that changes only the rounding of a gradient passes every train group;
- each SPD loss term scaled by (1 + 1e-5) at step 1 fails `train_branches` (the step-1
  metric of that term breaks its calibrated bound: the keys that carry the loss directly
  are held to their own near-zero noise), and so does a doubled `pgd_lr`.

The goldens were pinned on 1 device; like the sweep, these run in 1-device sessions only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from producers import _spd_setup, branches_config, branches_setup, trajectory

import decomp.nn
import decomp.train
from decomp.train import TERMS, make_train_step
from parity.check import check_group

pytestmark = [
    pytest.mark.skipif(
        jax.device_count() != 1, reason="the goldens were pinned on 1 device; runs there only"
    ),
    pytest.mark.slow,
]

#: The relative change each loss term gets at step 1.
SCALE = 1 + 1e-5


@jax.custom_jvp
def _rsqrt(v: jax.Array) -> jax.Array:
    return jax.lax.rsqrt(v)


@_rsqrt.defjvp
def _rsqrt_jvp(primals: tuple, tangents: tuple) -> tuple:
    # d rsqrt(v) = -v**-1.5 / 2, written as -y**3 / 2 where jax writes -(y / v) / 2: the same
    # number, rounded otherwise. The forward is `lax.rsqrt` itself, bit for bit.
    (v,), (dv,) = primals, tangents
    y = _rsqrt(v)
    return y, -0.5 * (y * y * y) * dv


def _rms_norm_other_gradient(x: jax.Array, w: jax.Array | None, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    normed = (x32 * _rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)
    return normed if w is None else normed * w


@pytest.fixture
def rms_norm_other_gradient(monkeypatch):
    """`decomp.nn.rms_norm` with the other rsqrt derivative; yields the original."""
    original = decomp.nn.rms_norm
    monkeypatch.setattr(decomp.nn, "rms_norm", _rms_norm_other_gradient)
    jax.clear_caches()
    yield original
    monkeypatch.undo()
    jax.clear_caches()


def test_a_rewrite_that_changes_only_gradient_rounding_passes_every_train_group(
    parity_goldens, rms_norm_other_gradient
):
    original = rms_norm_other_gradient
    x = jax.random.normal(jax.random.key(0), (64, 32)) * 3
    w = jax.random.normal(jax.random.key(1), (32,))
    # The forward is the same bits; the gradient is the same number rounded otherwise.
    assert np.array_equal(_rms_norm_other_gradient(x, w, 1e-6), original(x, w, 1e-6))

    def grad(f):
        return np.asarray(jax.grad(lambda x: jnp.sum(jnp.sin(f(x, w, 1e-6))))(x))

    g_new, g_old = grad(_rms_norm_other_gradient), grad(original)
    assert not np.array_equal(g_new, g_old)
    np.testing.assert_allclose(g_new, g_old, rtol=1e-5, atol=1e-6)
    moved = 0
    for group, produce in (
        ("train_branches", lambda: trajectory(*branches_setup(), "branches", evidence=True)),
        # `trajectory`, not the per-process cached `train_group`: the rewrite must run.
        ("train_remat_nothing", lambda: trajectory(*_spd_setup("nothing"), "remat_nothing")),
    ):
        result = check_group(produce(), group, goldens=parity_goldens)
        assert result.passed, [f.reason for f in result.comparison.failures][:5]
        moved += sum(not f.bitwise_equal for f in result.comparison.findings)
    assert moved > 0, "the rewrite moved no key: it tests nothing"


def _with_scaled_terms(real):
    """`spd_losses` whose terms are multiplied by `holder["scales"]` (one per `TERMS`, a
    traced argument), the total summed from them as `spd_losses` sums it."""
    holder: dict[str, jax.Array] = {}

    def losses(model, config, *args, **kwargs):
        _, (terms, new_src) = real(model, config, *args, **kwargs)
        scales = holder["scales"]
        scaled = {t: terms[t] * scales[i] for i, t in enumerate(TERMS)}
        coeffs = {
            "faithfulness": config.faithfulness_coeff,
            "importance": config.importance_coeff,
            "stochastic_recon": config.stochastic_recon_coeff,
            "pgd_recon": config.pgd_recon_coeff,
        }
        zero = jnp.zeros((), jnp.float32)
        total = sum((coeffs[t] * scaled[t] for t in TERMS if coeffs[t]), zero)
        return total, (scaled, new_src)

    return losses, holder


def test_each_loss_term_scaled_by_1e_5_at_step_1_fails_train_branches(parity_goldens, monkeypatch):
    model, spd = branches_setup()
    losses, holder = _with_scaled_terms(decomp.train.spd_losses)
    monkeypatch.setattr(decomp.train, "spd_losses", losses)
    jax.clear_caches()
    inner = make_train_step(model, spd, donate=False)

    @jax.jit
    def step(scales, state, inputs, key):
        holder["scales"] = scales
        return inner(state, inputs, key)

    def run(step1_scales: list[float]) -> dict[str, np.ndarray]:
        def scaled_step(i, state, inputs, key):
            scales = step1_scales if i == 1 else [1.0] * len(TERMS)
            return step(jnp.asarray(scales, jnp.float32), state, inputs, key)

        return trajectory(model, spd, "branches", evidence=True, step=scaled_step)

    try:
        control = check_group(run([1.0] * len(TERMS)), "train_branches", goldens=parity_goldens)
        assert control.passed, [f.reason for f in control.comparison.failures][:5]
        for j, term in enumerate(TERMS):
            scales = [SCALE if k == j else 1.0 for k in range(len(TERMS))]
            result = check_group(run(scales), "train_branches", goldens=parity_goldens)
            failing = {f.key for f in result.comparison.failures}
            assert f"traj.branches.step1.metrics.{term}" in failing, (term, sorted(failing)[:5])
    finally:
        monkeypatch.undo()
        jax.clear_caches()


def test_a_doubled_pgd_lr_fails_train_branches(parity_goldens):
    model, spd = branches_setup(pgd_lr=2 * branches_config().pgd_lr)
    result = check_group(trajectory(model, spd, "branches", evidence=True), "train_branches",
                         goldens=parity_goldens)  # fmt: skip
    assert not result.passed
    assert any(".sources." in f.key for f in result.comparison.failures)
