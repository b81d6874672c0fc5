"""The SPD train step: remat modes agree over a 3-step trajectory, the step compiles once,
and training lowers the loss."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from decomp.ci_function import CIConfig
from decomp.config import SPDConfig
from decomp.targets.glu_transformer import GLUConfig, GLUTransformer
from decomp.targets.toy import ResidMLP, ResidMLPConfig
from decomp.train import TrainState, init_train_state, make_train_step

BATCH, SEQ, VOCAB = 4, 8, 64
N_STEPS = 3
METRICS = (
    "total",
    "faithfulness",
    "importance",
    "stochastic_recon",
    "pgd_recon",
    "grad_norm_components",
    "grad_norm_ci",
    "p",
)

#: Bounds on |remat - no remat| over 3 steps, 4-6x the worst measured (AVX2 host, both
#: "nothing" and "dots"): metrics and component / CI / optimiser leaves 9.5e-7 (2 ulp of
#: `importance`, ~7.8), sources 3.3e-6. The sources drift more because PGD's Adam divides
#: each gradient by its own magnitude: a reassociation-sized change of a tiny gradient
#: moves its step by far more than its relative size.
REMAT_ATOL = 4e-6
REMAT_SOURCES_ATOL = 2e-5


def tiny_glu() -> GLUTransformer:
    cfg = GLUConfig(n_layer=2, d_model=32, n_head=2, n_kv_head=1, head_dim=16, d_mlp=64,
                    vocab_size=VOCAB)  # fmt: skip
    return jax.jit(lambda k: GLUTransformer.init(cfg, key=k))(jax.random.key(0))


def tiny_spd(**overrides: Any) -> SPDConfig:
    base = SPDConfig(
        n_components=4,
        ci=CIConfig(d_hidden=16, n_blocks=1, n_head=2, d_mlp=32, sites_per_chunk=7),
        importance_coeff=1e-2,
        p_start=2.0,
        p_end=1.0,
        p_anneal_steps=4,
        n_mask_samples=2,
        recon_sites_per_chunk=7,
        pgd_warmup_steps=2,
        pgd_lr=0.05,
        lr_components=1e-2,
        lr_ci=1e-2,
        weight_decay=1e-3,
        grad_clip=0.5,
    )
    return dataclasses.replace(base, **overrides)


def tokens(seed: int = 1) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (BATCH, SEQ), 0, VOCAB, jnp.int32)


_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


@dataclasses.dataclass
class Trajectory:
    """Per step (after it): every state leaf by path, every metric, and the compile events
    (trace, lowering, backend compile) the step raised."""

    leaves: list[dict[str, np.ndarray]]
    metrics: list[dict[str, np.ndarray]]
    compile_events: list[list[str]]


def _leaves(state: TrainState) -> dict[str, np.ndarray]:
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in flat}


@contextlib.contextmanager
def compile_events() -> Iterator[list[str]]:
    """Collect the trace, lowering and backend-compile events raised inside the block."""
    events: list[str] = []

    def listener(event: str, duration: float, **kwargs: Any) -> None:
        if event in _COMPILE_EVENTS:
            events.append(f"{event} {kwargs.get('fun_name', '')}")

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def trajectory(model: GLUTransformer, initial: TrainState, remat: str | None) -> Trajectory:
    """Three train steps of the tiny GLU from `initial` (copied: the step donates its
    state), with fixed inputs and keys."""
    state = jax.tree.map(jnp.copy, initial)
    step = make_train_step(model, tiny_spd(remat=remat))
    inputs = tokens()
    keys = [jax.random.fold_in(jax.random.key(11), i) for i in range(N_STEPS)]
    out = Trajectory([], [], [])
    for key in keys:
        with compile_events() as events:
            state, metrics = step(state, inputs, key)
            jax.block_until_ready(metrics)
        out.compile_events.append(events)
        out.leaves.append(_leaves(state))
        out.metrics.append({k: np.asarray(v) for k, v in metrics.items()})
    return out


def _worst(a: Trajectory, b: Trajectory, *, sources: bool) -> tuple[float, str]:
    """Worst |a - b| over the sources' leaves (`sources`) or over everything else."""
    worst, where = 0.0, ""
    for i in range(N_STEPS):
        pairs = (("leaf", a.leaves[i], b.leaves[i]), ("metric", a.metrics[i], b.metrics[i]))
        for kind, x, y in pairs:
            assert x.keys() == y.keys()
            for k in x:
                if k.startswith(".sources") != sources:
                    continue
                d = float(np.max(np.abs(x[k].astype(np.float64) - y[k].astype(np.float64))))
                if d >= worst:
                    worst, where = d, f"step {i + 1} {kind} {k}"
    return worst, where


def _check_compiles_once(remat: str | None, run: Trajectory) -> None:
    first, later = run.compile_events[0], run.compile_events[1:]
    # Step 1 lowers (and compiles, unless the persistent cache holds the program).
    assert any("mlir_module" in e for e in first), (remat, first)
    assert later == [[], []], (
        f"remat={remat!r}: steps 2 and 3 must reuse step 1's program; they raised {later}"
    )


def _check_moves(run: Trajectory) -> None:
    """Guards the comparison against a step that changes nothing."""
    first, last = run.leaves[0], run.leaves[-1]
    for part in (".components", ".ci", ".sources", ".opt_state_components", ".opt_state_ci"):
        keys = [k for k in first if k.startswith(part)]
        assert keys, part
        assert any(not np.array_equal(first[k], last[k]) for k in keys), f"{part} never changed"
    assert [int(leaves[".step"]) for leaves in run.leaves] == [1, 2, 3]
    assert [float(m["p"]) for m in run.metrics] == [2.0, 1.75, 1.5]


def test_remat_modes_agree_over_three_steps_and_each_compiles_once() -> None:
    """Three trajectories in one test, so that under xdist one worker compiles them all."""
    # remat does not enter the init: one initial state serves the three runs.
    model = tiny_glu()
    initial = init_train_state(model, tiny_spd(), key=jax.random.key(7), seq_len=SEQ)
    runs = {remat: trajectory(model, initial, remat) for remat in (None, "nothing", "dots")}
    for remat, run in runs.items():
        _check_compiles_once(remat, run)
        for i, metrics in enumerate(run.metrics):
            assert set(metrics) == set(METRICS), (remat, sorted(metrics))
            bad = {k: v for k, v in metrics.items() if not np.isfinite(v)}
            assert not bad, f"remat={remat!r} step {i + 1}: {bad}"
    _check_moves(runs[None])
    for remat in ("nothing", "dots"):
        for sources, bound in ((False, REMAT_ATOL), (True, REMAT_SOURCES_ATOL)):
            worst, where = _worst(runs[None], runs[remat], sources=sources)
            assert worst <= bound, (
                f"remat={remat!r} against remat=None: worst |diff| {worst:.3g} at {where}, "
                f"allowed {bound}"
            )


def test_sources_length_must_match_inputs() -> None:
    model, cfg = tiny_glu(), tiny_spd()
    state = init_train_state(model, cfg, key=jax.random.key(7), seq_len=SEQ + 1)
    with pytest.raises(ValueError, match="seq length must equal"):
        make_train_step(model, cfg)(state, tokens(), jax.random.key(1))


def sparse_features(key: jax.Array, batch: int, n_features: int) -> jax.Array:
    """ResidMLP inputs: each feature on with probability 0.1, then uniform in [-1, 1]."""
    k_value, k_on = jax.random.split(key)
    x = jax.random.uniform(k_value, (batch, n_features), minval=-1.0, maxval=1.0)
    return x * (jax.random.uniform(k_on, (batch, n_features)) < 0.1)


def test_training_lowers_the_loss_on_a_toy() -> None:
    """30 seeded steps on a ResidMLP, bf16 sources: measured total 0.27 -> 0.07 (0.25x).

    Also pins the toy path (taps without a seq axis, MSE outputs), that bf16 sources stay
    bf16 in [0, 1] and that steps after the first compile nothing.
    """
    toy = ResidMLPConfig(n_features=16, d_embed=8, d_mlp=16, n_layers=2)
    model = jax.jit(lambda k: ResidMLP.init(toy, key=k))(jax.random.key(0))
    features = jax.jit(sparse_features, static_argnums=(1, 2))
    cfg = tiny_spd(
        n_components=8,
        ci=CIConfig(d_hidden=16, n_blocks=1, n_head=2, d_mlp=32, sites_per_chunk=2),
        recon_sites_per_chunk=2,
        n_mask_samples=1,
        importance_coeff=1e-3,
        p_anneal_steps=0,
        pgd_warmup_steps=1,
        sources_dtype="bfloat16",
    )
    state = init_train_state(model, cfg, key=jax.random.key(1))
    step = make_train_step(model, cfg)
    totals, later_events = [], []
    for i in range(30):
        inputs, key = features(jax.random.key(100 + i), 32, 16), jax.random.key(i)
        with compile_events() as events:
            state, metrics = step(state, inputs, key)
            totals.append(float(metrics["total"]))
        if i:
            later_events += events
    assert later_events == [], later_events
    for name, src in state.site_sources().items():
        assert src.dtype == jnp.bfloat16 and src.shape == (1, 1, 9), (name, src.dtype, src.shape)
        assert float(jnp.min(src)) >= 0.0 and float(jnp.max(src)) <= 1.0, name
    start, end = np.mean(totals[:3]), np.mean(totals[-3:])
    assert np.all(np.isfinite(totals)), totals
    assert end < 0.8 * start, f"total {start:.4g} -> {end:.4g} over 30 steps: {totals}"
