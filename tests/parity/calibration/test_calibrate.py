"""`parity calibrate` on a numpy-only project whose producers add a known amount of noise
per environment (read from the XLA flags the runner sets), so that the spread calibration
must report is computed here by another path."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from parity.calibration._measure import KeySpread, class_spreads
from parity.calibration._perturbations import (
    CalibrationError,
    Perturbation,
    host_isa_caps,
    perturbations,
)
from parity.machinery._config import ParityConfig
from parity.store import open_goldens

#: Noise per environment; the producers below and the expectations share only these numbers.
ISA_NOISE = {"SSE4_2": 3e-5, "AVX": 1e-6}
DEVICE_NOISE = 2.5e-7

PRODUCERS = f"""\
import os
import re

import numpy as np

FLAGS = os.environ.get("XLA_FLAGS", "")
ISA = re.search(r"--xla_cpu_max_isa=(\\S+)", FLAGS)
DEVICES = re.search(r"device_count=(\\d+)", FLAGS)
NOISE = {ISA_NOISE!r}.get(ISA.group(1) if ISA else "", 0.0)
NOISE += {DEVICE_NOISE!r} if DEVICES and DEVICES.group(1) != "1" else 0.0
BASE = np.linspace(1.0, 2.0, 8)


def group():
    moved = (BASE + NOISE).astype(np.float32)
    return {{
        "taps.x": moved,
        "logits.y": BASE.astype(np.float32),
        "loose.z": moved.copy(),
        "budget.w": (BASE + NOISE).astype(np.float64),
    }}


GROUPS = {{"g": group}}
CLASS_MAP = [
    ("taps.*", "fp32_reassoc"),
    ("logits.*", "bitwise"),
    ("loose.*", "eval_metric"),
    ("budget.*", "compile_budget"),
]
"""


def _expected_max_abs(noises: list[float], dtype: type) -> float:
    base = np.linspace(1.0, 2.0, 8)
    golden = base.astype(dtype).astype(np.float64)
    return max(
        float(np.max(np.abs((base + n).astype(dtype).astype(np.float64) - golden))) for n in noises
    )


@pytest.fixture
def project(tmp_path: Path, git_project) -> Path:
    return git_project(tmp_path, PRODUCERS, 'producers = "producers.py"\nsrc = "."\n')


def test_perturbations_leave_the_pinned_environment_out_and_refuse_what_the_host_lacks() -> None:
    base = ParityConfig(root=Path("."), isa="AVX2", devices=1)
    got = perturbations(["isa", "devices", "repeat"], base, host_caps=["SSE4_2", "AVX", "AVX2"])
    assert got == [
        Perturbation("isa=SSE4_2", "SSE4_2", 1),
        Perturbation("isa=AVX", "AVX", 1),
        Perturbation("devices=2", "AVX2", 2),
        Perturbation("devices=4", "AVX2", 4),
        Perturbation("repeat", "AVX2", 1),
    ]
    # A bare `processes` is 2 processes x 2 devices, the layout the guide checks and the
    # messages suggesting it mean, whatever the pinned device count.
    for devices in (1, 4):
        at = ParityConfig(root=Path("."), isa="AVX2", devices=devices)
        assert perturbations(["processes"], at, host_caps=[]) == [
            Perturbation("processes=2x2", "AVX2", 2, 2)
        ]
    with pytest.raises(CalibrationError, match="supports the ISA caps"):
        perturbations(["isa=AVX512"], base, host_caps=["SSE4_2", "AVX", "AVX2"])
    with pytest.raises(CalibrationError, match="unknown perturbation"):
        perturbations(["unroll"], base, host_caps=[])
    with pytest.raises(CalibrationError, match="nothing to run"):
        perturbations(["isa"], base, host_caps=["AVX2"])


def test_host_isa_caps_follow_the_cpu_flags() -> None:
    assert host_isa_caps(["fpu", "sse4_2", "avx", "avx2", "fma"]) == ["SSE4_2", "AVX", "AVX2"]
    assert host_isa_caps(["sse4_2", "avx", "avx2", "avx512f"])[-1] == "AVX512"
    assert host_isa_caps([]) == []


def _spread(cls: str, ratio: float, bound: float) -> KeySpread:
    return KeySpread("g", f"k{ratio}", cls, "", "abs", bound, ratio * bound, 1, 0.0,
                     ratio * bound, ratio, "p")  # fmt: skip


def test_class_verdicts_below_noise_blunt_and_ok() -> None:
    spreads = [
        _spread("tight", 0.5, 1e-6),
        _spread("tight", 1.5, 1e-6),
        _spread("loose", 0.004, 1e-3),
        _spread("loose", 0.009, 1e-3),
        _spread("fair", 0.02, 1e-3),
        _spread("bitwise", 0.0, 0.0),
        _spread("quiet", 0.0, 1e-3),
    ]
    verdicts = {c.class_name: c.verdict for c in class_spreads(spreads)}
    assert verdicts == {
        "tight": "below noise",
        "loose": "blunt",
        "fair": "ok",
        "bitwise": "ok",
        "quiet": "blunt",
    }


def test_calibrated_keys_are_one_class_each_allowed_its_own_spread() -> None:
    """The spread is the rule's parameter, not part of the class's name: every key under
    `calibrated` is one row, whose allowed column says each key has its own bound."""
    keys = [
        dataclasses.replace(_spread("calibrated", 0.5, 4e-6), allowed="4*1e-06"),
        dataclasses.replace(_spread("calibrated", 0.25, 8e-6), allowed="4*2e-06"),
    ]
    (row,) = class_spreads(keys)
    assert (row.class_name, row.keys, row.ratio) == ("calibrated", 2, 0.5)
    assert row.allowed == "per key (worst: 4*1e-06)"


def test_calibrate_reports_the_known_spread_per_key_and_class(
    project: Path, tmp_path: Path, run_parity
) -> None:
    if not {"SSE4_2", "AVX"} <= set(host_isa_caps()):
        pytest.skip("this host cannot run the SSE4_2 and AVX caps")
    out = tmp_path / "cal.json"
    proc = run_parity(project, "calibrate", "--perturb", "isa=SSE4_2,isa=AVX,devices=2",
                      "--json", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    keys = {k["key"]: k for k in doc["keys"]}
    noises = [ISA_NOISE["SSE4_2"], ISA_NOISE["AVX"], DEVICE_NOISE]
    want32 = _expected_max_abs(noises, np.float32)
    assert keys["taps.x"]["max_abs"] == pytest.approx(want32, rel=1e-12)
    assert keys["taps.x"]["max_rel_to_max"] == pytest.approx(want32 / 2.0, rel=1e-12)
    assert keys["taps.x"]["ratio"] == pytest.approx(want32 / 2e-5, rel=1e-9)
    assert keys["taps.x"]["worst"] == "isa=SSE4_2"
    assert keys["taps.x"]["failing"] == ["isa=SSE4_2"]
    per = {label: max_abs for label, max_abs, _ in keys["taps.x"]["by_perturbation"]}
    assert per == {
        "isa=SSE4_2": pytest.approx(_expected_max_abs([ISA_NOISE["SSE4_2"]], np.float32)),
        "isa=AVX": pytest.approx(_expected_max_abs([ISA_NOISE["AVX"]], np.float32)),
        "devices=2": pytest.approx(_expected_max_abs([DEVICE_NOISE], np.float32)),
    }
    assert "per perturbation, per class" in proc.stdout
    spacing = float(np.spacing(np.float32(2.0)))
    assert keys["taps.x"]["max_ulp"] >= round(ISA_NOISE["SSE4_2"] / spacing)
    assert keys["logits.y"]["max_abs"] == 0.0 and keys["logits.y"]["worst"] is None
    classes = {c["class_name"]: c for c in doc["classes"]}
    assert classes["fp32_reassoc"]["verdict"] == "below noise"
    assert classes["bitwise"]["verdict"] == "ok"
    assert classes["eval_metric"]["verdict"] == "ok"
    # compile_budget: 2% of ~2 against at most 3e-5 of noise.
    assert classes["compile_budget"]["verdict"] == "blunt"
    assert classes["compile_budget"]["max_abs"] == pytest.approx(
        _expected_max_abs(noises, np.float64), rel=1e-9
    )
    assert "fp32_reassoc: below the measured noise" in proc.stdout
    assert "compile_budget: blunt" in proc.stdout


def test_calibrate_measures_a_candidate_class_given_as_override(project: Path, run_parity) -> None:
    args = ("calibrate", "--perturb", "devices=2", "--override", "taps.*=reduction[K=8]")
    proc = run_parity(project, *args, "--override", "logits.*=nope")
    assert proc.returncode == 2 and "unknown tolerance class 'nope'" in proc.stderr
    proc = run_parity(project, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "reduction[K=8]" in proc.stdout


def test_write_records_the_measurement_and_leaves_the_arrays(project: Path, run_parity) -> None:
    path = project / "goldens" / "g.h5"
    with open_goldens(path) as gf:
        before = {k: gf.info(k).sha256 for k in gf}
        order, cmap = gf.ordered_keys(), gf.class_map_json
    proc = run_parity(project, "calibrate", "--perturb", "devices=2", "--write")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "calibration recorded in" in proc.stdout
    with open_goldens(path) as gf:
        assert {k: gf.info(k).sha256 for k in gf} == before
        assert gf.ordered_keys() == order and gf.class_map_json == cmap
        recorded = gf.provenance.calibration
    assert recorded is not None
    assert recorded["perturbations"] == ["devices=2"]
    assert "fp32_reassoc" in recorded["summary"]
    check = run_parity(project, "check")
    assert check.returncode == 0, check.stdout + check.stderr
    header = [ln for ln in check.stdout.splitlines() if ln.strip().startswith("calibration")]
    assert header and "under devices=2" in header[0]
    assert "drift" not in check.stdout


def test_calibrate_errors_are_one_line(project: Path, run_parity) -> None:
    for args, needle in (
        (("--perturb", "unroll"), "unknown perturbation"),
        (("--groups", "nope"), "no group named 'nope'"),
        (("--write", "--override", "taps.*=bitwise"), "drop --override and --class to record"),
        (("--write", "--class", "bitwise"), "drop --override and --class to record"),
    ):
        proc: subprocess.CompletedProcess[str] = run_parity(project, "calibrate", *args)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("parity: error: ")]
        assert len(errors) == 1 and needle in errors[0], proc.stderr
