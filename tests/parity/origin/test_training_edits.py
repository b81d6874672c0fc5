"""The origin names the edit on a training loop (issue 58): a newcomer's project of plain
JAX, an adamw step (optax) jitted and called three times in a Python loop, dropout keyed by
`fold_in` of the step. Pinned at its first commit; each edit of the issue's table made in
the working tree, `parity check --json` names the kind of change at the line a person
edited, or, for a constant defined at module level (which a program never sees), at the
line that uses it, with both values.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

MODEL = """\
import jax
import jax.numpy as jnp

LN_EPS = 1e-5
D, H, N = 16, 32, 8


def init(key):
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (D, H)) * D**-0.5,
        "w2": jax.random.normal(k2, (H, 1)) * H**-0.5,
    }


def layer_norm(x):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + LN_EPS)


def dropout(x, key, rate=0.25):
    keep = jax.random.bernoulli(key, 1 - rate, x.shape)
    return jnp.where(keep, x / (1 - rate), 0.0)


def forward(params, x, key):
    h = jnp.tanh(layer_norm(x) @ params["w1"])
    return (dropout(h, key) @ params["w2"])[:, 0]


def loss_fn(params, x, y, key):
    err = forward(params, x, key) - y
    return jnp.mean(err**2)
"""

TRAIN = """\
import jax
import optax

from tinytrain import D, N, init, loss_fn

B2 = 0.999


def train(steps=3):
    root = jax.random.PRNGKey(0)
    params = init(jax.random.PRNGKey(1))
    x = jax.random.normal(jax.random.PRNGKey(2), (N, D))
    y = x.sum(-1)
    opt = optax.adamw(1e-2, b2=B2)
    state = opt.init(params)

    @jax.jit
    def step(params, state, key):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, key)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    losses = []
    for s in range(steps):
        params, state, loss = step(params, state, jax.random.fold_in(root, s))
        losses.append(loss)
    return {"params": params, "loss": losses}
"""

PRODUCERS = """\
from tinytrain.train import train

GROUPS = {"train": train}
"""

MODEL_FILE, TRAIN_FILE = "src/tinytrain/__init__.py", "src/tinytrain/train.py"

#: The issue's edits: (file, old, new, the kinds that say it, the line named (its text), and
#: words the change must hold).
EDITS = {
    "module constant": (MODEL_FILE, "LN_EPS = 1e-5", "LN_EPS = 1e-6", {"constant"},
                        "return (x - mean) / jnp.sqrt(var + LN_EPS)", ["1e-06", "1e-05"]),
    # The step folded into the key at step 0: 1 where it was 0 (made on the host).
    "dropout key": (TRAIN_FILE, "fold_in(root, s)", "fold_in(root, s + 1)", {"input"},
                    "fold_in(root, s + 1)", ["holds 1 where the base's was 0"]),
    # optax's second moment scales the squared gradient by 1 - b2: 0.01 where it was 0.001.
    "adamw b2": (TRAIN_FILE, "B2 = 0.999", "B2 = 0.99", {"constant"},
                 "updates, state = opt.update(grads, state, params)", ["0.01", "0.001"]),
    # The mean's division by N = 8, now by N - 1 = 7.
    "loss": (MODEL_FILE, "jnp.mean(err**2)", "jnp.sum(err**2) / (N - 1)", {"constant"},
             "jnp.sum(err**2) / (N - 1)", ["7.0 where the base had 8.0"]),
}  # fmt: skip


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, git_project: Any) -> Path:
    files = {MODEL_FILE: MODEL, TRAIN_FILE: TRAIN}
    table = 'producers = "producers.py"\nsrc = ["src"]\n'
    return git_project(tmp_path_factory.mktemp("train-edits"), PRODUCERS, table, files=files)


@pytest.mark.parametrize("edit", list(EDITS))
def test_each_edit_of_a_training_loop_is_named_with_its_kind_at_its_line(
    project: Path, run_parity: Callable[..., Any], git: Any, edit: str
) -> None:
    file, old, new, kinds, named, words = EDITS[edit]
    path = project / file
    text = path.read_text()
    assert text.count(old) == 1
    report = project.parent / f"{edit}.json"
    try:
        path.write_text(text.replace(old, new))
        done = run_parity(project, "check", "--json", str(report))
        edited = path.read_text().splitlines()
    finally:
        git(project, "checkout", "-q", "--", ".")
    assert done.returncode == 1, done.stdout + done.stderr
    (check,) = json.loads(report.read_text())["checks"]
    origin = check["origin"]
    assert origin is not None, check["origin_line"]
    line = next(n for n, t in enumerate(edited, 1) if named in t)
    assert (origin["file"], origin["line"]) == (file, line), origin
    assert origin["change"] in kinds, origin
    assert all(w in origin["change_detail"] for w in words), origin
