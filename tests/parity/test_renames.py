"""Keys renamed as one (issue 60, item 2): a module moved renames every key under it and no
number moved; one rename rule compares them, a failure without it says which new key seems
to replace a missing one, and a key that is truly gone stays a failure."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import parity
from parity.judge._renames import Rename, parse_renames, renamed, renaming_offer

W = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
B = np.zeros(3, np.float32)


def test_rules_parse_both_forms_and_refuse_what_they_cannot_mean() -> None:
    assert parse_renames("encoder=backbone") == (Rename("encoder", "backbone"),)
    assert parse_renames([("a.b", "a.c")]) == (Rename("a.b", "a.c"),)
    for bad in ("encoder", "=backbone", "encoder= backbone", [("a",)]):
        with pytest.raises(ValueError, match="expected 'old=new'"):
            parse_renames(bad)  # type: ignore[arg-type]


def test_a_moved_key_takes_the_name_the_expected_side_holds() -> None:
    rules = parse_renames("model.encoder=model.backbone")
    tree = {"model.backbone.w": W, "model.backbone.b": B, "model.head": B}
    expected = {"model.encoder.w": W, "model.encoder.b": B, "model.head": B}
    out = renamed(tree, expected, rules)
    assert sorted(out) == sorted(expected)
    assert out["model.encoder.w"] is W and out["model.encoder.b"] is B  # the tree's values
    # a key the expected side does not hold under the old name keeps its own
    assert renamed({"model.backbone.extra": B}, expected, rules).keys() == {"model.backbone.extra"}


def test_the_offer_pairs_keys_of_one_shape_by_their_trailing_segments() -> None:
    missing = {"m.encoder.0.w": ((2, 3), "float32"), "m.gone": ((5,), "float32")}
    new = {"m.backbone.0.w": ((2, 3), "float32"), "m.other.w": ((2, 3), "float32")}
    assert renaming_offer(missing, new) == {
        "m.encoder.0.w": ("m.encoder", "m.backbone", "m.backbone.0.w")
    }
    # another dtype is another array: no offer
    assert renaming_offer(missing, {"m.backbone.0.w": ((2, 3), "float16")}) == {}


def test_assert_equivalent_compares_a_moved_module_as_one_and_offers_the_rule() -> None:
    old = {"encoder": {"w": W, "b": B}, "head": B}
    new = {"backbone": {"w": W, "b": B}, "head": B}
    done = parity.assert_equivalent(new, old, rename="encoder=backbone")
    assert sorted(f.key for f in done.findings) == ["encoder.b", "encoder.w", "head"]
    with pytest.raises(AssertionError) as undeclared:
        parity.assert_equivalent(new, old)
    said = str(undeclared.value)
    assert "the new key 'backbone.w' (its shape and dtype) seems to replace it" in said
    assert "rename = ['encoder=backbone']" in said
    # a value that moved under the new name fails under the old one
    moved = {"backbone": {"w": W + 1e-3, "b": B}, "head": B}
    with pytest.raises(AssertionError, match=r"encoder\.w \[bitwise, fail\]"):
        parity.assert_equivalent(moved, old, rename="encoder=backbone")


def test_a_key_truly_gone_stays_a_failure_with_no_offer() -> None:
    old = {"encoder": {"w": W}, "dropout_mask": np.ones(7, np.float32)}
    new = {"encoder": {"w": W}}
    with pytest.raises(AssertionError) as gone:
        parity.assert_equivalent(new, old, rename="encoder=backbone")
    assert "dropout_mask [bitwise, missing]" in str(gone.value)
    assert "seems to replace" not in str(gone.value)


def test_parity_diff_takes_rename_rules(tmp_path: Path) -> None:
    from parity.commands._diff import run_diff
    from parity.store import write_goldens

    golden = write_goldens(tmp_path / "g.h5", {"encoder.w": W, "head": B})
    actual = write_goldens(tmp_path / "a.h5", {"backbone.w": W, "head": B})
    assert run_diff(actual, golden, rename=["encoder=backbone"]).exit_code == 0
    assert run_diff(actual, golden).exit_code == 1


MODEL = """\
import numpy as np


def params():
    w = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    return {"encoder": {"w": w, "b": np.zeros(3, np.float32)}}
"""
PRODUCERS = """\
import model

GROUPS = {"g": lambda: {"params": model.params()}}
"""


def test_parity_check_takes_the_producers_rename(tmp_path: Path, git_project, git, run_parity):
    repo = git_project(tmp_path, PRODUCERS, files={"src/model.py": MODEL}, pin=("--groups", "g"))
    (repo / "src" / "model.py").write_text(MODEL.replace('"encoder"', '"backbone"'))
    git(repo, "commit", "-qam", "the encoder is the backbone now")
    undeclared = run_parity(repo, "check")
    assert undeclared.returncode == 1
    assert "rename = ['params.encoder=params.backbone']" in undeclared.stdout, undeclared.stdout
    (repo / "producers.py").write_text(
        PRODUCERS + 'RENAME = [("params.encoder", "params.backbone")]\n'
    )
    report = tmp_path / "check.json"
    done = run_parity(repo, "check", "--json", str(report))
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(report.read_text())["findings"]
    assert sorted((f["key"], f["verdict"]) for f in found) == [
        ("g/params.encoder.b", "pass"),
        ("g/params.encoder.w", "pass"),
    ]
