"""The edit of the diff that made an origin (issue 74, `parity.origin._edit` over the diff
as data, `parity.origin._hunks`): the diff read from git as a check reads it
(`parity.run._diff.source_diff`), and each kind of evidence (the constant written, a frame
of the chain, the function it runs in, the only edit) held against origins as the
alignment words them. No jax: the origins are written here."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from parity.origin import Localisation, Origin
from parity.origin._edit import Edit, edit_of
from parity.origin._hunks import Diff, Hunk, parse_diff
from parity.run._diff import source_diff

MODEL = """\
EPS = 1e-5
SCALE = 2.0
-- not python, a line that reads like a diff's header once removed


def layer_norm(x):
    m = x.mean()
    return (x - m) / (x.var() + EPS)


def head(x, w):
    y = x @ w
    z = y + 1
    return z.astype("float32")
"""

EDITED = (
    MODEL.replace("EPS = 1e-5", "EPS = 1.1e-5")
    .replace("    y = x @ w\n", "    y = x @ w\n    y = y * SCALE\n")
    .replace('    return z.astype("float32")\n', "    return z\n")
    .replace("-- not python, a line that reads like a diff's header once removed\n", "")
)


def _origin(line: int, function: str, **fields: object) -> Origin:
    origin = Origin(
        key="logits", primitive="add", file="model.py", line=line, function=function,
        shape=(4,), dtype="float32", input_shapes=((4,),), max_diff=0.1,
        matched_fraction=0.5, position=3, rho=0.0,
        chain=(f"model.py:{line} in {function}", "producers.py:9 in forward"),
    )  # fmt: skip
    return dataclasses.replace(origin, **fields)  # type: ignore[arg-type]


def _line(text: str, needle: str) -> int:
    return next(n for n, t in enumerate(text.splitlines(), 1) if needle in t)


def _diff(tmp_path: Path, git: Callable[..., str]) -> tuple[Diff, str]:
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "model.py").write_text(MODEL)
    (repo / "notes.txt").write_text("notes\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "the model")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "model.py").write_text(EDITED)  # not committed: the working tree is the tree
    (repo / "notes.txt").write_text("other notes\n")  # not Python: not a source
    diff = source_diff(repo, base)
    assert diff is not None
    # Read, never written: both edits are still the working tree's, neither staged.
    assert git(repo, "status", "--porcelain").split() == ["M", "model.py", "M", "notes.txt"]
    return diff, base


def test_the_diff_is_git_s_hunks_of_the_sources_with_the_tree_s_text(
    tmp_path: Path, git: Callable[..., str]
) -> None:
    diff, base = _diff(tmp_path, git)
    assert diff.between == f"the base {base[:12]} and the working tree"
    assert diff.sources == {"model.py": EDITED}
    eps, gone, scale, cast = diff.hunks
    assert (eps.file, eps.start, eps.added, eps.removed) == (
        "model.py", 1, ("EPS = 1.1e-5",), ("EPS = 1e-5",),
    )  # fmt: skip
    assert scale.added == ("    y = y * SCALE",) and not scale.removed
    assert scale.start == _line(EDITED, "y * SCALE")
    assert cast.added == ("    return z",) and cast.base_start == _line(MODEL, "astype")
    # A removed line that begins `-- ` is a line of the hunk, never a file's header.
    assert gone.removed == ("-- not python, a line that reads like a diff's header once removed",)
    assert not gone.added and gone.place == f"model.py:{_line(MODEL, 'not python')}"
    assert parse_diff("") == ()


def test_each_kind_of_evidence_names_its_hunk(tmp_path: Path, git: Callable[..., str]) -> None:
    diff, _ = _diff(tmp_path, git)
    eps, _, scale, cast = diff.hunks
    use = _line(EDITED, "x.var() + EPS")
    # The constant: set at the top of the file, used in layer_norm; named where it is set.
    edit = edit_of(_origin(use, "layer_norm", constants=("1.1e-05", "1e-05")), diff)
    assert (edit.evidence, edit.hunks) == ("constant", (eps,)), edit
    assert edit.line == (
        "the edit: model.py:1 `EPS = 1.1e-5`: it writes the constant 1.1e-05, where the "
        "base's lines wrote 1e-05"
    )
    # A frame: the step added runs on the line the hunk wrote.
    added = _line(EDITED, "y * SCALE")
    edit = edit_of(_origin(added, "head", primitive="mul"), diff)
    assert (edit.evidence, edit.hunks) == ("frame", (scale,)), edit
    assert f"it holds model.py:{added} in head" in edit.line
    # The base's frame: a cast the tree no longer makes, on a line the hunk removed.
    base_cast = f"model.py:{_line(MODEL, 'astype')} in head"
    edit = edit_of(_origin(99, "elsewhere", chain=(), base_places=(base_cast,)), diff)
    assert (edit.evidence, edit.hunks) == ("frame", (cast,)), edit
    assert f"it holds the base's line {base_cast}" in edit.line
    # A function: the origin is at head's first line, the hunks below it in head.
    first = _line(EDITED, "y = x @ w")
    edit = edit_of(_origin(first, "head", primitive="dot_general"), diff)
    assert edit.evidence == "function" and edit.hunks == (scale, cast), edit
    assert edit.line.startswith("the edit: one of 2 hunks that lie in a function"), edit.line
    # None: another constant, in a function no hunk touches.
    edit = edit_of(_origin(_line(EDITED, "m = x.mean()"), "layer_norm", constants=("3.0",)), diff)
    assert edit.evidence == "none" and not edit.hunks
    assert "none of the 4 hunks" in edit.line and "no edit of the diff sets it" in edit.line
    # The only edit, when nothing else can be said; and no edit where the sources agree.
    only = Diff((eps,), diff.sources, diff.between)
    assert edit_of(_origin(3, "elsewhere", chain=()), only).evidence == "only"
    same = edit_of(_origin(3, "elsewhere"), Diff((), {}, "the base and the tree"))
    assert same.line.startswith("the edit: none: the source does not differ"), same.line


def test_an_integer_alone_is_no_evidence_but_with_the_base_s_it_is(
    tmp_path: Path, git: Callable[..., str]
) -> None:
    diff, _ = _diff(tmp_path, git)
    hunk = dataclasses.replace(diff.hunks[2], added=("    y = y * 2",), removed=())
    two = Diff((hunk, diff.hunks[0]), diff.sources)
    elsewhere = _origin(3, "elsewhere", chain=())
    assert edit_of(dataclasses.replace(elsewhere, constants=("2",)), two).evidence == "none"
    both = dataclasses.replace(hunk, removed=("    y = y * 3",))
    found = edit_of(dataclasses.replace(elsewhere, constants=("2", "3")), Diff((both,)))
    assert found.evidence == "constant"


def test_a_hunk_where_the_origin_runs_ranks_before_one_elsewhere_writing_the_same(
    tmp_path: Path, git: Callable[..., str]
) -> None:
    """A new test file that writes the same number is not the edit, where a hunk of the
    origin's own files writes it; where none does, it is the one that can be named."""
    diff, _ = _diff(tmp_path, git)
    stray = Hunk("tests/test_new.py", 1, ("TOL = 1.1e-5",), "", 0, ())
    origin = _origin(_line(EDITED, "x.var() + EPS"), "layer_norm", constants=("1.1e-05", "1e-05"))
    edit = edit_of(origin, Diff((stray, *diff.hunks), diff.sources))
    assert edit.hunks == (diff.hunks[0],) and edit.evidence == "constant", edit.line
    away = edit_of(dataclasses.replace(origin, file="other.py", chain=()), Diff((stray,)))
    assert away.hunks == (stray,) and away.evidence == "constant", away.line


def test_the_edit_goes_through_the_origin_s_json_and_its_line(
    tmp_path: Path, git: Callable[..., str]
) -> None:
    diff, _ = _diff(tmp_path, git)
    origin = _origin(7, "layer_norm", constants=("1.1e-05", "1e-05"))
    found = Localisation("named", origin=origin, key="logits", edit=edit_of(origin, diff))
    assert found.line.endswith("; the edit: model.py:1 `EPS = 1.1e-5`: it writes the constant "
                               "1.1e-05, where the base's lines wrote 1e-05")  # fmt: skip
    back = Localisation.from_dict(json.loads(json.dumps(found.to_dict())))
    assert back == found
    assert found.json_origin()["edit"]["hunks"][0]["start"] == 1  # type: ignore[index]
    assert Edit.from_dict(json.loads(json.dumps(found.edit.to_dict()))) == found.edit  # type: ignore[union-attr]
