"""The baseline: off the pin's environment, a golden group re-produced at its base commit
here is the tree's reference, exactly (`parity.check._against_baseline`, `parity.run._baseline`).

The project's code under test (`src/model.py`) and producers are numpy only; the producers
move every key by a known amount on more than one device (read from the XLA flags the
runner sets), as XLA's layouts move bits, so every figure is computed by another path than
the harness's. A change of the tree is an uncommitted edit of `src/model.py`: the base
commit does not have it."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _device_noise import DEVICE_NOISE, moved

from parity.store import open_goldens, write_goldens

PRODUCERS = f"""\
import os
import re

import numpy as np

import model

FLAGS = os.environ.get("XLA_FLAGS", "")
DEVICES = re.search(r"device_count=(\\d+)", FLAGS)
NOISE = {DEVICE_NOISE!r} if DEVICES and DEVICES.group(1) != "1" else 0.0
BASE = np.linspace(1.0, 2.0, 8)


def group():
    if os.environ.get("COUNT_FILE"):
        with open(os.environ["COUNT_FILE"], "a") as f:
            f.write("run\\n")
    return {{
        "taps.x": (2 * BASE + NOISE).astype(np.float32),
        "logits": (BASE + NOISE + model.BUG).astype(np.float32),
    }}


GROUPS = {{"g": group}}
CLASS_MAP = [("logits", "bitwise"), ("taps.*", "fp32_reassoc")]
"""

TABLE = 'producers = "producers.py"\nsrc = "src"\n'


@pytest.fixture
def project(tmp_path: Path, git_project) -> Path:
    return git_project(tmp_path, PRODUCERS, TABLE, files={"src/model.py": "BUG = 0.0\n"})


def _calibrate(repo: Path, run_parity, perturb: str = "devices=4,repeat") -> None:
    proc = run_parity(repo, "calibrate", "--perturb", perturb, "--write")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _reference(stdout: str) -> str:
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip().startswith("reference")]
    assert len(lines) == 1, stdout
    return lines[0]


def _passing_exactly(
    repo: Path, run_parity, *args: str
) -> tuple[subprocess.CompletedProcess[str], str, str]:
    """`parity check ARGS`, which must pass with no key inexact: the process, the base
    commit's short sha and the header's `reference` line on one line."""
    proc = run_parity(repo, "check", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdict = proc.stdout.splitlines()[0]
    assert verdict.startswith("parity: PASS") and "not exact" not in verdict, verdict
    return proc, _head(repo)[:12], " ".join(_reference(proc.stdout).split())


def _bug(repo: Path, value: float) -> None:
    (repo / "src" / "model.py").write_text(f"BUG = {value!r}\n")


def _head(repo: Path) -> str:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip


def test_a_change_below_the_calibrated_bound_fails_bitwise_against_the_baseline_on_4_devices(
    project, run_parity
):
    _calibrate(project, run_parity)
    spread = moved(DEVICE_NOISE)
    _bug(project, spread / 4)  # a real change, 16x below the calibrated bound k * spread
    calibrated = run_parity(project, "check", "--devices", "4", "--baseline", "off")
    assert calibrated.returncode == 0, calibrated.stdout + calibrated.stderr
    assert "passed by calibration alone" in calibrated.stdout
    exact = run_parity(project, "check", "--devices", "4")
    assert exact.returncode == 1, exact.stdout + exact.stderr
    sha = _head(project)
    reference = _reference(exact.stdout)
    assert f"the baseline re-produced here at {sha[:12]} (built now" in reference
    assert "itself within the goldens' calibrated noise: 2 of 2 keys differ" in reference
    failing = [ln for ln in exact.stdout.splitlines() if ln.startswith("bitwise")]
    assert failing and failing[0].split()[4] == "1", exact.stdout  # logits fail, bitwise
    assert "FAIL g" in exact.stdout and "logits" in exact.stdout


def test_an_unchanged_tree_passes_against_the_baseline_which_the_next_check_reads_from_the_cache(
    project, run_parity, tmp_path
):
    _calibrate(project, run_parity)
    first = run_parity(project, "check", "--devices", "4")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "(built now in" in _reference(first.stdout)
    assert "re-producing g at the base" in first.stderr  # progress on stderr
    second = run_parity(project, "check", "--devices", "4")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "(cached at" in _reference(second.stdout)
    assert "re-producing" not in second.stderr
    listed = run_parity(project, "baseline", "list")
    assert listed.returncode == 0, listed.stderr
    assert "1 cached baseline " in listed.stdout and "layout 1x4" in listed.stdout
    # In the pin's own environment the goldens are the reference and nothing is built.
    pinned = run_parity(project, "check")
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr
    here = _reference(pinned.stdout)
    assert "the goldens (this is the environment they were pinned in)" in here
    cleared = run_parity(project, "baseline", "clear")
    assert "removed 1 cached baseline " in cleared.stdout
    assert not list((tmp_path / "baselines").glob("*/*/*.h5"))


def test_a_baseline_outside_the_recorded_noise_judges_and_says_how_far_the_goldens_lie(
    project, run_parity
):
    _calibrate(project, run_parity, "repeat")  # no device column: 4 devices not calibrated
    proc, sha, reference = _passing_exactly(project, run_parity, "--devices", "4")
    assert f"the baseline re-produced here at {sha} (built now" in reference
    assert (
        "in this environment (devices 1 -> 4), beyond the goldens' recorded noise; it judges "
        "every key under its class" in reference
    ), reference
    # How far the goldens lie from it: information, in three significant digits.
    spread = moved(DEVICE_NOISE)
    assert (
        f"1 key beyond their pinned class, the farthest logits (bitwise: max abs {spread:.3g})"
        in reference
    ), reference
    assert not re.search(r"\d\.\d{6,}(e[-+]?\d+)?", reference), reference
    # A layout is what calibration perturbs: record its noise, or adopt it with a repin.
    assert "record this environment's noise on main with `parity calibrate --groups g" in (
        reference
    )
    assert f"or adopt it with `parity repin --base {sha} --groups g --devices 4`" in reference
    assert "outside the recorded noise" not in proc.stdout + proc.stderr


def test_a_change_fails_against_the_baseline_where_the_recorded_noise_does_not_cover_it(
    project, run_parity
):
    _calibrate(project, run_parity, "repeat")  # no device column: 4 devices not calibrated
    _bug(project, moved(DEVICE_NOISE) / 4)  # a real change, below the goldens' distance
    proc = run_parity(project, "check", "--devices", "4")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "beyond the goldens' recorded noise" in _reference(proc.stdout)
    failing = [ln for ln in proc.stdout.splitlines() if ln.startswith("bitwise")]
    assert failing and failing[0].split()[4] == "1", proc.stdout  # logits fail, bitwise
    assert "FAIL g" in proc.stdout and "vs baseline" in proc.stdout


def _rewrite(repo: Path, *, shift: float = 0.0, **provenance: object) -> None:
    """The goldens of `g` rewritten as if pinned elsewhere: `provenance` over theirs, and
    every array moved by `shift`, as another environment's bits would be."""
    path = repo / "goldens" / "g.h5"
    with open_goldens(path) as gf:
        arrays = {k: np.asarray(gf[k]) + np.asarray(shift, gf[k].dtype) for k in gf}
        classes = {k: gf.info(k).class_name for k in gf}
        prov, cmap, order = gf.provenance, gf.class_map_json, gf.ordered_keys()
    write_goldens(path, arrays, classes=classes, class_map_json=cmap,
                  provenance=dataclasses.replace(prov, **provenance), order=order)  # fmt: skip


def _rewrite_base(repo: Path, sha: str) -> None:
    _rewrite(repo, base_sha=sha)


#: How far goldens pinned under another jax or on another processor lie from this one's
#: bits here: beyond every class and every calibrated bound this module records.
ELSEWHERE = 1e-3
#: A calibration recorded on the pin's processor: an ISA column (what bounds another
#: processor under the same cap) and a repeat, neither of which moved a key there.
NO_NOISE = {"spread": {"labels": ["isa=AVX", "repeat"],
                       "keys": {"logits": [0.0, 0.0], "taps.x": [0.0, 0.0]}}}  # fmt: skip


@pytest.mark.parametrize(
    ("pinned", "moved_here", "bound"),
    [
        ({"jax": "0.4.30"}, "jax: '0.4.30' -> ", "pinned class"),
        (
            {"cpu": "FakeVendor family 0 model 0; avx avx2", "processor": "Fake CPU"},
            "processor (same isa cap)",
            "calibrated bound",
        ),
    ],
    ids=["jax", "processor"],
)
def test_another_jax_or_processor_is_judged_by_the_baseline_and_adopted_by_a_repin(
    project, run_parity, pinned, moved_here, bound
):
    _rewrite(project, shift=ELSEWHERE, calibration=NO_NOISE, **pinned)
    proc, sha, reference = _passing_exactly(project, run_parity)
    assert f"the baseline re-produced here at {sha}" in reference
    assert f"in this environment ({moved_here}" in reference, reference
    assert f"2 keys beyond their {bound}, the farthest logits (bitwise: max abs" in reference
    # No calibration perturbs a jax release nor a processor: the remedy is the repin.
    repin = f"adopt this environment with `parity repin --base {sha} --groups g` (no "
    assert repin in reference, reference
    assert "parity calibrate" not in proc.stdout + proc.stderr
    # A real change still fails, bit for bit against the baseline.
    _bug(project, moved(DEVICE_NOISE) / 4)
    bug = run_parity(project, "check")
    assert bug.returncode == 1, bug.stdout + bug.stderr
    assert "FAIL g" in bug.stdout and "vs baseline" in bug.stdout


def test_a_missing_base_commit_falls_back_to_calibration_and_says_why(project, run_parity):
    _calibrate(project, run_parity)
    _rewrite_base(project, "0123456789abcdef" * 2 + "01234567")
    proc = run_parity(project, "check", "--devices", "4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reference = _reference(proc.stdout)
    assert "the goldens, by calibration: the baseline cannot be re-produced here" in reference
    # A full clone: the commit is missing from its history, and no shallow clone is blamed.
    assert "is not in the history of the repository" in reference
    assert "git fetch origin" in reference
    assert "shallow" not in proc.stdout and "unshallow" not in proc.stdout
    verdict = proc.stdout.splitlines()[0]
    assert verdict.startswith("parity: PASS") and "not exact" in verdict, verdict
    assert "is not in the history of the repository" in verdict


def test_without_git_history_the_verdict_line_says_not_exact_and_require_exits_2(
    project, run_parity, git_project, tmp_path
):
    _calibrate(project, run_parity)
    shutil.rmtree(project / ".git")
    _bug(project, moved(DEVICE_NOISE) / 4)  # a real bug, below the calibrated bound
    proc = run_parity(project, "check", "--devices", "4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdict = proc.stdout.splitlines()[0]
    assert verdict.startswith("parity: PASS") and "not exact" in verdict, verdict
    assert "(logits" in verdict and "passed by calibration alone, not bit for bit" in verdict
    assert "is not in a git repository" in verdict and "shallow" not in proc.stdout
    assert "PASS g (0 of 2 arrays fail), not exact" in proc.stdout
    # The build that could not happen left nothing in the cache.
    cache = tmp_path / "baselines"
    assert not cache.exists() or not any(cache.rglob("*")), sorted(cache.rglob("*"))
    required = run_parity(project, "check", "--devices", "4", "--baseline", "require")
    assert required.returncode == 2, required.stdout + required.stderr
    err = required.stderr.strip().splitlines()[-1]
    assert "the baseline is required" in err and "is not in a git repository" in err
    table = (project / "pyproject.toml").read_text()
    (project / "pyproject.toml").write_text(table + 'baseline = "require"\n')
    configured = run_parity(project, "check", "--devices", "4")
    assert configured.returncode == 2, configured.stdout + configured.stderr
    (project / "pyproject.toml").write_text(table)
    (project / "test_g.py").write_text(INNER_TEST)
    plugin = _inner_pytest(project, tmp_path, "--parity-devices", "4", "--parity-baseline",
                           "require")  # fmt: skip
    assert plugin.returncode == 1, plugin.stdout + plugin.stderr
    assert "the baseline is required" in plugin.stdout
    assert not cache.exists() or not any(cache.rglob("*")), sorted(cache.rglob("*"))


def test_a_shallow_clone_without_the_base_commit_is_named_as_such(
    project, run_parity, git, tmp_path
):
    _calibrate(project, run_parity)
    git(project, "add", "-A")
    git(project, "commit", "-qm", "goldens")  # the goldens' base is the commit before
    clone = tmp_path / "ci" / "proj"
    clone.parent.mkdir()
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{project}", str(clone))
    _bug(clone, moved(DEVICE_NOISE) / 4)
    proc = run_parity(clone, "check", "--devices", "4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdict = proc.stdout.splitlines()[0]
    assert "not exact" in verdict and "which is shallow" in verdict, verdict
    assert "git fetch --unshallow" in verdict


def test_producers_that_cannot_run_at_the_base_fall_back_and_name_the_reason(project, run_parity):
    _calibrate(project, run_parity)
    (project / "src" / "model.py").write_text("BUG = 0.0\nSCALE = 1.0\n")
    text = PRODUCERS.replace(
        "(BASE + NOISE + model.BUG)", "(model.SCALE * (BASE + NOISE + model.BUG))"
    )
    (project / "producers.py").write_text(text)
    proc = run_parity(project, "check", "--devices", "4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reference = _reference(proc.stdout)
    assert "the producers cannot run at the base" in reference and "SCALE" in reference


def test_concurrent_checks_build_the_baseline_once(project, run_parity, tmp_path):
    _calibrate(project, run_parity)
    count = tmp_path / "runs.txt"
    env = {
        "PYTHONWARNINGS": "ignore",
        "COUNT_FILE": str(count),
        "PARITY_BASELINE_CACHE": str(tmp_path / "baselines"),
    }
    import os

    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "parity", "check", "--devices", "4"],
            cwd=project,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    built = sorted("(built now in" in _reference(out) for out, _ in outs)
    assert built == [False, True], outs  # one built it, the other found it cached
    # Two trees produced, one baseline: the second check waited on the lock and read it.
    assert count.read_text().count("run") == 3


INNER_TEST = """\
import producers


def test_g(parity_check):
    parity_check(producers.group(), "g")
"""


def _inner_pytest(repo: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PARITY_"))}
    env["PARITY_BASELINE_CACHE"] = str(tmp_path / "baselines")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--parity-jax-cache", "none",
         "-q", "test_g.py", *args],
        cwd=repo, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_pytest_plugin_compares_golden_checks_with_the_baseline_off_the_pins_layout(
    project, run_parity, tmp_path
):
    _calibrate(project, run_parity)
    (project / "test_g.py").write_text(INNER_TEST)
    clean = _inner_pytest(project, tmp_path, "--parity-devices", "4")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "the baseline re-produced here at" in clean.stdout
    _bug(project, moved(DEVICE_NOISE) / 4)
    bug = _inner_pytest(project, tmp_path, "--parity-devices", "4")
    assert bug.returncode == 1, bug.stdout + bug.stderr
    assert "(cached at" in bug.stdout and "logits" in bug.stdout
    off = _inner_pytest(project, tmp_path, "--parity-devices", "4", "--parity-baseline", "off")
    assert off.returncode == 0, off.stdout + off.stderr
    assert "the goldens, by calibration (the baseline is off)" in off.stdout
