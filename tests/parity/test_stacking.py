"""A refactor that stacks layers keeps its goldens (issue 60): per-layer and stacked keys
compared as one, with one line of configuration (`STACK` in the producers, `stack=` of a
check), and where none is declared, a failure that says which missing keys are rows of
which new keys and the rule to declare. The pytest plugin reads the producers' `STACK` as
`parity check` does (issue 72): the project's own test passes no `stack=`.

The project is an equinox model of two layers, its trajectory producer returning the
model's state after two jitted SGD steps (`{"params": model}`): per-layer keys
`params.blocks.0.w` ... as pinned; then its refactor, the layers stacked into one `Block` of
leading axis 2 applied with `lax.scan` (`params.blocks.w`); then a bug in layer 1's init.
The same with a flax `nnx` model (its layers' states stacked with `nnx.split`/`nnx.merge`,
applied with `nnx.scan`, the producer returning `nnx.state(model)`).
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import parity
from parity.judge._compare import compare_trees
from parity.judge._stacking import StackRule, parse_stack, stacking_offer, unstack
from parity.store import open_goldens

MODEL = """\
import equinox as eqx
import jax
import jax.numpy as jnp

D, L = 8, 2


class Block(eqx.Module):
    w: jax.Array
    b: jax.Array


class Model(eqx.Module):
    blocks: list


def init(key):
    keys = jax.random.split(key, L)
    return Model([Block(jax.random.normal(k, (D, D)) * D**-0.5, jnp.zeros(D)) for k in keys])


def block(x, p):
    return jnp.tanh(x @ p.w + p.b)


def forward(m, x):
    for p in m.blocks:
        x = block(x, p)
    return x


def loss(m, x):
    return jnp.mean(forward(m, x) ** 2)


def step(m, x):
    g = jax.grad(loss)(m, x)
    return jax.tree.map(lambda p, d: p - 0.1 * d, m, g)
"""

STACKED = MODEL.replace(
    """    return Model([Block(jax.random.normal(k, (D, D)) * D**-0.5, jnp.zeros(D)) for k in keys])
""",
    """    ws = jnp.stack([jax.random.normal(k, (D, D)) * D**-0.5 for k in keys])
    return Model(Block(ws, jnp.zeros((L, D))))
""",
).replace(
    """    for p in m.blocks:
        x = block(x, p)
    return x
""",
    """    def body(x, p):
        return block(x, p), None

    x, _ = jax.lax.scan(body, x, m.blocks)
    return x
""",
)

#: A bug in one layer: layer 1's weights scaled at init.
BUGGY = STACKED.replace(
    "    return Model(Block(ws, jnp.zeros((L, D))))\n",
    "    ws = ws.at[1].multiply(1.001)\n    return Model(Block(ws, jnp.zeros((L, D))))\n",
)

PRODUCERS = """\
import jax
import jax.numpy as jnp

import model


def train():
    m = model.init(jax.random.key(0))
    x = jnp.linspace(-1.0, 1.0, 8 * model.D).reshape(8, model.D)
    step = jax.jit(model.step)
    for _ in range(2):
        m = step(m, x)
    return {"params": m}


GROUPS = {"train": train}
CLASS_MAP = [("*", "fp32_reassoc")]
"""


def test_rules_parse_and_refuse_what_they_cannot_mean() -> None:
    (rule,) = parse_stack("params.blocks.{i}")
    assert rule == StackRule("params.blocks.{i}", "params.blocks")
    assert rule.layer("params.blocks.3.w") == (3, "w") and rule.layer("params.head") is None
    for bad in ("blocks", "blocks.{i}.w", "{i}"):
        with pytest.raises(ValueError, match="last segment is"):
            parse_stack(bad)


def test_unstack_splits_either_side_into_the_others_per_layer_keys() -> None:
    rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    per = {f"b.{i}.w": rows[i] for i in range(3)} | {"head": np.ones(1)}
    stacked = {"b.w": rows, "head": np.ones(1)}
    rule = parse_stack("b.{i}")
    a, e = unstack(stacked, per, rule)
    assert sorted(a) == sorted(per) and e.keys() == per.keys()
    for i in range(3):
        np.testing.assert_array_equal(a[f"b.{i}.w"], rows[i])
    a, e = unstack(per, stacked, rule)
    assert sorted(e) == sorted(per)
    # only where the other side holds the rows: a stacked key on both sides stays whole
    assert unstack(stacked, stacked, rule)[0].keys() == stacked.keys()


def test_missing_rows_of_a_new_key_are_offered_the_rule() -> None:
    offered = stacking_offer(["p.blocks.0.w", "p.blocks.1.w", "p.gone"], {"p.blocks.w": (2, 4)})
    assert offered == {
        "p.blocks.0.w": ("p.blocks.{i}", "p.blocks.w", 0),
        "p.blocks.1.w": ("p.blocks.{i}", "p.blocks.w", 1),
    }
    assert stacking_offer(["p.blocks.0.w"], {"p.blocks.w": (2, 4)}) == {}  # row 1 is not missing


def test_assert_equivalent_compares_stacked_and_per_layer_trees_as_one() -> None:
    rows = np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4)
    per = {"blocks": [{"w": rows[i]} for i in range(3)]}
    parity.assert_equivalent({"blocks": {"w": rows}}, per, stack="blocks.{i}")
    moved = rows.copy()
    moved[1, 2] += 1e-3
    with pytest.raises(AssertionError) as failed:
        parity.assert_equivalent({"blocks": {"w": moved}}, per, stack="blocks.{i}")
    assert "blocks.1.w [bitwise, fail]" in str(failed.value)
    assert "blocks.w" not in str(failed.value).replace("blocks.1.w", "")
    with pytest.raises(AssertionError) as undeclared:
        parity.assert_equivalent({"blocks": {"w": rows}}, per)
    assert "it is row 2 of the new key 'blocks.w'" in str(undeclared.value)
    assert "stack = ['blocks.{i}']" in str(undeclared.value)


NNX_MODEL = """\
import jax
import jax.numpy as jnp
from flax import nnx

D, L = 8, 2


class Block(nnx.Module):
    def __init__(self, rngs):
        self.fc1 = nnx.Linear(D, D, rngs=rngs)
        self.fc2 = nnx.Linear(D, D, rngs=rngs)

    def __call__(self, x):
        return x + self.fc2(jnp.tanh(self.fc1(x)))


class Model(nnx.Module):
    def __init__(self, rngs):
        self.blocks = nnx.List([Block(rngs) for _ in range(L)])

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return x
"""

#: The layers built as before, their states stacked (nnx.split / nnx.merge), applied with
#: nnx.scan.
NNX_STACKED = NNX_MODEL.replace(
    """        self.blocks = nnx.List([Block(rngs) for _ in range(L)])
""",
    """        blocks = [Block(rngs) for _ in range(L)]
        graphdef, states = nnx.split(blocks[0])[0], [nnx.split(b)[1] for b in blocks]
        self.blocks = nnx.merge(graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), *states))
""",
).replace(
    """        for block in self.blocks:
            x = block(x)
        return x
""",
    """        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def body(x, block):
            return block(x)

        return body(x, self.blocks)
""",
)

NNX_BUGGY = NNX_STACKED.replace(
    "        self.blocks = nnx.merge(graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), *states))\n",
    "        self.blocks = nnx.merge(graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), *states))\n"
    "        self.blocks.fc1.kernel.value = self.blocks.fc1.kernel.value.at[1].multiply(1.001)\n",
)

NNX_PRODUCERS = """\
import jax
import jax.numpy as jnp
from flax import nnx

import model


def train():
    m = model.Model(nnx.Rngs(0))
    x = jnp.linspace(-1.0, 1.0, 8 * model.D).reshape(8, model.D)
    graphdef, state = nnx.split(m)

    @jax.jit
    def step(state):
        m = nnx.merge(graphdef, state)
        grads = nnx.grad(lambda m: jnp.mean(m(x) ** 2))(m)
        params = nnx.state(m, nnx.Param)
        nnx.update(m, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads))
        return nnx.state(m)

    for _ in range(2):
        state = step(state)
    return {"params": state}


GROUPS = {"train": train}
CLASS_MAP = [("*", "fp32_reassoc")]
"""

#: framework -> (the model per layer, stacked, stacked with a bug in layer 1, producers,
#: a key of layer 1 the bug moves)
PROJECTS = {
    "equinox": (MODEL, STACKED, BUGGY, PRODUCERS, "params.blocks.1.w"),
    "nnx": (NNX_MODEL, NNX_STACKED, NNX_BUGGY, NNX_PRODUCERS, "params.blocks.1.fc1.kernel"),
}


@pytest.fixture(scope="module", params=sorted(PROJECTS))
def project(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    git_project: Any,
    git: Any,
) -> tuple[Path, dict[str, str]]:
    """A project pinned per layer, then stacked (with `STACK`), then the bug: `(repo,
    {"stacked": sha, "bug": sha, "key": a key of layer 1 the bug moves, "line": the bug's
    line in src/model.py})`."""
    model, stacked, buggy, producers_text, key = PROJECTS[request.param]
    repo = git_project(
        tmp_path_factory.mktemp(f"stacked-{request.param}"), producers_text,
        'producers = "producers.py"\nsrc = ["src"]\n', files={"src/model.py": model},
    )  # fmt: skip
    edited = next(i for i, ln in enumerate(buggy.splitlines(), 1) if "multiply(1.001)" in ln)
    shas = {"key": key, "producers": producers_text, "line": str(edited)}
    producers = repo / "producers.py"
    for name, text in (("stacked", stacked), ("bug", buggy)):
        (repo / "src" / "model.py").write_text(text)
        producers.write_text(producers_text + 'STACK = ["params.blocks.{i}"]\n')
        git(repo, "commit", "-qam", name)
        shas[name] = git(repo, "rev-parse", "HEAD")
    return repo, shas


@pytest.mark.slow
def test_the_stacking_refactor_passes_its_per_layer_goldens_and_a_layer_bug_is_named(
    project: tuple[Path, dict[str, str]],
    run_parity: Callable[..., Any],
    run_pytest: Callable[..., Any],
    git: Any,
) -> None:
    repo, shas = project
    git(repo, "checkout", "-q", shas["stacked"])
    done = run_parity(repo, "check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "params.blocks.w" not in done.stdout
    git(repo, "checkout", "-q", shas["bug"])
    bug = run_parity(repo, "check")
    assert bug.returncode == 1, bug.stdout + bug.stderr
    failures = bug.stdout[bug.stdout.index("failures (") :]
    assert f"train/{shas['key']} [fp32_reassoc, fail]" in failures, failures
    assert "missing" not in failures and "unexpected" not in failures
    # The origin of a per-layer key is found through the stacked output that holds it: at
    # the line that moved layer 1.
    origin = next(ln for ln in bug.stdout.splitlines() if ln.strip().startswith("origin:"))
    assert f"at src/model.py:{shas['line']} in " in origin, origin
    # Of the diff from the pin (the stacking refactor's hunks and the bug's), the edit named
    # is the one hunk that holds the bug's line, which the call chain ran through (issue 74).
    named = re.search(r"the edit: src/model\.py:(\d+)(?:-(\d+))? `", origin)
    assert named is not None, origin
    first, last = int(named.group(1)), int(named.group(2) or named.group(1))
    assert first <= int(shas["line"]) <= last, origin
    assert f"it holds src/model.py:{shas['line']} in " in origin, origin
    # The goldens record the version of each distribution the producers imported (issue
    # 74): the model's framework among them, as the framework says its own version.
    name = "equinox" if shas["key"] == PROJECTS["equinox"][4] else "flax"
    with open_goldens(repo / "goldens" / "train.h5") as gf:
        packages = dict(gf.provenance.packages or {})
    assert packages.get(name) == importlib.import_module(name).__version__, packages
    assert "parity-harness" not in packages, packages
    # The pytest plugin reads the producers' STACK as the check does (issue 72): the test
    # passes no `stack=`, the same key fails, and its origin is found through the stacked
    # output (the base's recording is the one the check cached).
    (repo / "test_train.py").write_text(PLUGIN_TEST)
    try:
        plugged = run_pytest(repo, "test_train.py")
    finally:
        (repo / "test_train.py").unlink()
    assert plugged.returncode == 1, plugged.stdout + plugged.stderr
    assert f"{shas['key']} [fp32_reassoc, fail]" in plugged.stdout, plugged.stdout
    assert "missing" not in plugged.stdout and "unexpected" not in plugged.stdout
    origin = next(ln for ln in plugged.stdout.splitlines() if "origin:" in ln)
    assert f"at src/model.py:{shas['line']} in " in origin, origin
    if shas["key"] == PROJECTS["equinox"][4]:  # one project: bisect's four producer runs
        # Bisect's answer is settled through the door the check settles by (issue 72): its
        # origin between the bug and its parent, both stacked, follows the producers' STACK
        # to the row holding the per-layer key (it said the recorded programs "do not both
        # output" the key, before).
        pin = git(repo, "rev-parse", f"{shas['stacked']}~1")
        report = repo.parent / "bisect-stacked.json"
        found = run_parity(repo, "bisect", pin, shas["bug"], "--json", str(report))
        assert found.returncode == 0, found.stdout + found.stderr
        doc = json.loads(report.read_text())
        assert doc["first_bad_commit"] == shas["bug"], doc["steps"]
        assert f"at src/model.py:{shas['line']} in " in doc["origin_line"], doc["origin_line"]
    # Without the rule, the failure says which rule compares them.
    producers = repo / "producers.py"
    try:
        producers.write_text(shas["producers"])
        undeclared = run_parity(repo, "check", "--origin", "off")
    finally:
        git(repo, "checkout", "-q", "-f", shas["bug"])
    assert undeclared.returncode == 1
    assert "stack = ['params.blocks.{i}']" in undeclared.stdout, undeclared.stdout


#: The project's test through the pytest plugin: no `stack=`, the producers' `STACK` read
#: as `parity check` reads it.
PLUGIN_TEST = """\
import producers


def test_train(parity_check):
    parity_check(producers.train(), "train")
"""


@pytest.mark.slow
def test_the_stacking_refactor_passes_op_by_op_each_row_proved_or_equal(
    project: tuple[Path, dict[str, str]],
    run_parity: Callable[..., Any],
    run_pytest: Callable[..., Any],
    git: Any,
) -> None:
    # A per-layer golden key whose bits moved is proved as its row of the stacked output
    # (test_a_per_layer_key_is_proved_as_its_row_of_the_stacked_output); this XLA may also
    # compile the scan to the loop's bits, and then there is nothing to prove. The plugin
    # (issue 72) reads the producers' STACK as the check does: the same verdicts, the same
    # keys proved, with no `stack=` in its test.
    repo, shas = project
    git(repo, "checkout", "-q", shas["stacked"])
    report = repo.parent / "stacked-op-by-op.json"
    done = run_parity(repo, "check", "--class", "op_by_op", "--json", str(report))
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(report.read_text())
    moved = [f["key"] for f in doc["findings"] if not f["bitwise_equal"]]
    assert sorted(doc["proved"]) == sorted(moved), doc["findings"]
    (repo / "test_train.py").write_text(PLUGIN_TEST)
    try:
        plugged = run_pytest(repo, "test_train.py", "--parity-class", "op_by_op",
                             "--parity-report", str(repo.parent / "plugin-report"))  # fmt: skip
    finally:
        (repo / "test_train.py").unlink()
    assert plugged.returncode == 0, plugged.stdout + plugged.stderr
    seen = json.loads((repo.parent / "plugin-report" / "report.json").read_text())
    assert {f["key"]: f["verdict"] for f in seen["findings"]} == {
        f["key"]: f["verdict"] for f in doc["findings"]
    }, seen["findings"]
    assert sorted(seen["proved"]) == sorted(doc["proved"]), seen["findings"]
    git(repo, "checkout", "-q", shas["bug"])
    bug = run_parity(repo, "check", "--class", "op_by_op", "--origin", "off")
    assert bug.returncode == 1, bug.stdout + bug.stderr
    assert f"train/{shas['key']} [op_by_op, fail]" in bug.stdout


def test_a_per_layer_key_is_proved_as_its_row_of_the_stacked_output() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    from parity.origin import record
    from parity.origin._proof import prove

    ws = [jnp.linspace(-1.0, 1.0, 9).reshape(3, 3) * (i + 1) for i in range(2)]
    x = jnp.arange(3.0)

    def old(ws: Any, x: Any) -> Any:  # a loop over layers, a key per layer
        return {"blocks": [{"y": jnp.tanh(x @ w)} for w in ws]}

    def new(ws: Any, x: Any) -> Any:  # the layers stacked and scanned, one key for all
        ys = jax.lax.scan(lambda c, w: (c, jnp.tanh(x @ w)), 0.0, jnp.stack(ws))[1]
        return {"blocks": {"y": ys}}

    def bug(ws: Any, x: Any) -> Any:
        return {"blocks": {"y": new(ws, x)["blocks"]["y"].at[1].add(1e-3)}}

    rules = parse_stack("blocks.{i}")
    keys = ["blocks.0.y", "blocks.1.y"]
    base = record(old, ws, x)
    proofs = prove(record(new, ws, x), base, keys, stack=rules)
    assert all(proofs[k].proved for k in keys), proofs
    assert not prove(record(new, ws, x), base, keys)["blocks.1.y"].proved  # no rule: no row
    assert not prove(record(bug, ws, x), base, keys, stack=rules)["blocks.1.y"].proved


def test_parity_diff_compares_a_stacked_file_with_per_layer_goldens(tmp_path: Path) -> None:
    from parity.commands._diff import run_diff
    from parity.store import write_goldens

    rows = np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4)
    golden = write_goldens(tmp_path / "g.h5", {f"blocks.{i}.w": rows[i] for i in range(3)})
    actual = write_goldens(tmp_path / "a.h5", {"blocks.w": rows})
    result = run_diff(actual, golden, stack=["blocks.{i}"])
    assert result.exit_code == 0 and [f.key for f in result.comparison.findings] == [
        "blocks.0.w",
        "blocks.1.w",
        "blocks.2.w",
    ]
    undeclared = run_diff(actual, golden)
    assert undeclared.exit_code == 1
    assert "stack = ['blocks.{i}']" in undeclared.comparison.findings[0].reason


def _unstacked() -> tuple[Any, Any, Callable[..., Any], Callable[..., Any]]:
    """The reverse refactor: `(ws, x, scanned, looped)`, the old function scanning stacked
    layers into one key, the new one looping, a key per layer."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    ws = jnp.stack([jnp.linspace(-1.0, 1.0, 9).reshape(3, 3) * (i + 1) for i in range(2)])
    x = jnp.arange(3.0)

    def scanned(ws: Any, x: Any) -> Any:
        return {"blocks": {"y": jax.lax.scan(lambda c, w: (c, jnp.tanh(x @ w)), 0.0, ws)[1]}}

    def looped(ws: Any, x: Any) -> Any:
        return {"blocks": [{"y": jnp.tanh(x @ ws[i])} for i in range(len(ws))]}

    return ws, x, scanned, looped


def test_a_stacked_key_is_proved_from_its_rows_per_layer_and_its_origin_named() -> None:
    """The reverse: the old program outputs the stack, the new one per layer again."""
    from parity.origin import prove_and_locate, record
    from parity.origin._proof import prove

    ws, x, scanned, looped = _unstacked()

    def bug(ws: Any, x: Any) -> Any:
        out = looped(ws, x)
        out["blocks"][1]["y"] = out["blocks"][1]["y"] + 1e-3  # the edited line
        return out

    rules, base = parse_stack("blocks.{i}"), record(scanned, ws, x)
    assert prove(record(looped, ws, x), base, ["blocks.y"], stack=rules)["blocks.y"].proved
    assert not prove(record(looped, ws, x), base, ["blocks.y"])["blocks.y"].proved
    failing = compare_trees(  # the golden check's side: the rows joined
        {"blocks.y": np.stack([np.asarray(v["y"]) for v in bug(ws, x)["blocks"]])},
        {"blocks.y": np.asarray(scanned(ws, x)["blocks"]["y"])},
        "op_by_op",
    )
    assert failing.first_failure is not None
    done = prove_and_locate(failing, record(bug, ws, x), base, stack=rules)
    assert not done.proofs["blocks.y"].proved
    assert done.origin is not None and done.origin.status == "named", done.origin
    edited = bug.__code__.co_firstlineno + 2
    assert done.origin.origin.function.endswith(".bug") and done.origin.origin.line == edited


def test_parity_diff_joins_per_layer_rows_into_a_stacked_golden(tmp_path: Path) -> None:
    from parity.commands._diff import run_diff
    from parity.store import write_goldens

    rows = np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4)
    golden = write_goldens(tmp_path / "g.h5", {"blocks.w": rows, "head": rows[0]})
    per_layer = {f"blocks.{i}.w": rows[i] for i in range(3)} | {"head": rows[0]}
    actual = write_goldens(tmp_path / "a.h5", per_layer)
    result = run_diff(actual, golden, stack=["blocks.{i}"])
    assert result.exit_code == 0
    assert sorted(f.key for f in result.comparison.findings) == ["blocks.w", "head"]
    moved = write_goldens(tmp_path / "m.h5", per_layer | {"blocks.1.w": rows[1] + 1e-3})
    failed = run_diff(moved, golden, stack=["blocks.{i}"])
    first = failed.comparison.first_failure
    assert failed.exit_code == 1 and first is not None and first.key == "blocks.w"
    assert first.worst_index is not None and first.worst_index[0] == 1  # the layer leads
    undeclared = run_diff(actual, golden)
    assert undeclared.exit_code == 1
    reasons = {f.key: f.reason for f in undeclared.comparison.findings}
    assert "its rows are the new keys 'blocks.0.w' ... 'blocks.2.w'" in reasons["blocks.w"]
    assert "stack = ['blocks.{i}']" in reasons["blocks.w"]


def test_assert_equivalent_names_a_layer_bug_when_the_old_function_stacked_the_layers() -> None:
    jnp = pytest.importorskip("jax").numpy
    ws, x, scanned, looped = _unstacked()

    def bug(ws: Any, x: Any) -> Any:
        return {"blocks": [{"y": jnp.tanh(x @ ws[i]) * 1.001} for i in range(len(ws))]}

    said = {"stack": "blocks.{i}", "old_fn": scanned, "args": (ws, x), "class_map": "op_by_op"}
    parity.assert_equivalent(looped(ws, x), scanned(ws, x), new_fn=looped, **said)
    with pytest.raises(AssertionError) as failed:
        parity.assert_equivalent(bug(ws, x), scanned(ws, x), new_fn=bug, **said)
    edited = bug.__code__.co_firstlineno + 1
    assert f"test_stacking.py:{edited} in " in str(failed.value), str(failed.value)
