"""The command line, run as `python -m parity` subprocesses: exit codes, messages, outputs."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np
import pytest
from _damage import flip_stored_byte

from parity.judge._tolerance import ClassMap
from parity.store import Provenance, write_goldens

_CMAP = ClassMap((("taps.*", "fp32_reassoc"),), default="bitwise")


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "taps.layers.0": rng.standard_normal((4, 12, 32)).astype(np.float32),
        "taps.layers.1": rng.standard_normal((4, 12, 32)).astype(np.float32),
        "weights.w": rng.standard_normal((32, 8)).astype(np.float32),
        "loss": np.asarray(np.float32(0.25)),
    }


def _write(path: Path, arrays: dict[str, np.ndarray], *, pinned: bool = True) -> Path:
    """A parity file; with `pinned`, the class map, per-array classes, order, provenance."""
    if not pinned:
        return write_goldens(path, arrays)
    return write_goldens(
        path,
        arrays,
        classes={k: _CMAP.class_for(k) for k in arrays},
        class_map_json=_CMAP.to_json(),
        provenance=Provenance(jax="0.0.test", base_sha="f" * 40),
        # taps.layers.1 before taps.layers.0: the pinned order, not the name, decides.
        order=["taps.layers.1", "taps.layers.0"],
    )


def _parity(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "parity", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        timeout=120,
    )


def _assert_unusable(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, one `parity: error:` line on stderr naming `needles`, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("parity: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def golden(tmp_path: Path) -> Path:
    return _write(tmp_path / "golden.h5", _arrays())


# --------------------------------------------------------------------------- diff verdicts


def test_identical_files_exit_0(tmp_path: Path, golden: Path) -> None:
    actual = _write(tmp_path / "actual.h5", _arrays())
    proc = _parity("diff", actual, golden)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("parity: PASS (0 of 4 arrays fail)")
    assert proc.stderr == ""


def test_every_array_breaking_bitwise_is_printed_and_exits_1(tmp_path: Path, golden: Path) -> None:
    arrays = _arrays()
    arrays["weights.w"][3, 5] += np.float32(1e-6)
    arrays["loss"] = np.asarray(np.float32(0.5))
    actual = _write(tmp_path / "actual.h5", arrays)
    proc = _parity("diff", actual, golden, "--class", "bitwise")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "parity: FAIL (2 of 4 arrays fail)" in proc.stdout
    failures = proc.stdout.split("failures (2):")[1]
    assert "weights.w [bitwise, fail]" in failures and "index (3, 5)" in failures
    assert "loss [bitwise, fail]" in failures
    assert proc.stderr == ""


def test_a_perturbation_within_a_close_class_exits_0(tmp_path: Path, golden: Path) -> None:
    arrays = _arrays()
    arrays["weights.w"][0, 0] += np.float32(1e-6)
    actual = _write(tmp_path / "actual.h5", arrays)
    assert _parity("diff", actual, golden).returncode == 1  # pinned: weights are bitwise
    proc = _parity("diff", actual, golden, "--class", "fp32_reassoc")
    assert proc.returncode == 0, proc.stdout
    assert "--class fp32_reassoc for every key" in proc.stdout


def test_the_goldens_pinned_classes_and_order_are_used(tmp_path: Path, golden: Path) -> None:
    arrays = _arrays()
    arrays["taps.layers.0"][0, 0, 0] += np.float32(1e-3)  # breaks fp32_reassoc (2e-5)
    arrays["taps.layers.1"][1, 2, 3] += np.float32(1e-3)
    arrays["weights.w"] = arrays["weights.w"] + np.float32(1e-6)  # would pass only if close
    actual = write_goldens(tmp_path / "actual.h5", arrays, provenance=Provenance(jax="0.0.other"))
    proc = _parity("diff", actual, golden)
    assert proc.returncode == 1
    assert "taps.layers.0 [fp32_reassoc, fail]" in proc.stdout
    assert "weights.w [bitwise, fail]" in proc.stdout
    # taps.layers.1 comes first in the pinned order although it sorts after taps.layers.0.
    assert "first breaking its class: taps.layers.1 [fp32_reassoc, fail]" in proc.stdout
    assert re.search(r"base_sha +" + "f" * 40, proc.stdout), proc.stdout
    assert "jax: '0.0.test' -> '0.0.other' (bits)" in proc.stdout  # the drift, in the header


def test_missing_and_unexpected_keys_fail(tmp_path: Path, golden: Path) -> None:
    arrays = _arrays()
    del arrays["loss"]
    arrays["extra"] = np.zeros(3, np.float32)
    proc = _parity("diff", _write(tmp_path / "actual.h5", arrays), golden)
    assert proc.returncode == 1
    assert "loss [bitwise, missing]" in proc.stdout
    assert "extra [bitwise, unexpected]" in proc.stdout


def test_plain_h5py_files_are_accepted(tmp_path: Path, golden: Path) -> None:
    plain_g, plain_a = tmp_path / "plain_g.h5", tmp_path / "plain_a.h5"
    for path, bump in ((plain_g, 0.0), (plain_a, 0.0)):
        with h5py.File(path, "w") as f:
            f.create_dataset("group/x", data=np.arange(6, dtype=np.float32) + bump)
            f.create_dataset("y", data=np.int64(3))
    proc = _parity("diff", plain_a, plain_g)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "plain HDF5" in proc.stdout and "bitwise (GOLDEN records no classes)" in proc.stdout
    with h5py.File(plain_a, "r+") as f:
        f["group/x"][2] = 7.0  # pyright: ignore[reportIndexIssue]
    proc = _parity("diff", plain_a, plain_g)
    assert proc.returncode == 1
    assert "group.x [bitwise, fail]" in proc.stdout
    # A plain ACTUAL against a parity GOLDEN: the golden's classes still apply.
    with h5py.File(plain_a, "w") as f:
        for key, value in _arrays().items():
            f.create_dataset(key.replace(".", "/"), data=value)
    assert _parity("diff", plain_a, golden).returncode == 0


# --------------------------------------------------------------------------- unusable input


@pytest.mark.parametrize("which", ["ACTUAL", "GOLDEN"])
def test_a_missing_file_exits_2_with_one_line(tmp_path: Path, golden: Path, which: str) -> None:
    nope = tmp_path / "nope.h5"
    args = (nope, golden) if which == "ACTUAL" else (golden, nope)
    line = _assert_unusable(_parity("diff", *args), which, str(nope), "does not exist")
    if which == "GOLDEN":
        assert "parity repin" in line
    _assert_unusable(_parity("show", nope), "does not exist")


def test_a_truncated_file_exits_2(tmp_path: Path, golden: Path) -> None:
    path = write_goldens(tmp_path / "big.h5", {"a": np.arange(50_000, dtype=np.float64)})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _assert_unusable(_parity("diff", path, golden), "ACTUAL", "truncated")
    _assert_unusable(_parity("show", path), "truncated")
    not_hdf5 = tmp_path / "text.h5"
    not_hdf5.write_text("not hdf5\n")
    _assert_unusable(_parity("diff", golden, not_hdf5), "GOLDEN", "not a readable HDF5 file")


def test_a_flipped_byte_exits_2_naming_the_checksum(tmp_path: Path, golden: Path) -> None:
    actual = _write(tmp_path / "actual.h5", _arrays())
    flip_stored_byte(golden, "weights/w/%value", 9, 0x10)
    _assert_unusable(_parity("diff", actual, golden), "GOLDEN", "'weights.w'", "sha256")
    # show reads no data unless asked to verify it.
    assert _parity("show", golden).returncode == 0
    _assert_unusable(_parity("show", golden, "--verify"), "'weights.w'", "corrupt")


def test_a_file_with_an_external_link_exits_2(tmp_path: Path, golden: Path) -> None:
    linked = tmp_path / "linked.h5"
    with h5py.File(linked, "w") as f:
        f["local"] = np.zeros(2)
        f["far"] = h5py.ExternalLink(str(golden), "/loss/%value")
    _assert_unusable(_parity("diff", golden, linked), "GOLDEN", "external link 'far'")


def test_an_unknown_class_exits_2_listing_the_known_ones(golden: Path) -> None:
    _assert_unusable(
        _parity("diff", golden, golden, "--class", "fp32_reasoc"),
        "'fp32_reasoc'",
        "fp32_reassoc",
        "bitwise",
    )


def test_strings_parity_cannot_compare_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "strings.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("names", data=np.array([b"a", b"b"]))
    _assert_unusable(_parity("diff", path, path), "'names'", "cannot compare")


# --------------------------------------------------------------------------- outputs


def test_show_json_has_provenance_class_map_and_arrays(golden: Path, tmp_path: Path) -> None:
    proc = _parity("show", golden, "--json", "-")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["provenance"] == {"jax": "0.0.test", "base_sha": "f" * 40}
    assert doc["class_map"] == json.loads(_CMAP.to_json())
    arrays = {a["key"]: a for a in doc["arrays"]}
    assert list(arrays) == sorted(_arrays())
    assert arrays["taps.layers.0"] == {
        "key": "taps.layers.0",
        "shape": [4, 12, 32],
        "dtype": "float32",
        "class": "fp32_reassoc",
        "order": 1,
    }
    assert arrays["loss"]["shape"] == [] and arrays["loss"]["class"] == "bitwise"

    plain = tmp_path / "plain.h5"
    with h5py.File(plain, "w") as f:
        f.create_dataset("a/b", data=np.zeros((2, 3), np.int16))
    doc = json.loads(_parity("show", plain, "--json", "-").stdout)
    assert doc["provenance"] == {} and doc["class_map"] is None
    assert doc["arrays"] == [
        {"key": "a.b", "shape": [2, 3], "dtype": "int16", "class": "bitwise", "order": -1}
    ]


def test_show_text_lists_provenance_map_and_every_array(golden: Path) -> None:
    proc = _parity("show", golden)
    assert proc.returncode == 0
    out = proc.stdout
    assert "parity schema 2, 4 arrays" in out and "0.0.test" in out
    assert "taps.*  ->  fp32_reassoc" in out
    for key in _arrays():
        assert key in out


def test_show_says_an_unmatched_key_falls_back_as_the_check_does(tmp_path: Path) -> None:
    # A map without a default: parity check gives "loss" and "weights.w" the class recorded
    # with the array (none here), then bitwise; show must not call that an error.
    cmap = ClassMap((("taps.*", "fp32_reassoc"),))
    arrays = _arrays()
    path = write_goldens(
        tmp_path / "g.h5",
        arrays,
        classes={k: "fp32_reassoc" for k in arrays if k.startswith("taps.")},
        class_map_json=cmap.to_json(),
    )
    out = _parity("show", path).stdout
    default = next(ln for ln in out.splitlines() if ln.strip().startswith("default"))
    assert "error" not in default and "bitwise" in default, default
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.startswith("  loss")}
    assert rows["loss"][3] == "bitwise"
    diff = _parity("diff", path, path)
    assert diff.returncode == 0 and "bitwise" in diff.stdout, diff.stdout + diff.stderr


def test_diff_json_and_html_reports(tmp_path: Path, golden: Path) -> None:
    arrays = _arrays()
    arrays["loss"] = np.asarray(np.float32(np.nan))
    actual = _write(tmp_path / "actual.h5", arrays)
    out_json, out_html = tmp_path / "r.json", tmp_path / "html"
    proc = _parity("diff", actual, golden, "--json", out_json, "--report", out_html)
    assert proc.returncode == 1
    doc = json.loads(out_json.read_text())
    assert doc["verdict"] == "fail"
    findings = {f["key"]: f for f in doc["findings"]}
    assert set(findings) == set(arrays)
    for f in findings.values():
        assert {"key", "class", "verdict", "max_abs", "max_ulp"} <= set(f)
    assert findings["loss"]["verdict"] == "fail"
    assert findings["taps.layers.0"] == findings["taps.layers.0"] | {
        "class": "fp32_reassoc",
        "verdict": "pass",
        "max_abs": 0.0,
        "max_ulp": 0,
    }
    index = out_html / "index.html"
    assert index.is_file() and "loss" in index.read_text()


def test_help_explains_commands_and_exit_codes() -> None:
    proc = _parity("--help")
    assert proc.returncode == 0
    assert "diff" in proc.stdout and "show" in proc.stdout and "exit codes" in proc.stdout
    proc = _parity("diff", "--help")
    assert proc.returncode == 0 and "--class NAME" in proc.stdout
    assert _parity().returncode == 2  # no command: argparse's usage error


def test_help_lists_every_subcommand_and_every_tool_parity_key() -> None:
    from parity._cli import build_parser
    from parity.machinery._config import KEYS

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = _parity("--help").stdout
    overview = text.split("positional arguments:")[0]
    for name in sub.choices:
        assert f"  parity {name}" in overview, (name, overview)
    listing = " ".join(overview.split("[tool.parity]", 1)[1].split(";")[0].split())
    for key in KEYS:
        assert key in listing, (key, listing)


def test_version_is_the_installed_distribution_s_and_the_package_agrees() -> None:
    import tomllib
    from importlib import metadata

    import parity

    proc = _parity("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"parity {metadata.version('parity-harness')}"
    # The fallback of an uninstalled source tree: kept equal to pyproject.toml's version.
    pyproject = Path(__file__).parents[2] / "pyproject.toml"
    assert parity.__version__ == tomllib.loads(pyproject.read_text())["project"]["version"]


def test_the_cli_does_not_import_jax(tmp_path: Path, golden: Path) -> None:
    actual = _write(tmp_path / "actual.h5", _arrays())
    script = (
        "import runpy, sys\n"
        f"sys.argv = ['parity', 'diff', {str(actual)!r}, {str(golden)!r}, "
        f"'--json', {str(tmp_path / 'r.json')!r}, '--report', {str(tmp_path / 'h')!r}]\n"
        "try:\n"
        "    runpy.run_module('parity', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith(('jax.', 'jaxlib'))))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


# What a fresh process running `parity._cli.main(argv)` imported: exit code, then the names.
_IMPORTS_AFTER = (
    "import json, sys\n"
    "from parity._cli import main\n"
    "code = main(json.loads(sys.argv[1]))\n"
    "print(json.dumps([code, sorted(m for m in ('ml_dtypes', 'jax') if m in sys.modules)]))\n"
)


def _in_fresh_process(script: str, argv: tuple[str | Path, ...]) -> tuple[int, list[str], str]:
    """Run `script` (`_IMPORTS_AFTER` or `_LOADED_AFTER`) on `argv` in a fresh process;
    **returns** the exit code and the names of its last line, and the output before it."""
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps([str(a) for a in argv])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    *shown, last = proc.stdout.strip().splitlines()
    code, loaded = json.loads(last)
    return code, loaded, "\n".join(shown)


def _imports_after(*argv: str | Path) -> tuple[int, list[str], str]:
    """Run `parity._cli.main(argv)` in a fresh process; **returns** its exit code, which of
    ml_dtypes and jax it had imported by the end, and its output."""
    return _in_fresh_process(_IMPORTS_AFTER, argv)


def test_show_and_diff_of_float32_files_import_neither_ml_dtypes_nor_jax(
    tmp_path: Path, golden: Path
) -> None:
    # ml_dtypes 0.7.0 takes 0.5 s or more to import: more than the rest of a small diff.
    actual = _write(tmp_path / "actual.h5", _arrays())
    assert _imports_after("show", golden)[:2] == (0, [])
    assert _imports_after("show", "--verify", golden)[:2] == (0, [])
    assert _imports_after("diff", actual, golden)[:2] == (0, [])
    plain_a, plain_g = tmp_path / "plain_a.h5", tmp_path / "plain_g.h5"
    for path in (plain_a, plain_g):
        with h5py.File(path, "w") as f:
            for key, value in _arrays().items():
                f.create_dataset(key.replace(".", "/"), data=value)
    assert _imports_after("diff", plain_a, plain_g)[:2] == (0, [])


# What a fresh process running `parity._cli.main(argv)` had imported by the end, every name.
_LOADED_AFTER = (
    "import json, sys\n"
    "from parity._cli import main\n"
    "code = main(json.loads(sys.argv[1]))\n"
    "print(json.dumps([code, sorted(sys.modules)]))\n"
)

#: What no command that reads files needs: the producers' machinery (the baseline's builder,
#: produce-then-check, the launcher, the calibration room), jax, and the installed
#: distribution's metadata (`--version` reads it, when asked).
_NOT_FOR_READING = (
    "jax",
    "parity.run._baseline",
    "parity.run._produced",
    "parity.machinery._launcher",
    "parity.calibration._calibrate",
    "importlib.metadata",
)


def _loaded_after(*argv: str | Path) -> tuple[int, set[str]]:
    code, loaded, _ = _in_fresh_process(_LOADED_AFTER, argv)
    return code, set(loaded)


@pytest.mark.parametrize("command", ["diff", "show"])
def test_a_command_imports_its_own_module_and_no_other_command_s(
    tmp_path: Path, golden: Path, command: str
) -> None:
    from parity._cli import COMMANDS

    actual = _write(tmp_path / "actual.h5", _arrays())
    argv = ("diff", actual, golden) if command == "diff" else ("show", golden)
    code, loaded = _loaded_after(*argv)
    assert code == 0
    assert f"parity.commands._{command}" in loaded and "parity.store._reader" in loaded
    others = {c.module for c in COMMANDS if c.name != command}
    assert sorted(others & loaded) == []
    assert sorted(loaded.intersection(_NOT_FOR_READING)) == []


#: What a `diff` of two files pinned in one environment runs without, beyond
#: `_NOT_FOR_READING`: all of `parity.run` (`[tool.parity]` is read only where the two
#: environments differ, for the project's drift policy), the store's writer and the
#: provenance it collects, the JSON and HTML writers (loaded for `--json` and `--report`:
#: the report session it prints through imports them only to write) and `difflib` (the
#: suggestion for a misspelt class), and `shutil` (argparse's own formatter imports it, and
#: its compression modules, for the terminal's width: `parity.commands._formatter.Formatter`
#: reads it without). A small diff's start-up is mostly imports (`tools/bench_startup.py`).
_NOT_FOR_A_DIFF = (
    "parity.run",
    "parity.store._writer",
    "parity.store._provenance",
    "parity.report._html",
    "parity.report._jsondoc",
    "difflib",
    "shutil",
)


def _of(loaded: set[str], packages: Sequence[str]) -> list[str]:
    """The modules of `loaded` that are one of `packages` or inside one."""
    return sorted(m for m in loaded if any(m == p or m.startswith(p + ".") for p in packages))


@pytest.mark.parametrize("columns", [None, "63", "0", "wide"])
def test_the_help_is_as_wide_as_argparse_would_make_it(
    monkeypatch: pytest.MonkeyPatch, columns: str | None
) -> None:
    import shutil

    from parity.commands._formatter import Formatter, columns as read_columns

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert read_columns() == shutil.get_terminal_size().columns
    ours = argparse.ArgumentParser(prog="p", formatter_class=Formatter, description="a\n b")
    theirs = argparse.ArgumentParser(
        prog="p", formatter_class=argparse.RawDescriptionHelpFormatter, description="a\n b"
    )
    for p in (ours, theirs):
        p.add_argument("--flag", help="word " * 40)
    assert ours.format_help() == theirs.format_help()


def test_a_diff_loads_neither_the_run_layer_nor_the_writers_nor_the_reports_it_skips(
    tmp_path: Path, golden: Path
) -> None:
    changed = _arrays()
    changed["weights.w"][0, 0] += 1  # a bitwise key fails: exit 1, the failure reported
    actual = _write(tmp_path / "actual.h5", changed)
    for argv, expected in (((actual, golden), 1), ((golden, golden), 0)):
        code, loaded = _loaded_after("diff", *argv)
        assert code == expected
        assert "parity.check" in loaded and "parity.commands._diff" in loaded
        assert _of(loaded, (*_NOT_FOR_READING, *_NOT_FOR_A_DIFF)) == []
    # The reports load where they are asked for, and only the ones asked for.
    code, loaded = _loaded_after("diff", actual, golden, "--json", tmp_path / "r.json")
    assert (code, (tmp_path / "r.json").is_file()) == (1, True)
    assert _of(loaded, _NOT_FOR_A_DIFF) == ["parity.report._jsondoc"]
    code, loaded = _loaded_after("diff", actual, golden, "--report", tmp_path / "report")
    assert (code, (tmp_path / "report" / "index.html").is_file()) == (1, True)
    assert {"parity.report._html", "parity.report._jsondoc"} <= loaded  # and what its plots need


#: `python -m parity` in a fresh process, with what an `atexit` handler sees: whether the
#: collector's objects were frozen when `main` returned in-process, and at the exit.
_FROZEN_AT_EXIT = (
    "import atexit, gc, json, runpy, sys\n"
    "from parity._cli import main\n"
    "argv = json.loads(sys.argv[1])\n"
    "in_process = main(argv), gc.get_freeze_count()\n"
    "atexit.register(lambda: print(json.dumps(\n"
    "    [*in_process, gc.get_freeze_count(), gc.get_threshold()[0]])))\n"
    "sys.argv = ['parity', *argv]\n"
    "runpy.run_module('parity', run_name='__main__')\n"
)


def test_the_entry_point_exits_with_main_s_code_and_the_collector_frozen(
    tmp_path: Path, golden: Path
) -> None:
    # Frozen, the interpreter's shutdown skips its full collections: ~15 ms of a small
    # diff's start-up (`tools/bench_startup.py`); a higher threshold of the youngest
    # generation spares the collections during its imports. `main` alone leaves the
    # collector be.
    changed = _arrays()
    changed["weights.w"][0, 0] += 1
    actual = _write(tmp_path / "actual.h5", changed)
    for argv, expected in ((("diff", golden, golden), 0), (("diff", actual, golden), 1)):
        proc = subprocess.run(
            [sys.executable, "-c", _FROZEN_AT_EXIT, json.dumps([str(a) for a in argv])],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == expected, proc.stdout + proc.stderr
        code, frozen_in_process, frozen_at_exit, youngest = json.loads(proc.stdout.splitlines()[-1])
        assert (code, frozen_in_process) == (expected, 0)
        assert frozen_at_exit > 0
        assert youngest > 700  # collected in larger batches than Python's default


def test_the_overview_imports_no_command_and_lists_every_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from parity._cli import COMMANDS, build_parser, main

    code, loaded = _loaded_after("--help")
    assert code == 0
    assert sorted(loaded & {c.module for c in COMMANDS}) == []
    # The overview and each command's help read as with the whole tree built.
    assert main(["--help"]) == 0
    assert capsys.readouterr().out == build_parser().format_help()
    whole = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    listed = {a.dest: a.help for a in whole._choices_actions}
    assert listed == {c.name: c.help for c in COMMANDS}
    for command in COMMANDS:
        assert main([command.name, "--help"]) == 0
        assert capsys.readouterr().out == whole.choices[command.name].format_help()


def test_a_bfloat16_file_still_shows_and_diffs_by_the_ulp(tmp_path: Path) -> None:
    import ml_dtypes

    g = np.linspace(-2, 2, 48, dtype=np.float32).reshape(4, 12).astype(ml_dtypes.bfloat16)
    a = g.copy()
    a.view(np.uint16)[1, 3] += 2  # two bfloat16 ulps at (1, 3)
    golden = write_goldens(tmp_path / "g.h5", {"x": g, "f": np.float32(1)})
    actual = write_goldens(tmp_path / "a.h5", {"x": a, "f": np.float32(1)})
    code, loaded, shown = _imports_after("show", "--verify", golden)
    assert code == 0 and loaded == ["ml_dtypes"]  # needed for the dtype, and imported
    assert "bfloat16" in shown and "all verified" in shown
    code, loaded, shown = _imports_after("diff", actual, golden)
    assert code == 1 and loaded == ["ml_dtypes"]
    assert "x [bitwise, fail]" in shown and "max ulp 2" in shown and "(1, 3)" in shown
