"""Proved up to rounding through every face (issue 59): `parity check`, `parity bisect`, the
pytest plugin and `assert_equivalent` replay the tree's programs on the base's values, so a
refactor that reorders a sum passes under `up_to_rounding` with no tolerance, and a bug on
top of it fails at its line.

The subject is the newcomer's project (`_tinyformer`), its logits pinned under
`up_to_rounding`, with the refactor whose MLP sums its down projection in two halves
(`REORDER`) and the layer-norm epsilon bug on top of it, as commits.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _tinyformer as tf
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import parity  # noqa: E402

PRODUCERS = tf.PRODUCERS.replace('("logits", "op_by_op")', '("logits", "up_to_rounding")')


@pytest.fixture(scope="module")
def project(
    tmp_path_factory: pytest.TempPathFactory, git_project: Any, git: Any
) -> tuple[Path, dict[str, str]]:
    """The project pinned at its model under `up_to_rounding`, then the reordering refactor
    and the epsilon bug on top of it committed: `(repo, {"reorder": sha, "epsilon": sha})`."""
    assert PRODUCERS != tf.PRODUCERS
    repo = git_project(
        tmp_path_factory.mktemp("rounding"), PRODUCERS, tf.TABLE, files={tf.MODEL_FILE: tf.MODEL}
    )
    bug = tf.REORDER.replace(*tf.BUGS["epsilon"])
    shas = {}
    for name, text in (("reorder", tf.REORDER), ("epsilon", bug)):
        (repo / tf.MODEL_FILE).write_text(text)
        git(repo, "commit", "-qam", name)
        shas[name] = git(repo, "rev-parse", "HEAD")
    return repo, shas


def _live(name: str, tmp: Path) -> dict[str, list[str]]:
    """`assert_equivalent`'s face: the tree's module replayed on the model's values."""
    text = {"reorder": tf.REORDER, "epsilon": tf.REORDER.replace(*tf.BUGS["epsilon"])}[name]
    old = tf.load(tf.MODEL, tmp / f"model_{name}.py")
    new = tf.load(text, tmp / f"tree_{name}.py")
    args = (old.init(jax.random.key(0)), jnp.arange(old.T) % old.VOCAB)

    def logits(module: Any) -> Callable[..., dict[str, Any]]:
        return lambda params, tokens: {"logits": module.forward(params, tokens)}

    try:
        comparison = parity.assert_equivalent(
            jax.jit(logits(new))(*args), jax.jit(logits(old))(*args),
            class_map="up_to_rounding", new_fn=logits(new), old_fn=logits(old), args=args,
        )  # fmt: skip
    except parity.NotEquivalent as failed:
        comparison = failed.comparison
    return {f"forward/{f.key}": [f.verdict, f.basis] for f in comparison.findings}


def test_check_proves_a_reordered_sum_up_to_rounding_and_fails_a_bug_at_its_line(
    project: tuple[Path, dict[str, str]], run_parity: Callable[..., Any], git: Any, tmp_path: Path
) -> None:
    repo, shas = project
    git(repo, "checkout", "-q", shas["reorder"])
    # The premise: op by op cannot prove it (the two halves are operations the model lacks)
    by_ops = run_parity(repo, "check", "--class", "op_by_op", "--origin", "off")
    assert by_ops.returncode == 1, by_ops.stdout + by_ops.stderr
    assert "not proved op by op" in by_ops.stdout
    report = tmp_path / "reorder.json"
    done = run_parity(repo, "check", "--json", str(report))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "logits equivalent up to rounding (compiled outputs differ" in done.stdout
    doc = json.loads(report.read_text())
    (finding,) = doc["findings"]
    assert doc["proved"] == ["forward/logits"] and finding["basis"] == "rounding", finding
    # How: the closest operation is the added halves, inside its bound
    assert "proved up to rounding:" in finding["note"], finding["note"]
    assert f"{tf.MODEL_FILE}:{_halves_line()} in mlp" in finding["note"], finding["note"]
    git(repo, "checkout", "-q", shas["epsilon"])
    failed = run_parity(repo, "check")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "not proved up to rounding:" in failed.stdout
    lines = [ln.strip() for ln in failed.stdout.splitlines()]
    (origin,) = [ln for ln in lines if ln.startswith("origin:")]
    line = next(n for n, t in enumerate(tf.MODEL.splitlines(), 1) if "1e-5" in t)
    assert f"{tf.MODEL_FILE}:{line} in layer_norm" in origin, origin
    assert "a changed constant: its constant 1e-06 where the base had 1e-05" in origin, origin
    # Of the two hunks from the pin (the reorder and the bug), the bug's (issue 74).
    assert origin.endswith(
        f"the edit: {tf.MODEL_FILE}:{line} `return (x - mean) / jnp.sqrt(var + 1e-6)`: it "
        "writes the constant 1e-06, where the base's lines wrote 1e-05"
    ), origin


def _halves_line() -> int:
    return next(n for n, t in enumerate(tf.REORDER.splitlines(), 1) if "[half:]" in t)


def test_every_face_proves_the_reorder_and_fails_the_bug_alike(
    project: tuple[Path, dict[str, str]],
    run_parity: Callable[..., Any],
    run_pytest: Callable[..., Any],
    git: Any,
    tmp_path: Path,
) -> None:
    """`parity check`, bisect's step at each commit, the plugin and `assert_equivalent` give
    the logits the same verdict on the same basis, and bisect from the pin names the bug's
    commit, the reorder a good step."""
    repo, shas = project
    found, faces = tf.every_face(
        repo, shas, lambda name: _live(name, tmp_path), run_parity=run_parity,
        run_pytest=run_pytest, git=git, out=tmp_path,
    )  # fmt: skip
    assert found["first_bad_commit"] == shas["epsilon"], found
    assert faces["reorder"]["check"] == {"forward/logits": ["pass", "rounding"]}, faces
    assert faces["epsilon"]["check"] == {"forward/logits": ["fail", ""]}, faces
    for name, said in faces.items():
        assert all(v == said["check"] for v in said.values()), (name, said)
