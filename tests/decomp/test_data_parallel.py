"""Train and eval steps on 1 and on 4 simulated CPU devices give the same numbers.

A process fixes its device count when jax starts, so each arm runs in its own subprocess
(the same script, `XLA_FLAGS` setting the count and the AVX2 cap) and writes its figures to
an `.npz`; the test compares them under the `device_count` class, `1e-4 * |a| + 1e-7`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from parity.run import jax_cache
from parity.run.devices import xla_flags_for

RTOL, ATOL = 1e-4, 1e-7
PRODUCERS_DIR = Path(__file__).resolve().parents[1] / "equivalence"

#: Three train steps and one eval step of the tiny GLU, every figure saved to argv[1]; the
#: configurations are the pinned trajectories' (`producers.spd_configs`, from the folder
#: argv[2]) with test_train.tiny_spd's larger learning rates, weight decay and clip.
_SCRIPT = r"""
import dataclasses, sys
import jax, jax.numpy as jnp, numpy as np
from decomp.eval import make_eval_step
from decomp.mesh import make_dp_mesh, shard_batch
from decomp.targets.glu_transformer import GLUTransformer
from decomp.train import init_train_state, make_train_step

sys.path.insert(0, sys.argv[2])
from producers import spd_configs

out = {"n_devices": np.asarray(jax.device_count())}
glu, pinned = spd_configs(None)
model = jax.jit(lambda k: GLUTransformer.init(glu, key=k))(jax.random.key(0))
cfg = dataclasses.replace(pinned, pgd_lr=0.05, lr_components=1e-2, lr_ci=1e-2,
                          weight_decay=1e-3, grad_clip=0.5)
mesh = make_dp_mesh()
state = init_train_state(model, cfg, key=jax.random.key(7), seq_len=8, mesh=mesh)
step, evaluate = make_train_step(model, cfg, mesh=mesh), make_eval_step(model, cfg, mesh=mesh)
inputs = shard_batch(jax.random.randint(jax.random.key(1), (4, 8), 0, 64, jnp.int32), mesh)
out["input_shards"] = np.asarray(len(inputs.addressable_shards))
for i in range(3):
    state, metrics = step(state, inputs, jax.random.fold_in(jax.random.key(11), i))
    out.update({f"train/{i + 1}/{k}": np.asarray(v) for k, v in metrics.items()})
metrics = evaluate(state, inputs, jax.random.key(5))
out.update({f"eval/{k}": np.asarray(v) for k, v in metrics.items()})
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
def test_train_and_eval_on_four_devices_match_one_device(tmp_path: Path) -> None:
    """Both arms in one test, so that under xdist one worker starts them (in parallel).

    Metrics: every train metric of 3 steps and every eval metric within `1e-4 * |a| +
    1e-7` (measured worst: 4.8e-7 abs in `eval/ce_diff/ci_masked`, a difference of two
    cross-entropies near 4.2, 0.11 of its allowance; train metrics within 3e-8). State
    leaves after 3 steps within 2e-5 abs (measured worst 2.9e-6, in the sources: PGD's
    Adam divides each gradient by its own magnitude, which magnifies reassociation in tiny
    gradients; 5.5e-7 elsewhere).
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
        allowed = RTOL * abs(a) + ATOL
        if not abs(a - b) <= allowed:
            failures.append(f"{k}: 1 device {a!r}, 4 devices {b!r}, |diff| {abs(a - b):.3g}")
    assert not failures, "outside 1e-4*|a| + 1e-7:\n" + "\n".join(failures)

    leaves = [k for k in one if k.startswith("state")]
    assert leaves and sorted(leaves) == sorted(k for k in four if k.startswith("state"))
    worst = {
        k: float(np.max(np.abs(one[k].astype(np.float64) - four[k].astype(np.float64))))
        for k in leaves
    }
    bad = {k: v for k, v in worst.items() if v > 2e-5}
    assert not bad, f"state leaves beyond 2e-5 abs: {bad}"
