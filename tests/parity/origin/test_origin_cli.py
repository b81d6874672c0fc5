"""Where a golden check diverged (issue 35, item 4): a failing `parity check` names the
first operation of the current tree that computes what the golden's base never did, at
its source line, in its text, JSON and HTML; `parity bisect` names it between the first
bad commit and its parent; a group that cannot be recorded says why in one line and keeps
its verdict.

One tmp project serves the module: a 2-layer model whose producers return only its
`logits` (or, in `placed`, each block's output from a jitted block called in a Python loop
on weights placed from host data: a producer that does not trace as a whole), pinned at one
commit, then a bug in `mix` (the function between the blocks' norm and their residual sum)
at a second.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("jax")

MODEL = """\
import jax
import jax.numpy as jnp


def init(key):
    k = jax.random.split(key, 3)
    return {
        "embed": jax.random.normal(k[0], (16, 8)),
        "w": jax.random.normal(k[1], (2, 8, 8)) / 3,
        "head": jax.random.normal(k[2], (8, 16)) / 3,
    }


def norm(x):
    return x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)


def mix(x, w):
    return jax.nn.gelu(x @ w)


def block(x, w):
    return x + mix(norm(x), w)


def logits(params, tokens):
    x = params["embed"][tokens]
    for i in range(2):
        x = block(x, params["w"][i])
    return norm(x) @ params["head"]
"""

#: The bug: a scale inside `mix`, on a line of its own.
BUGGY = MODEL.replace(
    "    return jax.nn.gelu(x @ w)\n", "    h = x @ w * 1.5\n    return jax.nn.gelu(h)\n"
)

PRODUCERS = """\
import jax
import numpy as np

import tinynet


def _logits():
    return tinynet.logits(tinynet.init(jax.random.key(0)), jax.numpy.arange(6) % 16)


def forward():
    return {"logits": _logits()}


def host():
    # numpy computes the output on the host: the program does not trace to it
    return {"probs": np.tanh(np.asarray(_logits()))}


def kl():
    return {"kl_logits": _logits()}


_block = jax.jit(tinynet.block)


def placed():
    # Does not trace as a whole: weights placed from host data, a jitted block per layer in
    # a Python loop, each output brought to numpy. Its programs are recorded instead.
    params = jax.tree.map(np.asarray, tinynet.init(jax.random.key(0)))
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    w = jax.make_array_from_callback(params["w"].shape, sharding, lambda i: params["w"][i])
    x = jax.numpy.asarray(params["embed"][np.arange(6) % 16])
    out = {}
    for i in range(2):
        x = _block(x, w[i])
        out[f"resid.{i + 1}"] = np.asarray(x)
    return out


GROUPS = {"forward": forward, "host": host, "kl": kl, "placed": placed}
CLASS_MAP = [("kl_logits", "bf16_logits")]
"""

MODEL_FILE = "src/tinynet/__init__.py"


@pytest.fixture(scope="module")
def project(
    tmp_path_factory: pytest.TempPathFactory, git_project: Any, git: Any
) -> tuple[Path, str, str]:
    """The project with the bug committed: `(repo, good sha, bad sha)`."""
    repo = git_project(tmp_path_factory.mktemp("origin"), PRODUCERS, files={MODEL_FILE: MODEL})
    good = git(repo, "rev-parse", "HEAD")
    (repo / MODEL_FILE).write_text(BUGGY)
    git(repo, "commit", "-qam", "scale inside mix")
    return repo, good, git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def checked(
    project: tuple[Path, str, str], run_parity: Callable[..., Any]
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], Path]:
    repo = project[0]
    report = repo.parent / "check.json"
    folder = repo.parent / "report"
    done = run_parity(repo, "check", "--json", str(report), "--report", str(folder))
    return done, json.loads(report.read_text()), folder


def _bug_line() -> int:
    """The 1-based line of the bug in BUGGY, found by text, not by parity."""
    return next(n for n, text in enumerate(BUGGY.splitlines(), 1) if "* 1.5" in text)


def _origin_line(stdout: str, check: str) -> str:
    lines = stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith(f"FAIL {check} "))
    return next(ln.strip() for ln in lines[start + 1 :] if ln.strip().startswith("origin:"))


def test_a_failing_check_names_the_line_and_function_of_the_bug(checked: Any) -> None:
    done, doc, _ = checked
    assert done.returncode == 1, done.stdout + done.stderr
    line = _origin_line(done.stdout, "forward")
    assert f"{MODEL_FILE}:{_bug_line()} in mix" in line, line
    entry = next(c for c in doc["checks"] if c["name"] == "forward")
    origin = entry["origin"]
    assert {k: origin[k] for k in ("file", "line", "function", "key")} == {
        "file": MODEL_FILE, "line": _bug_line(), "function": "mix", "key": "logits",
    }  # fmt: skip
    # The scale itself: the constant made for it on that line, or the product
    assert origin["primitive"] in ("mul", "convert_element_type")
    assert 0.0 < origin["matched_fraction"] < 1.0
    assert entry["origin_line"] == line


def test_a_producer_that_does_not_trace_is_recorded_program_by_program(checked: Any) -> None:
    done, doc, _ = checked
    line = _origin_line(done.stdout, "placed")
    assert f"{MODEL_FILE}:{_bug_line()} in mix" in line, line
    entry = next(c for c in doc["checks"] if c["name"] == "placed")
    assert entry["origin"]["key"] == "resid.1"  # the first block's output: where it starts
    orders = [v for k, v in doc["header"].items() if k.startswith("order (placed")]
    assert not orders, orders  # read from its programs: no "declared" hint


def test_the_pytest_plugin_names_the_origin_in_the_failure_and_the_report(
    project: tuple[Path, str, str], run_pytest: Callable[..., Any]
) -> None:
    """A test that checks a group against its goldens gets the origin line, as `parity
    check` names it; the second check of the group in the session reuses it."""
    repo = project[0]
    (repo / "test_forward.py").write_text(
        "import producers\n\n\n"
        "def test_forward(parity_check):\n"
        "    parity_check(producers.forward(), 'forward')\n\n\n"
        "def test_again(parity_check):\n"
        "    parity_check(producers.forward(), 'forward', name='again')\n"
    )
    report = repo.parent / "plugin-report"
    done = run_pytest(repo, "test_forward.py", "--parity-report", str(report))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [ln.strip() for ln in done.stdout.splitlines() if ln.strip().startswith("origin:")]
    assert len(lines) >= 2 and len(set(lines)) == 1, lines
    assert f"{MODEL_FILE}:{_bug_line()} in mix" in lines[0], lines
    checks = {c["name"]: c for c in json.loads((report / "report.json").read_text())["checks"]}
    assert checks["forward"]["origin"]["function"] == "mix"
    assert checks["again"]["origin_line"] == checks["forward"]["origin_line"]


def test_a_group_that_cannot_be_recorded_says_why_and_keeps_its_verdict(
    checked: Any, project: tuple[Path, str, str], run_parity: Callable[..., Any]
) -> None:
    done, doc, _ = checked
    host = _origin_line(done.stdout, "host")
    assert host.startswith("origin: not named: the producer's outputs are not computed"), host
    # A class judged in another unit than |a-b| gives no tolerance: the origin is then
    # looked for at equality only, and still named.
    kl = _origin_line(done.stdout, "kl")
    assert f"{MODEL_FILE}:{_bug_line()} in mix" in kl and "at equality only" in kl, kl
    assert "no matching tolerance" in kl, kl
    entries = {c["name"]: c for c in doc["checks"]}
    assert entries["host"]["origin"] is None and entries["kl"]["origin"]["function"] == "mix"
    # The same group checked without looking for an origin: the same verdict and exit.
    plain = run_parity(project[0], "check", "--groups", "host", "--origin", "off")
    assert plain.returncode == done.returncode, plain.stdout + plain.stderr
    verdict = [ln for ln in plain.stdout.splitlines() if ln.strip().startswith("FAIL host ")]
    assert verdict and verdict[0] in done.stdout.splitlines()
    assert "origin:" not in plain.stdout


def test_the_html_report_plots_the_matched_share_of_a_check_with_an_origin(checked: Any) -> None:
    _, _, folder = checked
    page = (folder / "index.html").read_text()
    assert "where it diverged" in page
    pytest.importorskip("matplotlib")  # the `plots` extra: the lines above need none
    plots = sorted(p.name for p in folder.glob("origin_*.png"))
    # host has no origin to plot
    assert plots == ["origin_00_forward.png", "origin_02_kl.png", "origin_03_placed.png"], plots
    assert f'src="{plots[0]}"' in page


def test_bisect_names_the_origin_between_the_first_bad_commit_and_its_parent(
    project: tuple[Path, str, str], run_parity: Callable[..., Any]
) -> None:
    repo, good, bad = project
    report = repo.parent / "bisect.json"
    done = run_parity(repo, "bisect", good, "HEAD", "--groups", "forward", "--json", str(report))
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(report.read_text())
    assert doc["first_bad_commit"] == bad
    assert doc["origin"]["function"] == "mix" and doc["origin"]["file"] == MODEL_FILE
    assert doc["origin"]["line"] == _bug_line()
    assert f" at {MODEL_FILE}:{_bug_line()} in mix" in done.stdout


def test_a_shallow_clone_says_its_base_is_missing_before_any_recording_run(
    project: tuple[Path, str, str], run_parity: Callable[..., Any], git: Any, tmp_path: Path
) -> None:
    """Issue 48: in a clone without the goldens' base commit the origin is not named, in
    one line saying the base is missing and how to fetch it, and no recording run was
    spent first (neither here nor at the base)."""
    import shutil

    repo, good, _ = project
    clone = tmp_path / "ci" / "proj"
    clone.parent.mkdir()
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(clone))
    shutil.copytree(repo / "goldens", clone / "goldens")  # pinned, not committed
    assert git(clone, "rev-parse", "--is-shallow-repository") == "true"
    done = run_parity(clone, "check", "--groups", "forward")
    assert done.returncode == 1, done.stdout + done.stderr  # the verdict stands
    line = _origin_line(done.stdout, "forward")
    assert line.startswith("origin: not named: the base cannot be re-produced here"), line
    assert good[:12] in line and "which is shallow" in line, line
    assert "git fetch --unshallow" in line, line
    assert "op by op" not in done.stderr and "recording" not in done.stderr, done.stderr


def test_a_program_past_the_byte_limit_is_said_too_large_not_recorded() -> None:
    import jax.numpy as jnp

    from parity.origin import LocaliseError, record

    x = jnp.ones((64, 64), jnp.float32)  # 16 KiB per value

    def fn(x):
        return jnp.tanh(x) * 2 + 1

    assert record(fn, x, max_bytes=1 << 20).outputs  # well under the limit: recorded
    with pytest.raises(LocaliseError, match="too large to record"):
        record(fn, x, max_bytes=40_000)
