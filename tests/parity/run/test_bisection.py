"""The bisection search: three outcomes per commit, skips never counted as bad, the
search continuing around them; GOOD and BAD confirmed first. Producers are faked here;
tests/tools/test_adopting_guide.py runs the real thing end to end (docs/adopting.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

import parity.run._bisection as bisection
from parity.machinery._config import ParityConfig
from parity.run._bisection import BisectError, Step, bisect


@pytest.fixture
def history(tmp_path: Path, git, git_project) -> tuple[Path, list[str]]:
    """A repository with 8 commits on main."""
    repo = git_project(tmp_path, table=None, files={"f.txt": "0"}, pin=None, message="c0")
    shas = [git(repo, "rev-parse", "HEAD")]
    for i in range(1, 8):
        (repo / "f.txt").write_text(str(i))
        git(repo, "add", "f.txt")
        git(repo, "commit", "-qm", f"c{i}")
        shas.append(git(repo, "rev-parse", "HEAD"))
    (repo / "producers.py").write_text("GROUPS = {}\n")
    return repo, shas


def _run(monkeypatch, repo: Path, shas: list[str], outcomes: dict[int, str], **kw):
    """Bisect shas[0]..shas[-1] where commit i has `outcomes[i]` (default good)."""
    checked: list[int] = []

    def fake_evaluate(root, sha, config, goldens, *, groups, overrides, role):
        i = shas.index(sha)
        checked.append(i)
        outcome = outcomes.get(i, "good")
        extra = {"group": "g", "key": f"k{i}", "class_name": "bitwise"} if outcome == "bad" else {}
        return Step(sha, f"c{i}", outcome, f"commit {i}", role=role, **extra)  # type: ignore[arg-type]

    monkeypatch.setattr(bisection, "repin", lambda *a, **k: None)
    monkeypatch.setattr(bisection, "_evaluate", fake_evaluate)
    config = ParityConfig(root=repo, producers=repo / "producers.py", src=(repo,))
    result = bisect(shas[0], shas[-1], config=config, progress=lambda _: None, **kw)
    return result, checked


def test_finds_the_first_bad_commit_in_log_steps(monkeypatch, history):
    repo, shas = history
    result, checked = _run(monkeypatch, repo, shas, {i: "bad" for i in range(5, 8)})
    assert result.status == "found"
    assert result.first_bad is not None and result.first_bad.sha == shas[5]
    assert result.first_bad.key == "k5"
    assert checked[:2] == [0, 7]  # GOOD, then BAD, confirmed first
    assert len(checked) <= 2 + 3  # 6 candidates between: at most 3 search steps


def test_a_commit_that_cannot_run_is_skipped_not_bad(monkeypatch, history):
    repo, shas = history
    outcomes = {3: "skip", 5: "bad", 6: "bad", 7: "bad"}
    result, _ = _run(monkeypatch, repo, shas, outcomes)
    assert result.status == "found"
    assert result.first_bad is not None and result.first_bad.sha == shas[5]
    assert [s.sha for s in result.skipped] == [shas[3]]  # tried, skipped, searched around
    outcomes = {3: "skip", 4: "skip", 5: "skip", 6: "bad", 7: "bad"}
    result, _ = _run(monkeypatch, repo, shas, outcomes)
    assert result.first_bad is not None and result.first_bad.sha == shas[6]
    assert all(s.outcome == "skip" for s in result.skipped)


def test_skipped_commits_next_to_the_first_bad_leave_it_ambiguous(monkeypatch, history):
    repo, shas = history
    result, _ = _run(monkeypatch, repo, shas, {5: "skip", 6: "bad", 7: "bad"})
    assert result.status == "ambiguous"
    assert result.candidates == (shas[5], shas[6])
    assert result.to_dict()["first_bad_commit"] is None


def test_good_must_pass_and_bad_must_fail(monkeypatch, history):
    repo, shas = history
    result, checked = _run(monkeypatch, repo, shas, {})
    assert (result.status, checked) == ("bad_passes", [0, 7])
    result, checked = _run(monkeypatch, repo, shas, {0: "bad", 7: "bad"})
    assert (result.status, checked) == ("good_fails", [0])
    result, _ = _run(monkeypatch, repo, shas, {7: "skip"})
    assert result.status == "cannot_run"


def test_revisions_that_cannot_be_bisected_are_errors(monkeypatch, history):
    repo, shas = history
    with pytest.raises(BisectError, match="not an ancestor"):
        _run(monkeypatch, repo, [shas[7], shas[0]], {})
    with pytest.raises(BisectError, match="not a commit"):
        _run(monkeypatch, repo, ["no-such-rev", shas[0]], {})


def test_a_commit_lacking_what_the_producers_need_is_named_in_the_skip(tmp_path, git, git_project):
    # Real producers (numpy only): the commit tried lacks the module they import.
    producers = "import numpy as np\nimport tinylib\n\nGROUPS = {'g': lambda: {'x': np.zeros(2)}}\n"
    repo = git_project(tmp_path, producers, table=None, pin=None, message="no tinylib yet")
    (repo / "src").mkdir()  # the src root the config names, empty (git keeps no empty folder)
    sha = git(repo, "rev-parse", "HEAD")
    config = ParityConfig(root=repo, producers=repo / "producers.py", src=(repo / "src",))
    goldens = bisection.GoldenDir(tmp_path / "goldens")
    step = bisection._evaluate(repo, sha, config, goldens, groups=(), overrides=(), role="step 1")
    assert step.outcome == "skip"
    assert f"commit {sha[:12]}" in step.detail and "base" not in step.detail, step.detail
    assert "module 'tinylib'" in step.detail
