"""The origin on this repository's own goldens (issue 47): their producers do not trace as a
whole (the model is placed on a mesh with `jax.make_array_from_callback`, jitted functions
are called in a Python loop), and still a failing check names the function of the bug,
because the programs the producer runs are recorded, not the producer.

- End to end: `parity check --groups forward_llama --json` on a copy of the working tree
  with a 10% change of the RMS norm's epsilon (`src/decomp/nn.py`) names `rms_norm` in that
  file, and the header no longer calls the order "declared".
- In process: the order read from `forward_llama`'s recorded programs puts a bug in layer 2
  (its attention output weight scaled) first at a layer-2 key, never at a key of layer 3,
  which `last_layer_sites` computes in an earlier program.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import equinox as eqx
import numpy as np
import pytest
from producers import forward_group

from parity.judge.dataflow import numpy_conversions
from parity.judge.trees import flatten
from parity.origin.programs import capture
from parity.origin.record import record_programs
from parity.run.worktree import git, temporary_worktree

ROOT = Path(__file__).resolve().parents[2]
NN = "src/decomp/nn.py"
BEFORE = "jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)"
AFTER = "jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1.1 * eps)"


@pytest.fixture(scope="module")
def changed_tree() -> Iterator[Path]:
    """The working tree's tracked files over a temporary worktree of HEAD (the goldens'
    base commit is in the history), with the epsilon changed."""
    with temporary_worktree(ROOT, "HEAD") as tree:
        for rel in git(ROOT, "ls-files", "-z").split("\0"):
            if rel and (ROOT / rel).is_file():
                (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, tree / rel)
        nn = tree / NN
        text = nn.read_text()
        assert text.count(BEFORE) == 1, f"{NN} no longer computes the mean square as {BEFORE!r}"
        nn.write_text(text.replace(BEFORE, AFTER))
        yield tree


@pytest.mark.slow
def test_an_epsilon_change_on_the_real_goldens_is_named_in_rms_norm(
    changed_tree: Path, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PARITY_", "PYTEST_"))}
    env["PARITY_BASELINE_CACHE"] = str(tmp_path / "baselines")
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "parity", "check", "--groups", "forward_llama",
         "--json", str(report)],
        cwd=changed_tree, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (check,) = json.loads(report.read_text())["checks"]
    origin = check["origin"]
    assert origin is not None, check["origin_line"]
    line = next(n for n, t in enumerate((changed_tree / NN).read_text().splitlines(), 1)
                if AFTER in t)  # fmt: skip
    assert (origin["file"], origin["function"], origin["line"]) == (NN, "rms_norm", line)
    assert "declared" not in proc.stdout, proc.stdout


def _recorded_order(edit: object) -> tuple[dict[str, np.ndarray], list[str]]:
    with numpy_conversions() as converted, capture() as programs:
        out = forward_group("llama", edit=edit)  # type: ignore[arg-type]
    arrays = flatten(out, to_array=lambda x: x)
    _, order = record_programs(programs, arrays, sources=converted.source, evaluate=False)
    assert order is not None and sorted(order) == sorted(arrays)
    return arrays, order


def test_a_bug_in_a_middle_layer_is_named_first_at_that_layers_key() -> None:
    def scale_layer_2(model):
        # The attention output weight of layer 2: its post-LN2 taps are the first to move.
        wo = model.layers["o"]
        return eqx.tree_at(lambda m: m.layers["o"], model, wo.at[2].multiply(1.5))

    clean, order = _recorded_order(None)
    changed, _ = _recorded_order(scale_layer_2)
    differ = [k for k in order if not np.array_equal(clean[k], changed[k])]
    assert differ, "scaling layer 2's output weight changed nothing"
    # Declared order is by layer too; the recorded one must agree on where it starts.
    assert ".layers.2.mlp." in differ[0] or ".resid.3" in differ[0], differ[:3]
    layer3 = [k for k in order if ".layers.3." in k]
    assert order.index(differ[0]) < min(order.index(k) for k in layer3)
