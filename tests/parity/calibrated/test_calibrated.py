"""Measured noise as the bound: per-key spreads recorded by `parity calibrate --write`, the
`calibrated` class, and checks that know the pin's environment and their own.

The project's producers are numpy only and move some keys by a known amount per
environment (read from the XLA flags the runner sets), so every bound here is computed by
another path than the harness's."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _device_noise import DEVICE_NOISE, moved

from parity._environment import Dimension, environment_difference
from parity._results import CheckError
from parity.calibrated._bounds import bind_calibrated, environment_remedy
from parity.calibrated._spreads import Spreads
from parity.calibration._write import merge_spreads
from parity.commands._diff import run_diff
from parity.commands._show import inventory
from parity.judge._classes import CALIBRATED_FLOOR_ULPS, CALIBRATED_K, REGISTRY, ToleranceClass
from parity.judge._compare import compare_trees
from parity.judge._measured_rules import Calibrated
from parity.judge._rule_base import Scale
from parity.judge._tolerance import ClassMap
from parity.store import Provenance, open_goldens, write_goldens

PRODUCERS = f"""\
import os
import re

import numpy as np

FLAGS = os.environ.get("XLA_FLAGS", "")
DEVICES = re.search(r"device_count=(\\d+)", FLAGS)
NOISE = {DEVICE_NOISE!r} if DEVICES and DEVICES.group(1) != "1" else 0.0
BUG = 0.0
BASE = np.linspace(1.0, 2.0, 8)


def group():
    return {{
        "exact.v": (BASE + NOISE).astype(np.float32),   # bitwise where pinned, moved on 4
        "steady.w": BASE.astype(np.float32),            # never moves
        "calib.u": (BASE + NOISE + BUG).astype(np.float32),
    }}


GROUPS = {{"g": group}}
CLASS_MAP = [("exact.*", "bitwise"), ("steady.*", "bitwise"), ("calib.*", "calibrated")]
"""


@pytest.fixture
def project(tmp_path: Path, git_project) -> Path:
    return git_project(tmp_path, PRODUCERS, 'producers = "producers.py"\nsrc = "."\n')


def test_a_calibrated_key_without_a_record_is_exit_2_naming_the_command(project, run_parity):
    proc = run_parity(project, "check")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "'calib.u'" in proc.stderr and "records no calibration" in proc.stderr
    assert "parity calibrate --groups g --perturb isa,devices,processes,repeat --write" in (
        proc.stderr
    )


def test_calibration_is_recorded_per_key_and_perturbation_and_moves_no_array(project, run_parity):
    path = project / "goldens" / "g.h5"
    with open_goldens(path) as gf:
        before = {k: gf.info(k).sha256 for k in gf}
    proc = run_parity(project, "calibrate", "--perturb", "devices=4,repeat", "--write")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open_goldens(path) as gf:
        assert {k: gf.info(k).sha256 for k in gf} == before
        assert gf.verify() == 3
        spreads = Spreads.of(gf.provenance)
    assert spreads.labels == ("devices=4", "repeat")
    assert list(spreads.keys["exact.v"]) == [pytest.approx(moved(DEVICE_NOISE)), 0.0]
    assert list(spreads.keys["steady.w"]) == [0.0, 0.0]
    # A second calibration of another dimension adds its column and keeps the others.
    proc = run_parity(project, "calibrate", "--perturb", "devices=2", "--write")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open_goldens(path) as gf:
        assert Spreads.of(gf.provenance).labels == ("devices=4", "repeat", "devices=2")


def test_checks_pass_where_pinned_and_on_calibrated_layouts_and_catch_a_bug_beyond_k_spread(
    project, run_parity
):
    # Before calibration, 4 devices break the bitwise key that moves there.
    proc = run_parity(project, "check", "--devices", "4", "--groups", "g")
    assert proc.returncode == 2  # calib.u has no record yet
    assert (
        run_parity(project, "calibrate", "--perturb", "devices=4,repeat", "--write").returncode == 0
    )
    pinned = run_parity(project, "check")
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr
    # The pin's environment: pinned classes stand, no line on another environment.
    assert not [ln for ln in pinned.stdout.splitlines() if ln.strip().startswith("environment")]
    # The goldens are the reference, by calibration (the baseline is off:
    # tests/parity/check/test_against_baseline.py).
    four = run_parity(project, "check", "--devices", "4", "--baseline", "off")
    assert four.returncode == 0, four.stdout + four.stderr
    env = [ln for ln in four.stdout.splitlines() if ln.strip().startswith("environment")]
    assert env and "devices 1 -> 4" in env[0] and "1 key passed by calibration alone" in env[0]
    # A change of 10x the recorded spread on the calibrated key fails in the pin's
    # environment (its bound is k = 4 times its spread).
    spread = moved(DEVICE_NOISE)
    (project / "producers.py").write_text(PRODUCERS.replace("BUG = 0.0", f"BUG = {10 * spread!r}"))
    bug = run_parity(project, "check")
    assert bug.returncode == 1, bug.stdout + bug.stderr
    assert "calib.u" in bug.stdout


def test_an_override_to_calibrated_uses_the_recorded_spread_and_says_why_where_none_is(
    project, run_parity
):
    """`--override 'K=calibrated'` is a usable class: the check binds each key's recorded
    spread; where the golden records none, the error says exactly that, not that the class
    is unusable. An unknown class in an override is named as an override's."""
    rules = ("--override", "exact.v=calibrated", "--override", "calib.u=bitwise")
    none = run_parity(project, "check", *rules)
    assert none.returncode == 2, none.stdout + none.stderr
    assert "key 'exact.v' of group 'g' is under the class 'calibrated'" in none.stderr
    assert "records no calibration of it" in none.stderr
    assert "not a usable tolerance class" not in none.stderr
    typo = run_parity(project, "check", "--override", "exact.v=fp32_reasoc")
    assert typo.returncode == 2
    assert "--override 'exact.v=fp32_reasoc' names the unknown tolerance class" in typo.stderr
    assert "did you mean 'fp32_reassoc'?" in typo.stderr and "--class" not in typo.stderr
    assert run_parity(project, "calibrate", "--perturb", "devices=4", "--write").returncode == 0
    used = run_parity(project, "check", "--override", "exact.v=calibrated", "--json", "c.json")
    assert used.returncode == 0, used.stdout + used.stderr
    doc = json.loads((project / "c.json").read_text())
    exact = next(f for f in doc["findings"] if f["key"] == "g/exact.v")
    spread = moved(DEVICE_NOISE)
    assert exact["class"] == "calibrated" and f"4*{spread:.3g}" in exact["allowed"]


def test_a_layout_that_was_not_calibrated_keeps_the_pinned_classes_and_says_so(project, run_parity):
    assert run_parity(project, "calibrate", "--perturb", "repeat", "--write").returncode == 0
    proc = run_parity(project, "check", "--devices", "4", "--baseline", "off")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no calibration of it is recorded" in proc.stdout
    assert "exact.v" in proc.stdout


def test_the_calibrated_rule_is_k_times_the_spread_over_a_floor_in_ulps():
    scale = Scale(np.dtype(np.float32), 2.0)
    ulp = float(np.spacing(np.float32(2.0)))
    assert Calibrated(k=4, floor_ulps=2, spread=1e-5).bound(scale) == pytest.approx(4e-5)
    assert Calibrated(k=4, floor_ulps=2, spread=0.0).bound(scale) == pytest.approx(2 * ulp)
    assert Calibrated(k=4, spread=0.0).bound(scale) == 0.0
    assert Calibrated(k=4).missing() == ["spread"]
    rule = REGISTRY["calibrated"].rule
    assert isinstance(rule, Calibrated)
    assert (rule.k, rule.floor_ulps, rule.spread) == (CALIBRATED_K, CALIBRATED_FLOOR_ULPS, None)


def test_a_calibrated_key_carries_its_exact_spread_as_data_and_its_class_as_written():
    spread = 1.234567891234e-6  # more digits than any class name ever carried
    spreads = Spreads(("devices=4",), {"w": [spread], "v": [spread]})
    names = {"w": "calibrated[k=8]", "v": "calibrated", "b": "bitwise"}
    bound = bind_calibrated(names.__getitem__, spreads, "g", Path("g.h5"))
    tol = bound("w")
    assert isinstance(tol, ToleranceClass) and tol.name == "calibrated[k=8]"
    assert isinstance(tol.rule, Calibrated) and (tol.rule.spread, tol.rule.k) == (spread, 8)
    assert bound("b") == "bitwise"
    g = np.zeros(4)
    a = g + np.array([0.0, 0.0, 0.0, 7.9 * spread])  # within 8x the exact spread
    found = compare_trees({"w": a, "v": a}, {"w": g, "v": g}, bound)
    assert [(f.key, f.class_name, f.passed) for f in found.findings] == [
        ("w", "calibrated[k=8]", True),
        ("v", "calibrated", False),  # 4 x spread
    ]
    assert found.finding("w").bound == pytest.approx(8 * spread, rel=1e-12)


def test_show_and_diff_name_a_calibrated_key_s_class_as_written(tmp_path: Path):
    spread = {"labels": ["repeat"], "keys": {"w": [1.234567891e-7]}}
    path = write_goldens(
        tmp_path / "g.h5",
        {"w": np.zeros(3)},
        class_map_json=ClassMap(default="calibrated[k=8]").to_json(),
        provenance=Provenance(calibration={"spread": spread}),
    )
    assert [a["class"] for a in inventory(path)["arrays"]] == ["calibrated[k=8]"]
    (finding,) = run_diff(path, path).comparison.findings
    assert (finding.class_name, finding.passed) == ("calibrated[k=8]", True)
    assert "8*1.23e-07" in finding.allowed  # the spread shows in what is allowed


def test_a_calibrated_key_without_a_recorded_spread_names_the_calibrate_command():
    bound = bind_calibrated(lambda key: "calibrated", Spreads(), "g", Path("g.h5"))
    with pytest.raises(CheckError, match="parity calibrate --groups g"):
        bound("w")


def test_spreads_take_the_exact_column_else_every_column_of_the_kind_and_repeat():
    s = Spreads(("devices=2", "devices=4", "isa=AVX", "repeat"), {"k": [1.0, 3.0, 5.0, 0.5]})
    four = [Dimension("devices", "devices=4", "")]
    eight = [Dimension("devices", "devices=8", "")]
    assert s.for_columns("k", s.columns_for(four) or []) == 3.0
    assert s.for_columns("k", s.columns_for(eight) or []) == 3.0
    assert s.columns_for([Dimension("processes", "processes=2x2", "")]) is None
    assert s.for_columns("k", s.columns_for([Dimension("cpu", "isa", "")]) or []) == 5.0
    assert s.envelope("k") == 5.0 and s.envelope("other") is None


def test_merging_spreads_replaces_remeasured_columns_and_keeps_the_rest():
    old = {"labels": ["a", "b"], "keys": {"x": [1.0, 2.0]}}
    merged = merge_spreads(old, {"x": {"b": 7.0, "c": 3.0}, "y": {"b": 1.0}}, ["b", "c"])
    assert merged == {
        "labels": ["a", "b", "c"],
        "keys": {"x": [1.0, 7.0, 3.0], "y": [None, 1.0, None]},
    }


def test_producers_text_is_valid_python():
    compile(textwrap.dedent(PRODUCERS), "producers.py", "exec")


def test_repin_classes_only_gives_the_goldens_the_new_map_and_moves_no_array(project, run_parity):
    path = project / "goldens" / "g.h5"
    assert run_parity(project, "calibrate", "--perturb", "repeat", "--write").returncode == 0
    with open_goldens(path) as gf:
        sha = {k: gf.info(k).sha256 for k in gf}
        calibration = gf.provenance.calibration
    (project / "producers.py").write_text(
        PRODUCERS.replace('("exact.*", "bitwise")', '("exact.*", "calibrated")')
    )
    proc = run_parity(project, "repin", "--classes-only")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "g: 3 arrays, unchanged; 1 changed class" in proc.stdout
    assert "1 key bitwise -> calibrated" in proc.stdout
    with open_goldens(path) as gf:
        assert {k: gf.info(k).sha256 for k in gf} == sha
        assert gf.info("exact.v").class_name == "calibrated"
        assert '"calibrated"' in gf.class_map_json
        assert gf.provenance.calibration == calibration
    assert run_parity(project, "check").returncode == 0
    bad = run_parity(project, "repin", "--classes-only", "--base", "HEAD")
    assert bad.returncode == 2 and "drop --base" in bad.stderr


def test_calibrate_records_a_measurement_saved_as_json(project, run_parity, tmp_path):
    saved = tmp_path / "cal.json"
    proc = run_parity(project, "calibrate", "--perturb", "devices=4", "--json", str(saved))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open_goldens(project / "goldens" / "g.h5") as gf:
        assert not Spreads.of(gf.provenance)
    proc = run_parity(project, "calibrate", "--from-json", str(saved), "--write")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open_goldens(project / "goldens" / "g.h5") as gf:
        spreads = Spreads.of(gf.provenance)
    assert spreads.labels == ("devices=4",)
    assert list(spreads.keys["exact.v"]) == [pytest.approx(moved(DEVICE_NOISE))]
    saved.write_text("{}")
    bad = run_parity(project, "calibrate", "--from-json", str(saved), "--write")
    assert bad.returncode == 2 and "not a calibrate --json file" in bad.stderr


CPU = Provenance(device_count=1, isa_cap="AVX2", cpu="AuthenticAMD family 25 model 1; avx avx2",
                 jax="0.10.2")  # fmt: skip


@pytest.mark.parametrize(
    ("current", "calibrate", "repin"),
    [
        ({"device_count": 4}, True, "parity repin --base 0123456789ab --groups g --devices 4"),
        ({"isa_cap": "AVX"}, True, "parity repin --base 0123456789ab --groups g --isa AVX"),
        ({"jax": "0.11.0"}, False, "parity repin --base 0123456789ab --groups g"),
        ({"cpu": "GenuineIntel family 6 model 85"}, False, "parity repin --base 0123456789ab"),
        ({"backend": "tpu", "device_count": 4}, False, "--groups g` ("),
        ({"device_count": 4, "processes": 2}, True, None),
        ({"device_count": 4, "processes": 2, "jax": "0.11.0"}, False, None),
    ],
    ids=["devices", "isa", "jax", "processor", "backend", "processes", "processes-and-jax"],
)
def test_the_remedy_offered_matches_what_moved(current, calibrate, repin):
    """`parity calibrate` is offered only where it perturbs everything that moved; `parity
    repin` adopts this environment wherever a repin can run it (one process)."""
    here = dataclasses.replace(CPU, **current)
    said = environment_remedy("g", "0123456789abcdef", environment_difference(CPU, here), here)
    assert ("parity calibrate --groups g" in said) == calibrate, said
    if repin is None:
        assert "parity repin" not in said, said
    else:
        assert repin in said, said
    if not calibrate:
        assert "no calibration measures" in said, said
    if repin is None and not calibrate:
        assert said.startswith("run where the goldens were pinned"), said
