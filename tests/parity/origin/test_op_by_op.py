"""Proved op by op (issue 48): a key of class `op_by_op` whose compiled bits moved passes
where both programs, recorded operation by operation, compute it from values equal bit
for bit, and fails, with its origin at the changed line, where they do not.

The subject is a newcomer's project (`_tinyformer`): a 4-layer pure-JAX transformer that
returns only its logits, its refactor to stacked weights, a `lax.scan` and an einsum, and
three one-line bugs of the refactored code. In process through `assert_equivalent`, and as
a fresh git project through `parity check` and the pytest plugin.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import _tinyformer as tf
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import parity  # noqa: E402
from parity.judge._compare import compare_trees  # noqa: E402
from parity.judge._reasons import UNPROVED  # noqa: E402
from parity.origin import locate, record  # noqa: E402
from parity.origin._proof import prove, settle  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModuleType]:
    """The model as it was, its refactor and each bug, imported from files of their text."""
    folder = tmp_path_factory.mktemp("tinyformer")
    texts = {"model": tf.MODEL, "refactor": tf.REFACTOR}
    texts |= {name: tf.buggy(name) for name in tf.BUGS}
    return {name: tf.load(text, folder / f"tf_{name}.py") for name, text in texts.items()}


@pytest.fixture(scope="module")
def inputs(models: dict[str, ModuleType]) -> tuple[Any, Any]:
    old = models["model"]
    return old.init(jax.random.key(0)), jnp.arange(old.T) % old.VOCAB


def _logits(module: ModuleType) -> Callable[..., dict[str, Any]]:
    return lambda params, tokens: {"logits": module.forward(params, tokens)}


def _check(
    models: dict[str, ModuleType], inputs: tuple[Any, Any], name: str, class_map: str
) -> parity.Comparison:
    new, old = _logits(models[name]), _logits(models["model"])
    return parity.assert_equivalent(
        jax.jit(new)(*inputs), jax.jit(old)(*inputs), class_map=class_map,
        new_fn=new, old_fn=old, args=inputs,
    )  # fmt: skip


def test_the_refactor_passes_proved_op_by_op(
    models: dict[str, ModuleType], inputs: tuple[Any, Any]
) -> None:
    new = np.asarray(jax.jit(_logits(models["refactor"]))(*inputs)["logits"])
    old = np.asarray(jax.jit(_logits(models["model"]))(*inputs)["logits"])
    differ = int((new != old).sum())
    # The premise: XLA compiles the refactor to other bits, so bitwise fails it.
    assert differ > 0, "the refactor compiled to the same bits: nothing left to prove"
    with pytest.raises(AssertionError, match="breaks class 'bitwise'") as failed:
        _check(models, inputs, "refactor", "bitwise")
    # ... and its message says which class passes it, having checked equality op by op
    (origin,) = [ln for ln in str(failed.value).splitlines() if ln.startswith("origin: ")]
    assert origin.endswith(
        "equal bit for bit when run op by op (the difference is in how XLA compiled them, not "
        "in the operations): the class op_by_op passes such a key, proved op by op"
    ), origin
    comparison = _check(models, inputs, "refactor", "op_by_op")
    (finding,) = comparison.proved
    assert finding.key == "logits" and not finding.bitwise_equal
    worst = float(np.abs(new.astype(np.float64) - old).max())
    assert finding.note == (
        f"equivalent op by op; compiled outputs differ by at most {worst:.3g}, "
        f"{differ} of {new.size} elements"
    )
    line = parity.format_table(comparison).splitlines()[0]
    assert line.startswith("parity: PASS (0 of 1 array fail), logits equivalent op by op"), line


@pytest.mark.parametrize("bug", sorted(tf.BUGS))
def test_each_bug_fails_op_by_op_with_its_origin_at_the_changed_line(
    models: dict[str, ModuleType], inputs: tuple[Any, Any], bug: str
) -> None:
    with pytest.raises(AssertionError) as failed:
        _check(models, inputs, bug, "op_by_op")
    text = str(failed.value)
    assert "not proved op by op: run op by op," in text, text
    (origin,) = [ln for ln in text.splitlines() if ln.startswith("origin: ")]
    assert f"tf_{bug}.py:{tf.bug_line(bug)} in " in origin, origin


def _two(fn_new: Callable[..., Any], fn_old: Callable[..., Any], *args: Any) -> Any:
    """Both functions' compiled outputs compared bitwise-then-op-by-op, with their
    recordings: `(comparison, new recording, old recording)`."""
    new, old = jax.jit(fn_new)(*args), jax.jit(fn_old)(*args)
    comparison = compare_trees(
        {k: np.asarray(v) for k, v in new.items()}, {k: np.asarray(v) for k, v in old.items()},
        lambda key: "op_by_op",
    )  # fmt: skip
    return comparison, record(fn_new, *args), record(fn_old, *args)


def test_a_key_wired_to_another_value_is_never_proved() -> None:
    """A tap that reads another site: every value it is computed from equals the old
    program's, and so does its own value, but it is another key's."""
    x = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)

    def old(x: Any) -> dict[str, Any]:
        h = jnp.tanh(x)
        return {"a": h, "b": h * 2.0}

    def new(x: Any) -> dict[str, Any]:
        h = jnp.tanh(x)
        return {"a": h * 2.0, "b": h * 2.0}  # "a" reads b's site

    new_rec, old_rec = record(new, x), record(old, x)
    proofs = prove(new_rec, old_rec, ["a", "b"], against="the base")
    assert proofs["b"].proved and not proofs["a"].proved
    assert proofs["a"].reason == (
        "run op by op, every value it is computed from equals one of the base's, yet it is "
        "not the base's a (it reads another value)"
    )
    found = locate(new_rec, old_rec, key="a", against="the base")
    assert found.status == "named" and "the output reads another value" in found.line


def test_settle_passes_only_what_was_proved_and_says_why_the_rest_was_not() -> None:
    x = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)

    def old(x: Any) -> dict[str, Any]:
        return {"y": jnp.tanh(x) + 1.0}

    def new(x: Any) -> dict[str, Any]:
        return {"y": jnp.tanh(x) + 1.0 + 1e-3}

    comparison, new_rec, old_rec = _two(new, old, x)
    (failing,) = comparison.failures
    assert failing.reason.endswith(UNPROVED)
    settled = settle(comparison, prove(new_rec, old_rec, ["y"], against="the base"))
    (still,) = settled.failures
    why = still.reason.split("; not proved op by op: ")[1]
    assert "1 value it is computed from equals no value of the base's; the first is add at " in (
        why
    )
    assert f"{Path(__file__).name}:" in why and why.endswith("<locals>.new"), why
    assert not settled.proved and not still.reason.endswith(UNPROVED)


PRODUCERS, MODEL_FILE = tf.PRODUCERS, tf.MODEL_FILE


@pytest.fixture(scope="module")
def project(
    tmp_path_factory: pytest.TempPathFactory, git_project: Any, git: Any
) -> tuple[Path, dict[str, str]]:
    """The newcomer's project pinned at its model, then the refactor and the epsilon bug
    committed on top: `(repo, {"refactor": sha, "epsilon": sha})`."""
    repo = git_project(
        tmp_path_factory.mktemp("newcomer"), PRODUCERS, tf.TABLE, files={MODEL_FILE: tf.MODEL},
    )  # fmt: skip
    shas = {}
    for name, text in (("refactor", tf.REFACTOR), ("epsilon", tf.buggy("epsilon"))):
        (repo / MODEL_FILE).write_text(text)
        git(repo, "commit", "-qam", name)
        shas[name] = git(repo, "rev-parse", "HEAD")
    return repo, shas


def test_parity_check_passes_the_refactor_proved_and_fails_the_bug_at_its_line(
    project: tuple[Path, dict[str, str]], run_parity: Callable[..., Any], git: Any
) -> None:
    repo, shas = project
    git(repo, "checkout", "-q", shas["refactor"])
    report = repo.parent / "refactor.json"
    done = run_parity(repo, "check", "--json", str(report))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "logits equivalent op by op (compiled outputs differ by at most" in done.stdout
    assert json.loads(report.read_text())["proved"] == ["forward/logits"]
    git(repo, "checkout", "-q", shas["epsilon"])
    done = run_parity(repo, "check")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "not proved op by op: run op by op," in done.stdout
    (origin,) = [ln.strip() for ln in done.stdout.splitlines() if ln.strip().startswith("origin:")]
    assert f"{MODEL_FILE}:{tf.bug_line('epsilon')} in layer_norm" in origin, origin
    # Without the origin the proof is still tried: a key of op_by_op is never passed unproved
    quiet = run_parity(repo, "check", "--origin", "off")
    assert quiet.returncode == 1 and "not proved op by op: run op by op," in quiet.stdout
    assert "origin:" not in quiet.stdout and "op by op to prove its keys" in quiet.stderr


def _live_verdicts(models: dict[str, ModuleType], inputs: tuple[Any, Any], name: str) -> Any:
    """`assert_equivalent`'s face: each key's verdict and basis, passing or not."""
    try:
        comparison = _check(models, inputs, name, "op_by_op")
    except parity.NotEquivalent as failed:
        comparison = failed.comparison
    return {f"forward/{f.key}": [f.verdict, f.basis] for f in comparison.findings}


def test_every_face_gives_each_key_the_same_verdict(
    project: tuple[Path, dict[str, str]],
    models: dict[str, ModuleType],
    inputs: tuple[Any, Any],
    run_parity: Callable[..., Any],
    run_pytest: Callable[..., Any],
    git: Any,
) -> None:
    """Issue 57: for the same tree, `parity check`, bisect's step at its commit, the pytest
    plugin and `assert_equivalent` give each key the same verdict on the same basis; and
    bisect, which judged without the proof, names the bug's commit, not the proved
    refactor."""
    repo, shas = project
    found, faces = tf.every_face(
        repo, shas, lambda name: _live_verdicts(models, inputs, name), run_parity=run_parity,
        run_pytest=run_pytest, git=git, out=repo.parent, bisect=("--class", "op_by_op"),
    )  # fmt: skip
    assert found["first_bad_commit"] == shas["epsilon"], found
    steps = {s["sha"]: s for s in found["steps"]}
    assert steps[shas["refactor"]]["outcome"] == "good", steps
    assert faces["refactor"]["check"] == {"forward/logits": ["pass", "proved"]}, faces
    assert faces["epsilon"]["check"] == {"forward/logits": ["fail", ""]}, faces
    for name, said in faces.items():
        assert all(v == said["check"] for v in said.values()), (name, said)


def test_bisect_with_a_calibrated_class_reads_the_calibration_of_the_goldens(
    project: tuple[Path, dict[str, str]], run_parity: Callable[..., Any], git: Any
) -> None:
    # GOOD's goldens are pinned afresh into a temporary folder; a fresh pin records no
    # calibration, so they take the one of GOOD's goldens (here: not committed at GOOD, so
    # the project's). The spread is written as a calibration would record it.
    repo, shas = project
    git(repo, "checkout", "-q", shas["epsilon"])
    path = repo / "goldens" / "forward.h5"
    kept = path.read_bytes()
    try:
        spread = {"labels": ["repeat"], "keys": {"logits": [1e-6]}}
        calibration = {"spread": spread, "summary": "under repeat: logits 1e-06 abs"}
        tf.with_provenance(path, {"calibration": calibration})
        pin = git(repo, "rev-parse", f"{shas['refactor']}~1")
        report = repo.parent / "bisect-calibrated.json"
        done = run_parity(repo, "bisect", pin, shas["epsilon"], "--class", "calibrated",
                          "--origin", "off", "--json", str(report))  # fmt: skip
    finally:
        path.write_bytes(kept)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cannot check" not in done.stdout + done.stderr
    assert "forward: the calibration of" in done.stdout + done.stderr
    found = json.loads(report.read_text())
    assert found["first_bad_commit"] == shas["epsilon"], done.stdout
    assert found["class"] == "calibrated"


PLUGIN_FAILS = """\
import producers


def test_forward(parity_check):
    parity_check(producers.forward(), "forward")
"""


def test_every_face_names_the_same_origin_with_its_kind(
    project: tuple[Path, dict[str, str]],
    run_parity: Callable[..., Any],
    run_pytest: Callable[..., Any],
    git: Any,
    tmp_path: Path,
) -> None:
    """Issue 58: the epsilon bug's origin is the same changed constant, at the same line,
    through `parity check`, `parity bisect`, the pytest plugin and `parity.localise`."""
    repo, shas = project
    said = "a changed constant: its constant 1e-06 where the base had 1e-05"
    line = f"{MODEL_FILE}:{tf.bug_line('epsilon')} in layer_norm"
    git(repo, "checkout", "-q", shas["epsilon"])
    checked = run_parity(repo, "check", "--json", str(tmp_path / "check.json"))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    bisected = run_parity(repo, "bisect", shas["refactor"], shas["epsilon"], "--class",
                          "op_by_op", "--json", str(tmp_path / "bisect.json"))  # fmt: skip
    assert bisected.returncode == 0, bisected.stdout + bisected.stderr
    (repo / "test_fails.py").write_text(PLUGIN_FAILS)
    try:
        plugged = run_pytest(repo, "test_fails.py")
    finally:
        (repo / "test_fails.py").unlink()
    assert plugged.returncode == 1, plugged.stdout + plugged.stderr
    lines = {
        "check": json.loads((tmp_path / "check.json").read_text())["checks"][0]["origin_line"],
        "bisect": json.loads((tmp_path / "bisect.json").read_text())["origin_line"],
        "plugin": next(ln for ln in plugged.stdout.splitlines() if "origin: " in ln),
    }
    # The live face: the refactor and the bug as two copies of one file (`tinyformer`).
    old = tf.load(tf.REFACTOR, _folder(tmp_path / "base") / "tinyformer.py")
    new = tf.load(tf.buggy("epsilon"), _folder(tmp_path / "tree") / "tinyformer.py")
    params, tokens = old.init(jax.random.key(0)), jnp.arange(old.T) % old.VOCAB
    loc = parity.localise(_logits(new), _logits(old), params, tokens, root=tmp_path)
    lines["localise"] = loc.line.replace("tree/tinyformer.py", MODEL_FILE)
    for face, text in lines.items():
        assert said in text and line in text, (face, text)


def _folder(path: Path) -> Path:
    path.mkdir()
    return path
