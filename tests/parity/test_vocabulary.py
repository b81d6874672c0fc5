"""One vocabulary (docs/design.md, "Vocabulary"): the same flag for the same idea on every
subcommand, with the same help text; no old spelling kept beside it (none has shipped); the
settings of the command line and the plugin read by one path (`parity.machinery._config`),
environment variables included."""

from __future__ import annotations

import argparse
import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import parity
from parity._cli import build_parser, main
from parity.commands._common import overrides_of
from parity.machinery._config import ConfigError, load_config
from parity.store import Provenance, write_goldens

# --------------------------------------------------------------------------- the words


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    """Every (sub)subcommand's parser by its name: `check`, `baseline build`, ..."""
    out: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    out[f"{prefix}{name}"] = sub
                    walk(sub, f"{prefix}{name} ")

    walk(build_parser(), "")
    return out


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings if s.startswith("--")}


def test_a_flag_means_one_thing_with_one_help_text_on_every_subcommand() -> None:
    seen: dict[str, tuple[str, str | None, str | None]] = {}
    for command, parser in _subcommands().items():
        for flag, action in _flags(parser).items():
            if flag in ("--help", "--base") or action.help == argparse.SUPPRESS:
                continue  # `--base`: repin's commit to pin at, baseline clear's filter
            if flag == "--groups":
                continue  # "producer" or "golden" groups, by what the command reads
            if flag == "--json":  # what it writes is the command's: the words are the same
                assert action.metavar == "FILE", command
                assert re.match(r"write .+ as JSON to FILE", action.help or ""), command
                continue
            here = (command, action.metavar, action.help)
            first = seen.setdefault(flag, here)
            assert (first[1], first[2]) == here[1:], (flag, first, here)


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        ("check", {"--goldens", "--json", "--report", "--class", "--override", "--drift"}),
        ("diff", {"--json", "--report", "--class", "--override", "--drift"}),
        ("bisect", {"--json", "--class", "--override"}),
        ("calibrate", {"--goldens", "--json", "--class", "--override"}),
        ("repin", {"--goldens", "--recover"}),
        ("show", {"--json"}),
        ("baseline build", {"--goldens"}),
    ],
)
def test_every_subcommand_has_the_words_of_what_it_does(command: str, flags: set[str]) -> None:
    assert flags <= set(_flags(_subcommands()[command]))


def test_no_subcommand_spells_the_old_words_in_its_help() -> None:
    for command, parser in _subcommands().items():
        text = parser.format_help()
        for old in ("--out ", "--html", "--parity-cache"):
            assert old not in text, (command, old)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["repin", "--base", "HEAD", "--out", "x"], "unrecognized arguments: --out x"),
        (["diff", "a.h5", "g.h5", "--html", "x"], "unrecognized arguments: --html x"),
        (["show", "g.h5", "--json"], "argument --json: expected one argument"),
    ],
)
def test_an_old_spelling_is_a_usage_error(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`repin --out`, `diff --html` and a bare `show --json` never shipped: argparse refuses
    them as it refuses any unknown word, exit 2, before a file is read."""
    assert main(argv) == 2
    assert said in capsys.readouterr().err


def test_repin_goldens_names_the_golden_folder() -> None:
    args = build_parser().parse_args(["repin", "--base", "HEAD", "--goldens", "elsewhere"])
    assert args.goldens == "elsewhere"


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.int32)}
    golden = write_goldens(tmp_path / "golden.h5", arrays, provenance=Provenance(base_sha="f" * 40))
    actual = write_goldens(tmp_path / "actual.h5", arrays)
    return actual, golden


def test_diff_report_writes_text_json_and_html(
    tmp_path: Path, files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    actual, golden = files
    folder = tmp_path / "report"
    assert main(["diff", str(actual), str(golden), "--report", str(folder)]) == 0
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) >= [
        "index.html",
        "report.json",
        "report.txt",
    ]
    assert json.loads((folder / "report.json").read_text())["verdict"] == "pass"
    assert "a" in (folder / "report.txt").read_text()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("mode", "code"), [("warn", 0), ("relax", 0), ("strict", 2)])
def test_diff_drift_is_the_checks_policy_over_actuals_environment(
    tmp_path: Path, mode: str, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """A diff is a check of ACTUAL's arrays in ACTUAL's environment: a difference that can
    move bits (here jaxlib) is named under `warn`, relaxes bitwise under `relax` and refuses
    the comparison under `strict`, as `parity check --drift` does."""
    arrays = {"a": np.arange(4, dtype=np.float32)}
    golden = write_goldens(tmp_path / "g.h5", arrays, provenance=Provenance(jaxlib="0.4.30"))
    actual = write_goldens(tmp_path / "a.h5", arrays, provenance=Provenance(jaxlib="0.4.31"))
    assert main(["diff", str(actual), str(golden), "--drift", mode]) == code
    captured = capsys.readouterr()
    said = captured.out if code == 0 else captured.err
    assert "jaxlib: '0.4.30' -> '0.4.31'" in said
    assert ("'strict' refuses" in said) == (mode == "strict")
    assert ("checked as ulp" in said) == (mode == "relax")


def test_show_json_dash_prints_the_json(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    golden = str(files[1])
    assert main(["show", golden, "--json", "-"]) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out)["path"] == golden
    assert printed.err == ""


def test_show_json_file_writes_the_file(
    tmp_path: Path, files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "shown.json"
    assert main(["show", str(files[1]), "--json", str(target)]) == 0
    assert json.loads(target.read_text())["path"] == str(files[1])
    printed = capsys.readouterr()
    assert printed.out == f"JSON written to {target}\n" and printed.err == ""


@pytest.mark.parametrize("argv", [["show"], ["show", "--json", "g.h5"]])
def test_show_without_golden_is_a_usage_error_naming_it(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert "the following arguments are required: GOLDEN" in capsys.readouterr().err


# --------------------------------------------------------------------------- --class


def test_class_is_the_rule_every_key_after_the_overrides_where_the_core_takes_rules() -> None:
    args = build_parser().parse_args(
        ["bisect", "A", "B", "--override", "x.*=fp32_reassoc", "--class", "device_count"]
    )
    assert overrides_of(args) == [("x.*", "fp32_reassoc")]
    assert overrides_of(args, with_class=True) == [
        ("x.*", "fp32_reassoc"),
        ("*", "device_count"),
    ]


def test_an_unknown_class_is_a_one_line_error_naming_the_known_ones(
    capsys: pytest.CaptureFixture[str], files: tuple[Path, Path]
) -> None:
    assert main(["diff", str(files[0]), str(files[1]), "--class", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("parity: error: --class names the unknown tolerance class 'nope'")
    assert "bitwise" in err and err.count("\n") == 1


# --------------------------------------------------------------------------- settings


def _project(tmp_path: Path, table: str = "") -> Path:
    (tmp_path / "pyproject.toml").write_text(f"[tool.parity]\n{table}")
    return tmp_path


def test_environment_variables_stand_for_their_keys_over_the_table_under_a_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _project(tmp_path, 'devices = 2\njax_cache = "jc"\ndrift = "relax"\n')
    config = load_config(root)
    assert (config.devices, config.jax_cache, config.drift) == (2, root / "jc", "relax")
    monkeypatch.chdir(root)
    monkeypatch.setenv("PARITY_DEVICES", "4")
    monkeypatch.setenv("PARITY_JAX_CACHE", "none")
    monkeypatch.setenv("PARITY_BASELINE_CACHE", "bases")
    config = load_config(root)
    assert (config.devices, config.jax_cache, config.baseline_cache) == (4, None, root / "bases")
    assert {"devices", "jax_cache", "baseline_cache"} <= config.explicit  # jax_cache "none": off
    assert config.with_overrides(devices=8).devices == 8


def test_a_bad_environment_variable_is_a_config_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARITY_DEVICES", "two")
    with pytest.raises(ConfigError, match=r"^environment PARITY_DEVICES: devices must be"):
        load_config(_project(tmp_path))


def test_drift_is_a_key_with_three_values(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match='drift must be "warn", "relax" or "strict"'):
        load_config(_project(tmp_path, 'drift = "loud"\n'))
    assert load_config(_project(tmp_path)).drift == "warn"


# --------------------------------------------------------------------------- the two sides

SRC = Path(parity.__file__).resolve().parent

#: What a finding's `reference` may say the expected side was.
REFERENCES = frozenset({"golden", "baseline", "expected"})

#: Fields named `reference` that hold another idea than a finding's word, a sentence: a
#: calibration's says what its runs were measured against ("the goldens"), a check header's
#: is the report's `reference` line (`parity.check._against_baseline.reference_line`).
OTHER_REFERENCES = frozenset(
    {("calibration/_calibrate.py", "Calibration"), ("_results.py", "CheckHeader")}
)


def _parsed(folder: Path) -> dict[str, ast.Module]:
    """Every module under `folder`, parsed, by its path relative to `SRC`."""
    return {
        p.relative_to(SRC).as_posix(): ast.parse(p.read_text(), str(p))
        for p in sorted(folder.rglob("*.py"))
    }


def _identifiers(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Every name the code spells, with its line: functions, classes, arguments, assigned
    and read names (a dataclass field's included), attributes (`self.x = ...` included),
    keyword arguments and imported names."""
    for node in ast.walk(tree):
        match node:
            case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name):
                yield node.lineno, name
            case ast.ClassDef(name=name) | ast.arg(arg=name) | ast.Name(id=name):
                yield node.lineno, name
            case ast.Attribute(attr=name) | ast.keyword(arg=str() as name):
                yield node.lineno, name
            case ast.alias(name=name, asname=asname):
                yield node.lineno, name
                if asname is not None:
                    yield node.lineno, asname
            case _:
                pass


def test_the_judge_calls_the_sides_of_a_comparison_actual_and_expected() -> None:
    offenders = [
        f"{path}:{line}: {name}"
        for path, tree in _parsed(SRC / "judge").items()
        for line, name in _identifiers(tree)
        if "golden" in name.lower()
    ]
    assert not offenders, (
        "the judge compares any two trees (a tree and its goldens, the baseline, a live "
        "tree) and calls its sides `actual` and `expected`; which thing the expected side "
        "was is the finding's `reference`. Rename: " + ", ".join(offenders)
    )


def _module_name(path: str) -> str:
    parts = ["parity", *path.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _string_constants(modules: dict[str, ast.Module]) -> dict[str, dict[str, str]]:
    """Per module (`parity.check._against_baseline`), its module-level `NAME = "text"`."""
    out: dict[str, dict[str, str]] = {}
    for path, tree in modules.items():
        names = out.setdefault(_module_name(path), {})
        for node in tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                match targets, node.value:
                    case [ast.Name(id=name)], ast.Constant(value=str() as text):
                        names[name] = text
                    case _:
                        pass
    return out


def _in_scope(path: str, tree: ast.Module, constants: dict[str, dict[str, str]]) -> dict[str, str]:
    """The string constants `tree` may name: its own and those it imports from parity."""
    known = dict(constants[_module_name(path)])
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module in constants:
            theirs = constants[node.module]
            known |= {a.asname or a.name: theirs[a.name] for a in node.names if a.name in theirs}
    return known


def _references(path: str, tree: ast.Module) -> Iterator[ast.expr]:
    """Every `reference=` keyword's value and every default of a parameter or of a class
    field named `reference`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "reference":
            yield node.value
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            a = node.args
            positional = [*a.posonlyargs, *a.args]
            with_default = positional[len(positional) - len(a.defaults) :]
            pairs = [*zip(with_default, a.defaults, strict=True)]
            pairs += [*zip(a.kwonlyargs, a.kw_defaults, strict=True)]
            yield from (d for p, d in pairs if p.arg == "reference" and d is not None)
        elif isinstance(node, ast.ClassDef) and (path, node.name) not in OTHER_REFERENCES:
            for field in node.body:
                match field:
                    case ast.AnnAssign(target=ast.Name(id="reference"), value=ast.expr() as v):
                        yield v
                    case _:
                        pass


def test_a_findings_reference_says_golden_baseline_or_expected() -> None:
    """A string given as `reference=` anywhere in parity, or a `reference` parameter's or
    field's default, is one of the three words; a name bound to a string at module level
    (`BASELINE`, defined there or imported from parity) is read as its string."""
    modules = _parsed(SRC)
    constants = _string_constants(modules)
    offenders = []
    for path, tree in modules.items():
        known = _in_scope(path, tree, constants)
        for value in _references(path, tree):
            match value:
                case ast.Constant(value=str() as word):
                    pass
                case ast.Name(id=name) if name in known:
                    word = known[name]
                case _:
                    continue  # a value computed at run time
            if word not in REFERENCES:
                offenders.append(f"{path}:{value.lineno}: {word!r}")
    assert not offenders, (
        "a finding's `reference` says what the expected side of a comparison was, in the "
        f'words of its messages ("vs golden"): one of {sorted(REFERENCES)}; found '
        + ", ".join(offenders)
    )
