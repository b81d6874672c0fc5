"""Remat modes against no remat: the train steps of the two pinned remat trajectories and
the same step without remat, from one initial state, on the pinned trajectories' inputs.
After each of the three steps every state leaf (components, CI function, sources, both
optimiser states) and every metric must agree under `trajectory`, the class the trajectories
are pinned with (measured on this subject, AVX2 host: worst 2.8e-6 with `dots`, at step 2
on a CI weight, and 1.6e-6 on a source; 1.1e-6 and 5.4e-7 with `nothing`); and each mode's
steps 2 and 3 must reuse step 1's program.

The programs are the pinned trajectories' own (`producers._spd_setup`, `donate=False`, the
same input shapes), so the remat ones are lowered here and loaded from jax's persistent
compilation cache wherever a golden check of the trajectories compiled them first: this test
runs after `train_remat_nothing`'s golden check and live differential on their xdist worker
(`xdist_group`, collection order), and, as the slow tests go out first, after the other
worker's `train_remat_dots` in the usual case. The step without remat is the program of the
1-device arm of tests/decomp/test_data_parallel.py, which the same `xdist_group` runs first
(collection order): this test compiles only the remat programs the cache does not hold yet.

Like the sweep, this runs in 1-device sessions only: the remat modes are one program
transformation, judged where the goldens were pinned.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from producers import SEQ, TRAIN_STEPS, _spd_setup, step_inputs

from decomp.train import init_train_state, make_train_step

pytestmark = [
    pytest.mark.skipif(jax.device_count() != 1, reason="runs in 1-device sessions only"),
    pytest.mark.xdist_group("trajectory.train_remat_nothing"),
    pytest.mark.slow,
]

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


def _run(remat: str | None, compile_events) -> tuple[dict[str, np.ndarray], list[list[str]]]:
    """The pinned trajectory's three steps in `remat` mode: every state leaf and metric by
    `step{i}.` key, and the compile events each step raised."""
    model, spd = _spd_setup(remat)
    state = init_train_state(model, spd, key=jax.random.key(1), seq_len=SEQ)
    step = make_train_step(model, spd, donate=False)
    out: dict[str, np.ndarray] = {}
    events: list[list[str]] = []
    for i in range(1, TRAIN_STEPS + 1):
        with compile_events() as raised:
            state, metrics = step(state, *step_inputs(model, i))
            jax.block_until_ready(metrics)
        events.append(raised)
        assert set(metrics) == set(METRICS), (remat, sorted(metrics))
        for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
            out[f"step{i}.state{jax.tree_util.keystr(path)}"] = np.asarray(leaf)
        out |= {f"step{i}.metrics.{k}": np.asarray(v) for k, v in metrics.items()}
    return out, events


def _check_moves(run: dict[str, np.ndarray]) -> None:
    """Guards the comparison against a step that changes nothing."""
    for part in (".components", ".ci", ".sources", ".opt_state_components", ".opt_state_ci"):
        keys = [k.removeprefix("step1.") for k in run if k.startswith(f"step1.state{part}")]
        assert keys, part
        moved = [k for k in keys if not np.array_equal(run[f"step1.{k}"], run[f"step3.{k}"])]
        assert moved, f"{part} never changed over steps 1 to 3"
    assert [int(run[f"step{i}.state.step"]) for i in (1, 2, 3)] == [1, 2, 3]
    assert [float(run[f"step{i}.metrics.p"]) for i in (1, 2, 3)] == [2.0, 1.75, 1.5]


def test_remat_modes_agree_with_no_remat_and_each_compiles_once(parity_check, compile_events):
    runs = {remat: _run(remat, compile_events) for remat in (None, "nothing", "dots")}
    for remat, (run, events) in runs.items():
        # Step 1 lowers (and compiles, unless the persistent cache holds the program).
        assert any("mlir_module" in e for e in events[0]), (remat, events[0])
        assert events[1:] == [[], []], (
            f"remat={remat!r}: steps 2 and 3 must reuse step 1's program; they raised {events[1:]}"
        )
        bad = [k for k, v in run.items() if not np.all(np.isfinite(np.asarray(v, np.float64)))]
        assert not bad, f"remat={remat!r}: non-finite {bad[:5]}"
    none = runs[None][0]
    _check_moves(none)
    for remat in ("nothing", "dots"):
        parity_check(runs[remat][0], none, name=f"live.remat_{remat}_vs_none",
                     class_map="trajectory", order=list(none))  # fmt: skip
