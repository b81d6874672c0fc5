"""The core (`parity.check`): one class precedence for the CLI, the plugin and the API;
ordinary exceptions; results that cross processes; actual arrays on failure."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parity._cli import main, run_diff
from parity._results import CheckError, CheckResult
from parity.check import GoldenDir, check_group, check_live
from parity.commands._common import CLIError
from parity.judge._tolerance import ClassMap
from parity.report import format_table
from parity.store import Provenance, write_goldens
from parity.store._provenance import collect_provenance

# Pinned map: layers.* -> fp32_reassoc; "rec" has no rule in it but records trajectory.
_PINNED = ClassMap((("layers.*", "fp32_reassoc"),))
_KEYS = ["layers.0.h1", "layers.1.h1", "rec", "plain"]


def _arrays() -> dict[str, np.ndarray]:
    return {k: np.linspace(-1, 1, 6, dtype=np.float32) * (i + 1) for i, k in enumerate(_KEYS)}


def _pin(root: Path, provenance: Provenance | None = None) -> Path:
    """Write the group `g` into `root`; **returns** `root`."""
    write_goldens(
        root / "g.h5",
        _arrays(),
        classes={"layers.0.h1": "fp32_reassoc", "layers.1.h1": "fp32_reassoc", "rec": "trajectory"},
        class_map_json=_PINNED.to_json(),
        order=_KEYS,
        provenance=provenance,
    )
    return root


@pytest.fixture(scope="module")
def golden_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _pin(tmp_path_factory.mktemp("goldens"))


# Each case: (overrides, caller's class) -> expected class per key. The same inputs go to
# the CLI (--override, --class) and to check_group, which the pytest plugin calls.
_CASES = [
    ((), None, {"layers.0.h1": "fp32_reassoc", "rec": "trajectory", "plain": "bitwise"}),
    ((), "device_count", dict.fromkeys(_KEYS, "device_count")),
    (
        (("layers.1.*", "eval_metric"),),
        None,
        {"layers.0.h1": "fp32_reassoc", "layers.1.h1": "eval_metric", "rec": "trajectory"},
    ),
    (
        (("rec", "bitwise"),),
        "device_count",
        {"layers.0.h1": "device_count", "rec": "bitwise"},
    ),
]


@pytest.mark.parametrize(("overrides", "class_name", "expected"), _CASES)
def test_one_class_precedence_in_every_case(
    golden_dir: Path, overrides, class_name, expected
) -> None:
    core = check_group(
        _arrays(), "g", goldens=golden_dir, class_map=class_name, overrides=overrides
    )
    by_core = {f.key: f.class_name for f in core.comparison.findings}
    for key, name in expected.items():
        assert by_core[key] == name, key


@pytest.mark.parametrize(("overrides", "class_name", "expected"), _CASES)
def test_a_diff_is_the_check_of_its_two_files(
    tmp_path: Path, overrides, class_name, expected
) -> None:
    """`parity diff ACTUAL GOLDEN` is `check_file` of GOLDEN with ACTUAL's environment: the
    same findings (classes, order, verdicts) and the same drift, order and reference lines."""
    here = collect_provenance()
    _pin(tmp_path, replace(here, base_sha="f" * 40))
    mutated = _arrays()
    mutated["layers.0.h1"][1] += 1e-3
    elsewhere = replace(here, jax="0.0.elsewhere", numpy="0.0.elsewhere")
    actual = write_goldens(tmp_path / "actual.h5", mutated, provenance=elsewhere)
    cli = run_diff(actual, tmp_path / "g.h5", class_name=class_name, overrides=overrides)
    core = check_group(
        mutated, "g", goldens=tmp_path, class_map=class_name, overrides=overrides,
        current_provenance=elsewhere,
    )  # fmt: skip
    assert cli.comparison.findings == core.comparison.findings
    assert {f.key: f.class_name for f in cli.comparison.findings}.items() >= expected.items()
    shared = {k: v for k, v in core.header.items() if k != "golden"}
    assert {k: v for k, v in cli.header.items() if k in shared} == shared
    assert "jax: " in cli.header["drift 0"] and "numpy: " in cli.header["drift 1"]
    assert cli.header["base_sha"] == "f" * 40


def test_a_caller_map_without_default_falls_through_to_the_pinned_map(golden_dir: Path) -> None:
    caller = ClassMap((("plain", "device_count"),))  # no default: the rest falls through
    result = check_group(_arrays(), "g", goldens=golden_dir, class_map=caller)
    classes = {f.key: f.class_name for f in result.comparison.findings}
    assert classes == {
        "layers.0.h1": "fp32_reassoc",
        "layers.1.h1": "fp32_reassoc",
        "rec": "trajectory",
        "plain": "device_count",
    }


def test_an_unknown_class_is_an_input_error_in_both_faces(golden_dir: Path, capsys) -> None:
    with pytest.raises(CheckError, match="ulp_free"):
        check_group(_arrays(), "g", goldens=golden_dir, overrides=[("plain", "ulp_free")])
    path = str(golden_dir / "g.h5")
    assert main(["diff", path, path, "--override", "plain=ulp_free"]) == 2
    assert "ulp_free" in capsys.readouterr().err


def test_problems_are_ordinary_exceptions_not_pytest_failures(tmp_path: Path) -> None:
    with pytest.raises(CheckError, match=r"no golden file for group 'nope'.*repin"):
        check_group({}, "nope", goldens=tmp_path)
    # Strict drift policy: the goldens record no provenance, so every field drifted.
    write_goldens(tmp_path / "g.h5", {"a": np.zeros(2)})
    with pytest.raises(CheckError, match="strict"):
        check_group({"a": np.zeros(2)}, "g", goldens=tmp_path, drift_mode="strict")


def test_results_round_trip_through_json(golden_dir: Path) -> None:
    mutated = _arrays()
    mutated["rec"][3] = np.nan
    result = check_group(mutated, "g", goldens=golden_dir, node="n", produce_s=1.5)
    back = CheckResult.from_dict(json.loads(json.dumps(result.to_dict())))
    # NaN != NaN, so compare the JSON forms; the types come back too.
    assert back.to_dict() == result.to_dict() and isinstance(back.checked_keys, tuple)
    assert not back.passed and back.comparison.first_failure is not None
    assert back.comparison.first_failure.key == "rec"
    # The header comes back typed, field by field, and reads as the same lines.
    assert back.header == result.header and back.header.reference == result.header.reference
    assert result.header.golden == str(golden_dir / "g.h5") and result.header.reference
    assert list(back.header) == list(result.header.lines()) and "golden" in back.header


def test_the_first_divergence_of_a_mutated_group_names_the_mutated_key(golden_dir: Path) -> None:
    mutated = _arrays()
    mutated["layers.1.h1"][2] += 1e-3  # beyond fp32_reassoc
    mutated["plain"][0] += 1.0  # later in the order: not the first
    other = check_live({"x": np.ones(3)}, {"x": np.ones(3)}, name="live.ok")
    bad = check_group(mutated, "g", goldens=golden_dir)
    text = format_table(
        other.comparison, checks=[(other.name, other.comparison), (bad.name, bad.comparison)]
    )
    section = text.split("checks (2 of 2)")[1]
    assert "PASS live.ok" in section
    assert "FAIL g (2 of 4 arrays fail)" in section
    assert "first breaking its class: layers.1.h1 [fp32_reassoc, fail]" in section


def test_a_failing_check_saves_its_actual_arrays_for_parity_diff(
    golden_dir: Path, tmp_path: Path, capsys
) -> None:
    mutated = _arrays()
    mutated["layers.0.h1"][1] += 1e-3
    result = check_group(
        mutated,
        "g",
        goldens=golden_dir,
        overrides=[("rec", "device_count")],
        save_actual=tmp_path / "actual",
    )
    assert result.saved == str(tmp_path / "actual" / "g.h5") and result.command
    assert "--override 'rec=device_count'" in result.command
    # The command reproduces the table: same verdicts, classes and figures per key.
    argv = result.command.replace("'", "").split()[3:]
    code = main(argv)
    assert code == 1
    out = capsys.readouterr().out
    reproduced = run_diff(result.saved, golden_dir / "g.h5", overrides=[("rec", "device_count")])
    assert reproduced.comparison.findings == result.comparison.findings
    assert "layers.0.h1 [fp32_reassoc, fail]" in out
    # A passing check writes nothing.
    ok = check_group(_arrays(), "g", goldens=golden_dir, save_actual=tmp_path / "none")
    assert ok.saved is None and not (tmp_path / "none").exists()


@pytest.mark.parametrize(
    "class_map", [ClassMap((("plain", "fp32_reassoc"),)), "fp32_reassoc"], ids=["rules", "name"]
)
def test_the_reproduce_command_carries_the_caller_s_class_map(
    golden_dir: Path, tmp_path: Path, capsys, class_map: ClassMap | str
) -> None:
    """Without the caller's map, `parity diff` would judge `plain` (2 ulp off) bitwise and
    fail it, where the check passed it under the map (issue 29)."""
    mutated = _arrays()
    mutated["layers.0.h1"][1] += 1e-3
    mutated["plain"][2] = np.nextafter(np.nextafter(mutated["plain"][2], 9), 9)
    result = check_group(
        mutated, "g", goldens=golden_dir, class_map=class_map, save_actual=tmp_path / "actual"
    )
    assert not result.passed and result.command
    assert result.comparison.finding("plain").passed
    argv = result.command.replace("'", "").split()[3:]
    json_path = tmp_path / "diff.json"
    assert main([*argv, "--json", str(json_path)]) == 1
    capsys.readouterr()
    reproduced = json.loads(json_path.read_text())["findings"]
    assert [(f["key"], f["class"], f["verdict"]) for f in reproduced] == [
        (f.key, f.class_name, f.verdict) for f in result.comparison.findings
    ]


def test_golden_dir_opens_each_file_once_and_lists_groups(golden_dir: Path) -> None:
    with GoldenDir(golden_dir) as d:
        assert d.groups() == ["g"]
        assert d.open("g") is d.open("g")


def test_a_diff_judges_actual_s_environment_by_the_golden_s_calibration(tmp_path: Path) -> None:
    """ACTUAL produced on 4 devices, GOLDEN pinned on 1 with its spread there recorded: the
    diff judges as the check in ACTUAL's environment did (by calibration), and its drift
    policy is the check's."""
    here = replace(collect_provenance(), device_count=1, processes=1)
    spread = {"labels": ["devices=4"], "keys": {"w": [1e-3]}}
    golden = write_goldens(
        tmp_path / "g.h5",
        {"w": np.zeros(4)},
        provenance=replace(here, calibration={"spread": spread}),
    )
    on_four = replace(here, device_count=4)
    actual = write_goldens(
        tmp_path / "a.h5", {"w": np.array([0.0, 0.0, 0.0, 1e-3])}, provenance=on_four
    )
    result = run_diff(actual, golden)
    assert result.comparison.passed, format_table(result.comparison, header=result.header)
    assert "judged by calibration" in result.comparison.findings[0].note
    assert "devices 1 -> 4" in result.header["environment"]
    with pytest.raises(CLIError, match="strict"):
        run_diff(actual, golden, drift_mode="strict")


def _pinned_with_a_baseline_and_one_ulp_moved(tmp_path: Path) -> tuple[dict, Path, Any, dict]:
    """Group g pinned here on 1 device at base b..b, a stand-in baseline source that
    re-produces the goldens bit for bit, and the arrays with `plain[0]` one ulp up:
    `(provenance, goldens, baseline source, arrays)`."""
    from parity.check import Baseline

    here = replace(collect_provenance(), device_count=1, processes=1, base_sha="b" * 40)
    goldens = tmp_path / "goldens"
    goldens.mkdir()
    _pin(goldens, here)
    baseline_file = write_goldens(tmp_path / "baseline.h5", _arrays(), order=_KEYS)

    class Source:
        def reproduce(self, group, pinned, current) -> Baseline:
            return Baseline(baseline_file, str(pinned.base_sha), cached=True)

    mutated = _arrays()
    mutated["plain"][0] = np.nextafter(mutated["plain"][0], np.float32(9))
    return here, goldens, Source(), mutated


def test_against_the_baseline_the_header_keeps_no_drift_that_moves_bits(tmp_path: Path) -> None:
    """The baseline shares this environment: its drift cannot explain a failure, so the
    header drops that line and keeps the informational one."""
    here, goldens, baseline, mutated = _pinned_with_a_baseline_and_one_ulp_moved(tmp_path)
    elsewhere = replace(here, device_count=4, numpy="0.0.elsewhere")
    result = check_group(mutated, "g", goldens=goldens, current_provenance=elsewhere,
                         baseline=baseline)  # fmt: skip
    assert not result.passed and result.comparison.finding("plain").verdict == "fail"
    assert result.header["reference"].startswith("the baseline re-produced here at bbbbbbbbbbbb")
    drift = [v for k, v in result.header.items() if k.startswith("drift")]
    assert drift == ["environment drift (informational): numpy: '" + str(here.numpy)
                     + "' -> '0.0.elsewhere' (info)"]  # fmt: skip
    without = check_group(mutated, "g", goldens=goldens, current_provenance=elsewhere)
    assert "device_count: 1 -> 4 (bits)" in without.header["drift 0"]


def test_against_the_baseline_a_failure_is_vs_baseline_and_the_baseline_is_not_called_calibrated(
    tmp_path: Path,
) -> None:
    """The baseline reproduced the goldens bit for bit: nothing was calibrated, so the
    reference line does not say "calibrated noise"; the failure is named against the
    baseline."""
    here, goldens, baseline, mutated = _pinned_with_a_baseline_and_one_ulp_moved(tmp_path)
    elsewhere = replace(here, device_count=4)
    result = check_group(mutated, "g", goldens=goldens, current_provenance=elsewhere,
                         baseline=baseline)  # fmt: skip
    reference = result.header["reference"]
    assert "itself within the goldens' pinned classes: bit for bit equal" in reference, reference
    assert "calibrated" not in reference
    failure = result.comparison.finding("plain")
    assert " vs baseline " in failure.reason and "vs golden" not in failure.reason
    text = format_table(result.comparison, header=result.header)
    assert "vs baseline" in text and "vs golden" not in text, text


def test_at_index_names_the_same_element_on_pass_and_fail_lines(tmp_path: Path) -> None:
    """A tolerant pass names its worst element, a bitwise failure its first differing one:
    every line says which before "at index", as the failure's reason does."""
    expected = {"taps": np.linspace(1, 2, 4, dtype=np.float32), "logits": np.ones(3, np.float32)}
    actual = {k: v.copy() for k, v in expected.items()}
    actual["taps"][2] = np.nextafter(actual["taps"][2], np.float32(9))
    actual["logits"][0] += np.float32(1e-6)
    actual["logits"][2] += np.float32(1e-3)  # the largest difference, not the first
    result = check_live(actual, expected, overrides=[("taps", "fp32_reassoc")],
                        order=["taps", "logits"])  # fmt: skip
    text = format_table(result.comparison)
    first_nb = next(ln for ln in text.splitlines() if "first not bitwise equal" in ln)
    first_fail = next(ln for ln in text.splitlines() if "first breaking its class" in ln)
    assert "taps [fp32_reassoc, pass], worst at index (2,)" in first_nb, first_nb
    assert "logits [bitwise, fail], first differing element at index (0,)" in first_fail
    assert "first differing element at index (0,)" in result.comparison.finding("logits").reason


def test_a_group_that_holds_its_classes_off_the_pins_layout_asks_for_no_calibration(
    tmp_path: Path,
) -> None:
    here = replace(collect_provenance(), device_count=1, processes=1)
    goldens = tmp_path / "goldens"
    goldens.mkdir()
    _pin(goldens, here)
    elsewhere = replace(here, device_count=4)
    result = check_group(_arrays(), "g", goldens=goldens, current_provenance=elsewhere)
    assert result.passed and result.comparison.inexact == ""
    text = format_table(result.comparison, header=result.header)
    assert "calibrat" not in text, text


def test_a_calibrated_key_that_passes_off_its_bits_says_not_exact(tmp_path: Path) -> None:
    """A `calibrated` key judged where its bits could have been (the pin's environment):
    the verdict line says it passed by its bound, not bit for bit."""
    here = replace(collect_provenance(), device_count=1, processes=1)
    spread = {"labels": ["devices=4"], "keys": {"w": [1e-3]}}
    write_goldens(
        tmp_path / "g.h5", {"w": np.zeros(4, np.float32)}, classes={"w": "calibrated"},
        provenance=replace(here, calibration={"spread": spread}),
    )  # fmt: skip
    moved = {"w": np.array([0, 0, 1e-4, 0], np.float32)}
    result = check_group(moved, "g", goldens=tmp_path, current_provenance=here)
    assert result.passed
    verdict = format_table(result.comparison).splitlines()[0]
    assert verdict.startswith("parity: PASS") and "not exact" in verdict, verdict
    assert "(w) passed their calibrated bound, not bit for bit against the goldens" in verdict
    same = check_group(
        {"w": np.zeros(4, np.float32)}, "g", goldens=tmp_path, current_provenance=here
    )
    assert same.comparison.inexact == ""


def test_a_required_baseline_that_nothing_re_produces_is_an_input_error(tmp_path: Path) -> None:
    here = replace(collect_provenance(), device_count=1, processes=1, base_sha="b" * 40)
    _pin(tmp_path, here)
    mutated = _arrays()
    mutated["plain"][0] += np.float32(1e-6)
    elsewhere = replace(here, device_count=4)
    with pytest.raises(CheckError, match="the baseline is required"):
        check_group(mutated, "g", goldens=tmp_path, current_provenance=elsewhere,
                    require_baseline=True)  # fmt: skip
    # The pin's own environment needs no baseline: required or not, the goldens are the
    # reference.
    assert not check_group(mutated, "g", goldens=tmp_path, current_provenance=here,
                           require_baseline=True).passed  # fmt: skip


def test_a_check_that_needs_its_baseline_compares_each_pair_of_arrays_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One pass: the first verdict records that the baseline is wanted, the baseline is
    prepared once, and the comparison with the baseline reuses what the first verdict
    found. Every tree array is compared with its golden once, the baseline with the goldens
    once, and the tree with the baseline only where the first verdict did not already show
    it equal: the key that moved."""
    import parity.calibrated._bounds
    import parity.judge._compare
    from parity.judge._compare import compare_trees
    from parity.machinery._runner_output import RunnerOutput
    from parity.run._produced import Produced, check_produced
    from parity.store import open_goldens
    from parity.store._reader import GoldenFile

    here, goldens, baseline, mutated = _pinned_with_a_baseline_and_one_ulp_moved(tmp_path)
    elsewhere = replace(here, device_count=4)

    class Batch:
        def __init__(self) -> None:
            self.prepared: list[list[str]] = []
            self.reproduced: list[str] = []

        def reproduce(self, group, pinned, current):
            self.reproduced.append(group)
            return baseline.reproduce(group, pinned, current)

        def prepare(self, wanted):
            self.prepared.append([g for g, _, _ in wanted])
            return {g: baseline.reproduce(g, p, c) for g, p, c in wanted}

    files: dict[int, str] = {}  # id of a source -> the file it reads
    source = GoldenFile.source

    def tagged(self, key):
        got = source(self, key)
        files[id(got)] = self.path.name
        return got

    tree = {id(a): "tree" for a in mutated.values()}
    pairs: list[tuple[str, str, str]] = []
    compare = parity.judge._compare.compare_arrays

    def counted(key, actual, golden, tol, **kw):
        pairs.append((key, tree.get(id(actual)) or files[id(actual)], files[id(golden)]))
        return compare(key, actual, golden, tol, **kw)

    monkeypatch.setattr(GoldenFile, "source", tagged)
    monkeypatch.setattr(parity.judge._compare, "compare_arrays", counted)
    monkeypatch.setattr(parity.calibrated._bounds, "compare_arrays", counted)
    produced = Produced({"g": RunnerOutput(mutated, elsewhere)}, 0.0, "")
    batch = Batch()
    [result] = check_produced(produced, goldens, baseline=batch)
    monkeypatch.undo()

    assert batch.prepared == [["g"]] and batch.reproduced == []
    expected = [(k, "tree", "g.h5") for k in _KEYS]
    expected += [(k, "baseline.h5", "g.h5") for k in _KEYS]
    assert sorted(pairs) == sorted([*expected, ("plain", "tree", "baseline.h5")]), pairs
    # The same verdict as the plugin's call per group, and as comparing every key anew.
    alone = check_group(mutated, "g", goldens=goldens, current_provenance=elsewhere,
                        baseline=baseline)  # fmt: skip
    assert result.comparison.findings == alone.comparison.findings
    assert result.header == alone.header and not result.passed
    classes = {f.key: f.class_name for f in result.comparison.findings}
    with open_goldens(tmp_path / "baseline.h5") as bf:
        anew = compare_trees(mutated, {k: bf[k] for k in bf}, classes.__getitem__,
                             order=_KEYS, reference="baseline")  # fmt: skip
    assert result.comparison.findings == anew.findings
