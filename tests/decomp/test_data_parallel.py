"""Train and eval steps on 1 and on 4 simulated CPU devices give the same numbers.

A process fixes its device count when jax starts, so each arm runs in its own subprocess
(the same script, `XLA_FLAGS` setting the count and the AVX2 cap) and writes its figures to
an `.npz`; the test compares them under the `device_count` class, `1e-4 * |a| + 1e-7`, where
`a` is the figure itself, or for `ce_diff/{mode}` (a masked cross-entropy minus the clean
one) the clean cross-entropy it is the difference of.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from parity.machinery import _jax_cache as jax_cache
from parity.machinery._devices import xla_flags_for

RTOL, ATOL = 1e-4, 1e-7
PRODUCERS_DIR = Path(__file__).resolve().parents[1] / "equivalence"

#: Three train steps and one eval step of the tiny GLU, every figure saved to argv[1]: the
#: pinned trajectories' configuration without remat (`producers._spd_setup(None)`, from the
#: folder argv[2]) on their inputs (`producers.step_inputs`), the step not donating its state.
#: On one device that train step is byte for byte the program tests/equivalence/test_remat.py
#: runs without remat, so the two share an xdist worker and compile it once: whichever runs
#: second loads it from the machine's compilation cache.
_SCRIPT = r"""
import sys
import jax, numpy as np
from decomp.eval import make_eval_step
from decomp.mesh import make_dp_mesh, shard_batch
from decomp.train import init_train_state, make_train_step

sys.path.insert(0, sys.argv[2])
from producers import SEQ, TRAIN_STEPS, _spd_setup, step_inputs

out = {"n_devices": np.asarray(jax.device_count())}
model, cfg = _spd_setup(None)
mesh = make_dp_mesh()
state = init_train_state(model, cfg, key=jax.random.key(1), seq_len=SEQ, mesh=mesh)
step = make_train_step(model, cfg, mesh=mesh, donate=False)
evaluate = make_eval_step(model, cfg, mesh=mesh)
for i in range(1, TRAIN_STEPS + 1):
    inputs, key = step_inputs(model, i)
    inputs = shard_batch(inputs, mesh)
    state, metrics = step(state, inputs, key)
    out.update({f"train/{i}/{k}": np.asarray(v) for k, v in metrics.items()})
metrics = evaluate(state, inputs, jax.random.key(5))
out.update({f"eval/{k}": np.asarray(v) for k, v in metrics.items()})
out["input_shards"] = np.asarray(len(inputs.addressable_shards))
for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    out["state" + jax.tree_util.keystr(path)] = np.asarray(leaf)
replicated = [x.sharding.is_fully_replicated for x in jax.tree.leaves(state)]
out["state_replicated"] = np.asarray(all(replicated))
try:
    shard_batch(np.zeros((jax.device_count() + 2, 8), np.int32), mesh)
    out["bad_batch_error"] = np.asarray("")
except ValueError as e:
    out["bad_batch_error"] = np.asarray(str(e))
np.savez(sys.argv[1], **out)
"""


def _env(n_devices: int) -> dict[str, str]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = xla_flags_for(n_devices, base=env.get("XLA_FLAGS", ""))
    env.pop("PARITY_DEVICES", None)
    # The machine's compilation cache, as every process the plugin starts.
    env.update(jax_cache.child_env(jax_cache.for_children()))
    return env


def _run_arms(tmp_path: Path, counts: tuple[int, ...]) -> dict[int, dict[str, np.ndarray]]:
    procs = {}
    for n in counts:
        path = tmp_path / f"dp_{n}.npz"
        procs[n] = (
            path,
            subprocess.Popen(
                [sys.executable, "-c", _SCRIPT, str(path), str(PRODUCERS_DIR)],
                env=_env(n),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            ),
        )
    out = {}
    for n, (path, proc) in procs.items():
        log, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"the {n}-device arm failed:\n{log[-4000:]}"
        with np.load(path) as data:
            out[n] = {k: data[k] for k in data.files}
    return out


@pytest.mark.slow
@pytest.mark.xdist_group("trajectory.train_remat_nothing")
def test_train_and_eval_on_four_devices_match_one_device(tmp_path: Path) -> None:
    """Both arms in one test, so that under xdist one worker starts them (in parallel).

    Metrics: every train metric of 3 steps and every eval metric within `1e-4 * |a| + 1e-7`
    (train metrics measured within 6e-8 abs, 0.004 of their allowance; the eval's worst
    share of its allowance 0.35, `eval/kl/unmasked`, a KL near zero). A `ce_diff/{mode}`
    is two cross-entropies near 4.7 subtracted: its rounding is that of its operands (one
    ulp of 4.7 is 4.8e-7), so `a` is the clean cross-entropy there: `ce_diff/unmasked`,
    which cancels to about 1e-8, moved 1.3e-7 between the arms, 0.3 ulp of its operands;
    the worst `ce_diff` moved 1.3e-6 (`zero_masked`, 0.003 of its allowance). Measured on
    the pinned inputs (`producers.step_inputs`). State leaves after 3 steps within 2e-5
    abs (measured worst 2.8e-6, in the CI function's input weights; 1.3e-6 in the sources,
    where PGD's Adam divides each gradient by its own magnitude).
    """
    arms = _run_arms(tmp_path, (1, 4))
    one, four = arms[1], arms[4]
    assert int(one["n_devices"]) == 1 and int(four["n_devices"]) == 4
    assert int(four["input_shards"]) == 4
    assert bool(four["state_replicated"]) and bool(one["state_replicated"])
    msg = str(four["bad_batch_error"])
    assert "batch size 6 does not split over 4 devices" in msg, msg

    keys = sorted(k for k in one if k.startswith(("train/", "eval/")))
    assert keys == sorted(k for k in four if k.startswith(("train/", "eval/")))
    assert len([k for k in keys if k.startswith("train/")]) == 3 * 8
    failures = []
    for k in keys:
        a, b = one[k].astype(np.float64), four[k].astype(np.float64)
        scale = one["eval/ce/clean"] if k.startswith("eval/ce_diff/") else a
        allowed = RTOL * abs(float(scale)) + ATOL
        if not abs(a - b) <= allowed:
            failures.append(f"{k}: 1 device {a!r}, 4 devices {b!r}, |diff| {abs(a - b):.3g}")
    assert not failures, "outside 1e-4*|a| + 1e-7 (a: ce/clean for a ce_diff):\n" + "\n".join(
        failures
    )

    leaves = [k for k in one if k.startswith("state")]
    assert leaves and sorted(leaves) == sorted(k for k in four if k.startswith("state"))
    worst = {
        k: float(np.max(np.abs(one[k].astype(np.float64) - four[k].astype(np.float64))))
        for k in leaves
    }
    bad = {k: v for k, v in worst.items() if v > 2e-5}
    assert not bad, f"state leaves beyond 2e-5 abs: {bad}"
