"""The dataflow order (issue 29): a function's outputs ranked as its program computed them,
whatever container they came in, and one order for every face of parity.

The end-to-end test is a fresh project whose taps come out of `jax.jit` as a dict (jax
sorts its keys): a LayerNorm epsilon changed in a middle layer is named first, at the right
tap, by `parity check`, the pytest plugin, `parity bisect` and `parity.assert_equivalent`,
and `parity show`, `parity diff`, the check and `assert_equivalent` list the keys in one
order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from parity.judge._dataflow import (
    ALPHABETICAL_HINT,
    DECLARED_HINT,
    HOST_HINT,
    Dataflow,
    DataflowError,
    alphabetical,
    order_hint,
)
from parity.origin._record import dataflow_order, in_dataflow_order

jax = pytest.importorskip("jax")
jnp = jax.numpy

#: The model of the tmp project: taps built in forward order, returned from `jax.jit` as a
#: dict (so sorted by jax), the LayerNorm's epsilon a module constant a commit can change.
MODEL = """\
import jax
import jax.numpy as jnp

EPS = {eps}


def init(key):
    k = jax.random.split(key, 4)
    return {{
        "embed": jax.random.normal(k[0], (16, 8)),
        "conv0": jax.random.normal(k[1], (3, 8, 8)) / 5,
        "conv1": jax.random.normal(k[2], (3, 8, 8)) / 5,
        "head": jax.random.normal(k[3], (8, 16)) / 3,
    }}


def _conv(x, w):
    return sum(jnp.roll(x, s - 1, axis=0) @ w[s] for s in range(w.shape[0]))


def _apply(params, tokens):
    taps = {{}}
    x = params["embed"][tokens]
    taps["embed"] = x
    x = _conv(x, params["conv0"])
    taps["conv0"] = x
    x = (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + EPS)
    taps["ln0"] = x
    x = _conv(x, params["conv1"])
    taps["conv1"] = x
    x = jax.nn.gelu(x)
    taps["gelu0"] = x
    return {{"taps": taps, "logits": x @ params["head"]}}


apply = jax.jit(_apply)
"""

PRODUCERS = """\
import jax

import convnet


def forward():
    return convnet.apply(convnet.init(jax.random.key(0)), jax.numpy.arange(12) % 16)


GROUPS = {"forward": forward}
"""

PLUGIN_TEST = """\
import jax

import convnet


def test_forward(parity_check):
    params = convnet.init(jax.random.key(0))
    parity_check(convnet.apply(params, jax.numpy.arange(12) % 16), "forward")
"""

#: The order the model computes its outputs in.
FORWARD = ["taps.embed", "taps.conv0", "taps.ln0", "taps.conv1", "taps.gelu0", "logits"]


MODEL_FILE = "src/convnet/__init__.py"
#: The model's file as every project commits it (a test writes the bug, eps 1e-3, later).
GOOD_MODEL = {MODEL_FILE: MODEL.format(eps="1e-5")}


def _write_model(repo: Path, eps: str) -> None:
    (repo / MODEL_FILE).parent.mkdir(parents=True, exist_ok=True)
    (repo / MODEL_FILE).write_text(MODEL.format(eps=eps))


def _model(repo: Path, name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, repo / MODEL_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- the order


def test_a_jitted_dict_comes_out_sorted_but_its_dataflow_order_is_the_program_s(
    tmp_path: Path,
) -> None:
    _write_model(tmp_path, "1e-5")
    model = _model(tmp_path, "convnet_unit")
    params, tokens = model.init(jax.random.key(0)), jnp.arange(12) % 16
    out = model.apply(params, tokens)
    from parity.judge._trees import flatten

    assert list(flatten(out)) == sorted(FORWARD)  # what jax does to the dict's order
    assert dataflow_order(model.apply, params, tokens) == FORWARD
    assert dataflow_order(model._apply, params, tokens) == FORWARD  # traced, not jitted
    wrapped = in_dataflow_order(model.apply)(params, tokens)
    assert isinstance(wrapped, Dataflow) and list(wrapped) == FORWARD
    import numpy as np

    assert all(np.array_equal(wrapped[k], v) for k, v in flatten(out).items())


def test_scan_outputs_are_placed_by_iteration_and_calls_and_conds_by_their_bodies() -> None:
    def f(x: Any, ws: Any) -> dict[str, Any]:
        def body(c: Any, w: Any) -> tuple[Any, Any]:
            c = jnp.tanh(c @ w)
            return c, c

        last, ys = jax.lax.scan(body, x, ws)
        branch = jax.lax.cond(last.sum() > 0, lambda c: c * 2, lambda c: c + 1, last)
        return {
            "b_layer2": ys[2],
            "a_layer0": ys[0],
            "c_layer1": ys[1],
            "a_after": jax.nn.relu(branch),  # relu is a custom_jvp call
            "z_input": x,
            "d_branch": branch,
        }

    x, ws = jnp.ones((2, 3)), jnp.ones((3, 3, 3)) / 3
    expected = ["z_input", "a_layer0", "c_layer1", "b_layer2", "d_branch", "a_after"]
    assert dataflow_order(f, x, ws) == expected
    assert dataflow_order(jax.jit(f), x, ws) == expected


def test_a_reverse_scan_computes_its_last_row_first_and_its_carry_last() -> None:
    def f(x: Any) -> dict[str, Any]:
        def body(c: Any, _: Any) -> tuple[Any, Any]:
            c = jnp.sin(c)
            return c, c

        last, ys = jax.lax.scan(body, x, None, length=3, reverse=True)
        return {"a_row0": ys[0], "b_row2": ys[2], "c_carry": last, "d_row1": ys[1]}

    assert dataflow_order(f, jnp.ones(2)) == ["b_row2", "d_row1", "a_row0", "c_carry"]


def test_rows_of_a_stack_are_placed_where_each_row_was_computed() -> None:
    """What a Python loop over layers gives (`jnp.stack(acts)`), indexed after the jit
    that made it: each row where its layer ran, the sum of the last one after them all."""

    def forward(x: Any) -> tuple[Any, Any]:
        acts = []
        for _ in range(3):
            x = jnp.tanh(x * 2.0)
            acts.append(x)
        return x.sum(), jnp.stack(acts)

    def group(x: Any) -> dict[str, Any]:
        total, acts = jax.jit(forward)(x)
        return {"acts": [acts[i] for i in range(3)], "a_total": total}

    expected = ["acts.0", "acts.1", "acts.2", "a_total"]
    assert dataflow_order(group, jnp.ones(4)) == expected

    def concatenated(x: Any) -> dict[str, Any]:
        rows = jnp.concatenate([jnp.tanh(x)[None], jnp.sin(x)[None]])
        return {"z_first": rows[0], "second": rows[1], "a_sum": rows.sum()}

    assert dataflow_order(concatenated, jnp.ones(3)) == ["z_first", "second", "a_sum"]


def test_a_function_that_does_not_trace_says_why() -> None:
    import numpy as np

    def to_numpy(x: Any) -> dict[str, Any]:
        return {"a": np.asarray(x) * 2}

    with pytest.raises(DataflowError, match="does not trace") as e:
        dataflow_order(to_numpy, jnp.ones(3))
    assert "\n" not in e.value.reason


def test_the_hint_is_given_only_for_an_alphabetical_order_not_read_from_the_program() -> None:
    assert alphabetical(["a", "b", "c"]) and not alphabetical(["b", "a", "c"])
    assert not alphabetical(["a", "b"])  # two keys are too few to tell
    assert order_hint("declared", ["a", "b", "c"]) == ALPHABETICAL_HINT
    assert order_hint("host", ["b", "a"]) == HOST_HINT and "declared" not in HOST_HINT
    assert order_hint(None, ["a", "b", "c"]) == ALPHABETICAL_HINT
    assert order_hint("dataflow", ["a", "b", "c"]) is None
    # Not read from the program, and not alphabetical: said too, every time.
    assert order_hint("declared", ["b", "a", "c"]) == DECLARED_HINT
    assert order_hint(None, ["b", "a", "c"]) == DECLARED_HINT


# --------------------------------------------------------------------------- end to end


def _parity(run_parity: Any, repo: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return run_parity(repo, *(str(a) for a in args))


@pytest.mark.slow
def test_a_bug_in_a_middle_layer_is_named_first_by_check_bisect_and_assert_equivalent(
    tmp_path: Path, git: Any, run_parity: Any, git_project: Any
) -> None:
    repo = git_project(tmp_path, PRODUCERS, files=GOOD_MODEL, message="a conv model")
    good = git(repo, "rev-parse", "HEAD")

    shown = _parity(run_parity, repo, "show", "goldens/forward.h5", "--json", "-")
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["order"]["source"] == "dataflow" and doc["order"]["hint"] is None
    assert [a["key"] for a in sorted(doc["arrays"], key=lambda a: a["order"])] == FORWARD

    # Three commits: a harmless one, the bug (the LayerNorm's epsilon), a harmless one.
    (repo / "NOTES").write_text("notes\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "notes")
    _write_model(repo, "1e-3")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "the epsilon")
    culprit = git(repo, "rev-parse", "HEAD")
    (repo / "NOTES").write_text("more notes\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "more notes")

    report = tmp_path / "check.json"
    bad = _parity(run_parity, repo, "check", "--json", report, "--save-actual", "saved")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "first breaking its class: taps.ln0" in bad.stdout
    # The edit (issue 74): the epsilon is set at the top of the model and used in its norm;
    # the origin names the use, and the edit of the diff from the pin that set it.
    eps_line = next(n for n, t in enumerate(MODEL.splitlines(), 1) if t == "EPS = {eps}")
    edit = f"the edit: {MODEL_FILE}:{eps_line} `EPS = 1e-3`: it writes the constant 0.001, "
    assert edit + "where the base's lines wrote 1e-05" in bad.stdout, bad.stdout
    check_doc = json.loads(report.read_text())
    assert check_doc["checks"][0]["first_failure"]["key"] == "taps.ln0"
    assert [f["key"] for f in check_doc["findings"]] == [f"forward/{k}" for k in FORWARD]

    diff_json = tmp_path / "diff.json"
    diffed = _parity(
        run_parity, repo, "diff", "saved/forward.h5", "goldens/forward.h5", "--json", diff_json
    )
    assert diffed.returncode == 1, diffed.stdout + diffed.stderr
    diff_doc = json.loads(diff_json.read_text())
    assert diff_doc["first_failure"]["key"] == "taps.ln0"
    assert [f["key"] for f in diff_doc["findings"]] == FORWARD

    # The plugin: a test checking the jitted dict (sorted by jax) against the goldens.
    (repo / "tests").mkdir()
    (repo / "tests" / "test_forward.py").write_text(PLUGIN_TEST)
    plugin = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         "tests/test_forward.py"],
        cwd=repo, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert plugin.returncode == 1, plugin.stdout + plugin.stderr
    assert "first breaking its class: taps.ln0" in plugin.stdout, plugin.stdout
    assert edit in plugin.stdout, plugin.stdout

    bisect_json = tmp_path / "bisect.json"
    found = _parity(run_parity, repo, "bisect", good, "HEAD", "--json", bisect_json)
    assert found.returncode == 0, found.stdout + found.stderr
    answer = json.loads(bisect_json.read_text())
    assert answer["first_bad_commit"] == culprit and answer["key"] == "taps.ln0"
    assert edit in found.stdout, found.stdout  # the culprit's diff from its parent

    # Live, as a test of the old model against the new one would compare them.
    import parity

    old, new = _model(repo, "convnet_old"), _model(repo, "convnet_new")
    old.EPS = 1e-5  # the module's global, read when traced
    params, tokens = old.init(jax.random.key(0)), jnp.arange(12) % 16
    expected = parity.in_dataflow_order(old._apply)(params, tokens)
    same = parity.assert_equivalent(expected, expected)
    assert [f.key for f in same.findings] == FORWARD
    with pytest.raises(AssertionError, match=r"first breaking its class: taps\.ln0"):
        parity.assert_equivalent(parity.in_dataflow_order(new._apply)(params, tokens), expected)
    # The same comparison by the order `order=` gives, without the wrapper.
    with pytest.raises(AssertionError, match=r"first breaking its class: taps\.ln0"):
        parity.assert_equivalent(
            new.apply(params, tokens),
            old.apply(params, tokens),
            order=parity.dataflow_order(old.apply, params, tokens),
        )


def test_a_declared_alphabetical_order_is_said_by_show_and_check(
    tmp_path: Path, run_parity: Any, git_project: Any
) -> None:
    producers = (
        "import numpy as np\n\n"
        "GROUPS = {'g': lambda: {k: np.full(2, i, np.float32) for i, k in "
        "enumerate(['a', 'b', 'c'])}}\n"
    )
    repo = git_project(tmp_path, producers)
    shown = run_parity(repo, "show", "goldens/g.h5")
    assert shown.returncode == 0, shown.stderr
    assert "forward order: host" in shown.stdout  # numpy made them: no program to read
    assert f"hint: {ALPHABETICAL_HINT}" in shown.stdout
    checked = run_parity(repo, "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert ALPHABETICAL_HINT in checked.stdout


def test_the_producer_runner_keeps_the_random_state_when_it_traces(tmp_path: Path) -> None:
    """Tracing a group again to read its order must not move numpy's global generator: a
    later group drawing from it would get other inputs than before."""
    import numpy as np

    from parity.machinery._runner_output import load_runner_output

    producers = tmp_path / "producers.py"
    producers.write_text(
        "import jax.numpy as jnp\nimport numpy as np\n\nnp.random.seed(0)\n\n"
        "def first():\n    x = jnp.full(3, np.random.random())\n"
        "    return {'b': x * 2, 'a': x + 1}\n\n"
        "def second():\n    return {'r': np.asarray(np.random.random(), np.float64)}\n\n"
        "GROUPS = {'first': first, 'second': second}\n"
    )
    runner = Path(parity_file()).parent / "machinery" / "_producer_runner.py"
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, str(runner), "--src", str(tmp_path), "--producers", str(producers),
         "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    first = load_runner_output(out, "first", command="check")
    second = load_runner_output(out, "second", command="check")
    assert first.order == "dataflow" and list(first.arrays) == ["b", "a"]
    assert second.order == "host"  # numpy drew it: no jax program computed it
    draws = np.random.RandomState(0)
    draws.random_sample()  # the first group's
    assert second.arrays["r"] == draws.random_sample()


def parity_file() -> str:
    import parity

    return str(parity.__file__)


#: Producers that convert what a jitted `apply` returned to numpy at the end, three ways.
NUMPY_PRODUCERS = """\
import jax
import numpy as np

import convnet


def _out():
    return convnet.apply(convnet.init(jax.random.key(0)), jax.numpy.arange(12) % 16)


def tree_map():
    return jax.tree.map(np.asarray, _out())


def device_get():
    return jax.device_get(_out())


def comprehension():
    out = _out()
    return {"taps": {k: np.asarray(v) for k, v in out["taps"].items()},
            "logits": np.array(out["logits"])}


GROUPS = {"tree_map": tree_map, "device_get": device_get, "comprehension": comprehension}
"""

#: A test of the plugin's: the numpy outputs against the goldens.
NUMPY_PLUGIN_TEST = """\
import producers


def test_tree_map(parity_check):
    parity_check(producers.tree_map(), "tree_map")
"""


@pytest.mark.slow
def test_a_producer_that_ends_in_numpy_keeps_the_dataflow_order(
    tmp_path: Path, run_parity: Any, git_project: Any
) -> None:
    """`jax.tree.map(np.asarray, out)`, `jax.device_get(out)` and a comprehension of
    `np.asarray` on the dict a jitted function returned: the order is the program's, so a
    bug in a middle layer (the LayerNorm's epsilon) is named first by check and the plugin,
    and a repin that changes nothing says nothing about the order."""
    table = 'producers = "producers.py"\nsrc = "src"\n'
    repo = git_project(tmp_path, NUMPY_PRODUCERS, table, files=GOOD_MODEL)
    groups = ("tree_map", "device_get", "comprehension")
    for group in groups:
        shown = run_parity(repo, "show", f"goldens/{group}.h5", "--json", "-")
        doc = json.loads(shown.stdout)
        assert doc["order"]["source"] == "dataflow", (group, doc["order"])
        assert [a["key"] for a in sorted(doc["arrays"], key=lambda a: a["order"])] == FORWARD
    again = run_parity(repo, "repin", "--base", "HEAD")
    assert again.returncode == 0 and "order:" not in again.stdout, again.stdout
    _write_model(repo, "1e-3")  # the bug, in the tree under test
    report = tmp_path / "check.json"
    bad = run_parity(repo, "check", "--json", str(report))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    checks = json.loads(report.read_text())["checks"]
    assert {c["name"]: c["first_failure"]["key"] for c in checks} == dict.fromkeys(
        groups, "taps.ln0"
    )
    assert "order (" not in bad.stdout  # a dataflow order needs no word in the header
    (repo / "test_tree_map.py").write_text(NUMPY_PLUGIN_TEST)
    # The plugin's default compile cache, the machine's: it loads the programs (the
    # producer's and each recorded operation's) that the check above compiled.
    plugin = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         "test_tree_map.py"],
        cwd=repo, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(repo / "src"), str(repo), *filter(None, [os.environ.get("PYTHONPATH")])])},
    )  # fmt: skip
    assert plugin.returncode == 1, plugin.stdout + plugin.stderr
    assert "first breaking its class: taps.ln0" in plugin.stdout, plugin.stdout


#: A producer that does not trace: it branches in Python on a value it computed.
UNTRACEABLE = """\
import jax

import convnet


def forward():
    params = convnet.init(jax.random.key(0))
    if float(params["head"].sum()) > 1e9:
        raise ValueError("a head this large is not a test model")
    return convnet.apply(params, jax.numpy.arange(12) % 16)


GROUPS = {"forward": forward}
"""

#: numpy computes every output on the host: no program the producer runs computes them.
ON_THE_HOST = UNTRACEABLE.replace(
    "    return convnet.apply(params, jax.numpy.arange(12) % 16)\n",
    "    import numpy as np\n\n"
    "    out = jax.tree.map(np.asarray, convnet.apply(params, jax.numpy.arange(12) % 16))\n"
    "    return jax.tree.map(lambda v: np.tanh(v) * 1.0, out)\n",
)


@pytest.mark.slow
def test_a_producer_that_does_not_trace_is_ordered_by_the_programs_it_ran(
    tmp_path: Path, run_parity: Any, git_project: Any
) -> None:
    table = 'producers = "producers.py"\nsrc = "src"\n'
    repo = git_project(tmp_path, UNTRACEABLE, table, files=GOOD_MODEL)
    shown = run_parity(repo, "show", "goldens/forward.h5")
    assert "forward order: dataflow" in shown.stdout, shown.stdout
    checked = run_parity(repo, "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "declared" not in checked.stdout and ALPHABETICAL_HINT not in checked.stdout


@pytest.mark.slow
def test_values_made_on_the_host_are_said_every_check_and_a_repin_names_the_change(
    tmp_path: Path, run_parity: Any, git_project: Any
) -> None:
    table = 'producers = "producers.py"\nsrc = "src"\n'
    repo = git_project(tmp_path, ON_THE_HOST, table, files=GOOD_MODEL)
    shown = run_parity(repo, "show", "goldens/forward.h5")
    assert "forward order: host" in shown.stdout, shown.stdout
    for _ in range(2):  # every check, not only the pin
        checked = run_parity(repo, "check")
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert ALPHABETICAL_HINT in " ".join(checked.stdout.split()), checked.stdout
        assert "declared" not in checked.stdout, checked.stdout
    (repo / "producers.py").write_text(PRODUCERS)  # the fix: its programs compute them now
    fixed = run_parity(repo, "repin", "--base", "HEAD")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "order: host -> dataflow" in fixed.stdout, fixed.stdout
    assert "unchanged" not in fixed.stdout
