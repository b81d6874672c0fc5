"""docs/adopting.md is what its commands print. tools/adopting_guide.py walks the guide on a
throwaway project (tinymlp, a fresh git repository built from the guide's own file blocks):
`[tool.parity]`, repin at the first commit, a live `assert_equivalent`, an attention stack's
scan proved op by op and its epsilon bug caught by `op_by_op` (and passed by
`fp32_reassoc`), a green check after a `lax.scan` refactor, the pytest fixture passing, a
commit that breaks layer 1 (the red check naming its key, `--save-actual` and `parity diff`,
the failing pytest test), a bisect naming that commit without touching the checkout, a
revert, a 2x2 check, calibrate, `repin --classes-only` (the logits `bitwise`) and the
calibrated 2x2 check, a 1e-6 logits bug on another ISA that `bitwise` and the baseline catch
and `calibrated` passes "not exact", and the origin of a bug named from the logits alone
(`parity.localise`, `assert_equivalent(new_fn=, old_fn=)`). One walk serves two kinds of
test: the committed guide must equal the fresh rendering beyond the normalisation, and the
walk must tell the story the guide tells (exit codes, the key and the commit named, nothing
left behind), so that rewriting the guide cannot bless a regression."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "adopting_guide.py"

# tools/guide/, the tool's package: tools/ is on sys.path when the tool runs as a script.
sys.path.insert(0, str(ROOT / "tools"))
guide = importlib.import_module("guide")

# --------------------------------------------------------------------------- normalising

_REAL = "0123456789abcdef0123456789abcdef01234567"
_SHOWN = guide.stand_in("tinymlp: a 3-layer MLP")
_ROOT = "/tmp/adopting-guide-3fa9c0d1"


def _normalise(text: str) -> str:
    return guide.normalise(text, root=_ROOT, shas={_REAL: _SHOWN})


def test_normalise_replaces_what_differs_between_two_runs() -> None:
    text = (
        f"repin at {_REAL[:12]}: adding a temporary worktree\n"
        "[producers] [1/1] forward: 4 arrays in 1.5s   \n"
        f"pinned at {_REAL} into {_ROOT}/tinymlp/goldens\n"
        f"{_REAL[:7]} pin goldens at the loop\n"
        "joined the run at localhost:48567; 1 passed in 12.3 s; compare 40ms\n"
        " Date: Wed Dec 2 06:12:14 2026 +0000\n"
        "parity calibrate: pinned at isa AVX2, 1 device(s); "
        "host ISA caps SSE4_2, AVX, AVX2, AVX512_BF16\n"
        "a temporary file parity-3f2a9c1 elsewhere\n"
        " forward base 860c5750663d layout 1x1 env 3f2a9c1 GenuineIntel family 6 model 167\n"
    )
    assert _normalise(text) == (
        f"repin at {_SHOWN[:12]}: adding a temporary worktree\n"
        "[producers] [1/1] forward: 4 arrays in <t>\n"
        f"pinned at {_SHOWN} into ~/tinymlp/goldens\n"
        f"{_SHOWN[:7]} pin goldens at the loop\n"
        "joined the run at localhost:<port>; 1 passed in <t>; compare <t>\n"
        " Date: <date>\n"
        "parity calibrate: pinned at isa AVX2, 1 device(s); "
        "host ISA caps <this host's>\n"
        "a temporary file parity-<hex> elsewhere\n"
        " forward base <hex> layout 1x1 env <hex> <processor>\n"
    )


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("parity: PASS (0 of 4 arrays fail)", "parity: FAIL (0 of 4 arrays fail)"),
        ("parity: PASS (0 of 4 arrays fail)", "parity: PASS (0 of 5 arrays fail)"),
        ("first breaking its class: acts.1", "first breaking its class: acts.2"),
        ("max |a-b| 1.18, max ulp 2088177374", "max |a-b| 1.19, max ulp 2088177375"),
        ("fp32_reassoc 7.15e-07/2e-05 abs (ok)", "fp32_reassoc 7.15e-06/2e-05 abs (ok)"),
        ("bisecting 4 commit(s) between GOOD", "bisecting 3 commit(s) between GOOD"),
        ("step 2  good  <sha>", "step 2  bad   <sha>"),
        ("into ~/tinymlp/goldens", "into ~/tinymlp/golden"),
        ("forward: 4 arrays in 1.5s", "forward: 4 keys in 1.5s"),
        ("1 passed in 2.01s", "1 failed in 2.01s"),
        (
            "process 0 of 2 joined the run at localhost:4",
            "process 1 of 2 joined the run at localhost:4",
        ),
    ],
)
def test_normalise_keeps_every_word_and_figure_of_the_output(before: str, after: str) -> None:
    assert _normalise(before) != _normalise(after)


def test_on_another_processor_the_guide_is_compared_without_its_figures() -> None:
    here = "fp32_reassoc  |a-b| <= 2e-05     4  7.15e-07  32  forward/logits (isa=SSE4_2)\n"
    there = "fp32_reassoc  |a-b| <= 2e-05     4  4.77e-07  156  forward/logits (isa=SSE4_2)\n"
    assert guide.difference(here, there)  # where the guide was written: every figure
    assert guide.difference(here, there, numbers=False) == ""
    # Words, keys and verdicts still count.
    for other in (
        here.replace("forward/logits", "forward/acts.1"),
        here.replace("isa=SSE4_2", "isa=AVX"),
        here.replace("fp32_reassoc", "bitwise"),
    ):
        assert guide.difference(here, other, numbers=False), other
    text = "# Title\n\nbody\n"
    marked = guide.with_host(text, "AuthenticAMD family 25 model 1; avx avx2")
    assert guide.written_on(marked) == "AuthenticAMD family 25 model 1; avx avx2"
    assert guide.written_on(guide.with_host(marked, "GenuineIntel family 6 model 167")) == (
        "GenuineIntel family 6 model 167"
    )
    assert guide.with_host(marked, "x").count("guide:host") == 1


# --------------------------------------------------------------------------- the rules


def test_a_command_that_fails_where_the_guide_does_not_show_it_stops_the_walk(
    tmp_path: Path,
) -> None:
    text = (
        "<!-- guide:file a.txt -->\n```text\nhello\n```\n\n"
        "<!-- guide:run shown -->\n```console\n$ grep -c hello a.txt\n$ false\n$ echo $?\n"
        "```\n<!-- /guide:run -->\n\n"
        "<!-- guide:run hidden -->\n```console\n$ grep goodbye a.txt\n$ echo done\n"
        "```\n<!-- /guide:run -->\n"
    )
    with pytest.raises(guide.GuideError, match=r"'grep goodbye a\.txt' exited 1"):
        guide.walk(guide.parse(text), tmp_path)
    shown = text.split("<!-- guide:run hidden", 1)[0]
    done = guide.walk(guide.parse(shown), tmp_path / "again")
    rendered = guide.render(shown, guide.parse(shown), done)
    assert rendered.split("<!-- guide:run shown -->\n")[1] == (
        "```console\n$ grep -c hello a.txt\n1\n$ false\n$ echo $?\n1\n```\n<!-- /guide:run -->\n\n"
    )


def _as_printed(text: str) -> Any:
    """A `Walk` whose steps printed what `text`'s run blocks show (no command runs)."""
    steps = []
    for block in (b for b in guide.parse(text) if b.kind == "run"):
        command, shown = None, []
        for line in [*block.body, guide.PROMPT]:
            if line.startswith(guide.PROMPT):
                if command is not None:
                    steps.append(guide.Step(block.arg, command, 0, "", tuple(shown)))
                command, shown = line[len(guide.PROMPT) :], []
            else:
                shown.append(line)
    return guide.Walk(Path("."), Path("."), Path("."), {}, tuple(steps))


def test_every_figure_the_prose_quotes_is_the_one_its_output_prints() -> None:
    """The prose's figures come from the output printed beside them (`guide:figure`): on
    the committed guide they agree, on any processor (no command runs here), and a figure
    that disagrees is a difference `--check` reports."""
    committed = guide.GUIDE.read_text()
    done = _as_printed(committed)
    assert guide.render(committed, guide.parse(committed), done) == committed
    figures = guide.FIGURE.findall(committed)
    assert len(figures) >= 2, "the prose quotes figures in sections 4, 8, 9 and 10"
    _, pattern, value = figures[0]
    wrong = committed.replace(f"{pattern} -->{value}<", f"{pattern} -->0.0358<", 1)
    fresh = guide.render(wrong, guide.parse(wrong), done)
    assert "-->0.0358<" in guide.difference(wrong, fresh)
    broken = committed.replace(pattern, "^no such line (here)$", 1)
    with pytest.raises(guide.GuideError, match="printed no such line"):
        guide.render(broken, guide.parse(broken), done)


def test_the_command_line_imports_its_package_from_any_folder(tmp_path: Path) -> None:
    """`python tools/adopting_guide.py` finds tools/guide/ wherever it is run from (its
    folder is on sys.path as a script's)."""
    proc = subprocess.run(
        [sys.executable, str(TOOL), "--help"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "--check" in proc.stdout and "--write" in proc.stdout and "--keep" in proc.stdout


def test_the_install_sentences_agree_with_pyproject_and_readme() -> None:
    text, readme = guide.GUIDE.read_text(), (ROOT / "README.md").read_text()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert guide.install_problems(text, readme, pyproject) == []
    stale = text.replace("jax, jaxlib, numpy", "jax, numpy").replace("# devices = 1", "# gpus = 1")
    problems = guide.install_problems(stale, readme.replace("pip install pytest ", ""), pyproject)
    assert [p.split(" ", 3)[:3] for p in problems] == [
        ["the", "guide", "installs"],
        ["the", "guide", "should"],
        ["the", "guide's", "[tool.parity]"],
    ], problems


# --------------------------------------------------------------------------- the walk


#: The xdist group of the tests that read the walk: one worker walks the guide once for both
#: (as the slow tests go out first, the two would otherwise start on both workers, each
#: walking it).
WALK = "adopting_guide.walk"


@pytest.fixture(scope="module")
def walked(
    tmp_path_factory: pytest.TempPathFactory,
    checkout_snapshot: Callable[[Path], dict[str, str]],
) -> tuple[str, Any, dict[str, dict[str, str]]]:
    """The committed guide, a fresh walk of it, and the checkout around the bisect."""
    committed = guide.GUIDE.read_text()
    around: dict[str, dict[str, str]] = {}

    def snapshot(when: str) -> Callable[[str, Path], None]:
        def hook(command: str, project: Path) -> None:
            if command.startswith("parity bisect"):
                around[when] = checkout_snapshot(project)

        return hook

    done = guide.walk(
        guide.parse(committed),
        tmp_path_factory.mktemp("guide").resolve(),
        before=snapshot("before"),
        after=snapshot("after"),
    )
    return committed, done, around


@pytest.mark.slow
@pytest.mark.xdist_group(WALK)
def test_the_committed_guide_is_what_a_fresh_run_prints(walked) -> None:
    committed, done, _ = walked
    fresh = guide.render(committed, guide.parse(committed), done)
    # Figures only where the guide was written: they are XLA's on that processor.
    same = guide.written_on(committed) == guide.this_host()
    diff = guide.difference(committed, fresh, numbers=same)
    if diff:
        pytest.fail(
            "docs/adopting.md differs from a fresh run of its commands (if the new output is "
            "right: python tools/adopting_guide.py --write, then fix the prose around it)\n" + diff,
            pytrace=False,
        )


@pytest.mark.slow
@pytest.mark.xdist_group(WALK)
def test_the_walk_tells_the_story_the_guide_tells(walked) -> None:
    _, done, around = walked
    real = {shown: sha for sha, shown in done.shas.items()}
    first = real[guide.stand_in("tinymlp: a 3-layer MLP, Python loop over layers")]
    broken = real[guide.stand_in("init: a bias scale per layer")]

    ordered = done.step("dict-order").output
    assert "as jax returns it:  head hidden0 hidden1 hidden2 input" in ordered
    assert "in dataflow order:  input hidden0 hidden1 hidden2 head" in ordered

    pinned = done.step("pin", "parity repin")
    assert pinned.returncode == 0 and f"pinned at {first} " in pinned.output
    assert "forward: new file, 4 arrays" in pinned.output
    assert done.step("live").returncode == 0
    # The attention stack's scan moves bits: bitwise fails it and says op_by_op passes it;
    # op_by_op passes it proved. Its epsilon bug passes fp32_reassoc and fails op_by_op at
    # the changed line.
    told = done.step("proved", "PYTHONPATH=src python tests/normed_vs_loop.py bitwise").output
    assert "parity: FAIL" in told and "the class op_by_op passes such a key" in told, told
    proved = done.step("proved", "PYTHONPATH=src python tests/normed_vs_loop.py op_by_op")
    assert "parity: PASS (0 of 1 array fail), logits equivalent op by op (" in proved.output
    loose = done.step("epsilon", "PYTHONPATH=src python tests/normed_vs_loop.py fp32_reassoc")
    assert loose.output.startswith("parity: PASS"), loose.output
    caught = done.step("epsilon", "PYTHONPATH=src python tests/normed_vs_loop.py op_by_op")
    normed = (done.project / "src" / "tinymlp" / "normed.py").read_text().splitlines()
    eps = [i + 1 for i, line in enumerate(normed) if "jnp.sqrt(var + 1e-5)" in line]
    assert len(eps) == 1, normed
    assert f"origin: add at {done.project}/src/tinymlp/normed.py:{eps[0]} in layer_norm" in (
        caught.output
    )
    assert "parity: PASS (0 of 4 arrays fail)" in done.step("check", "parity check").output
    assert "1 passed" in done.step("pytest", "pytest").output

    red = done.step("break", "parity check")
    assert red.returncode == 1
    assert "first breaking its class: acts.1 [fp32_reassoc, fail]" in red.output
    assert "forward/acts.0 " not in red.output.split("failures (")[1]
    assert done.step("diff", "parity diff").returncode == 1
    failing = done.step("pytest-red", "pytest")
    assert failing.returncode == 1 and "1 failed" in failing.output

    found = done.step("bisect", "parity bisect")
    assert found.returncode == 0
    assert f"first bad commit: {broken}\n" in found.output
    assert "group forward, key acts.1, class fp32_reassoc" in found.output
    answer = json.loads((done.root / "bisect.json").read_text())
    assert (answer["status"], answer["first_bad_commit"], answer["key"]) == (
        "found",
        broken,
        "acts.1",
    )
    assert [s["outcome"] for s in answer["steps"][:2]] == ["good", "bad"]  # GOOD, BAD confirmed
    assert around["before"] == around["after"]  # the checkout, .git included, untouched
    assert not (done.project / ".git" / "BISECT_LOG").exists()

    for name in ("processes", "calibrated-check"):
        multi = done.step(name, "parity check")
        assert multi.returncode == 0 and "2 processes x 2 devices (4 in all)" in multi.output
    assert "0 keys passed by calibration alone" in done.step("calibrated-check").output

    # A 1e-6 logits bug off the pin's machine: bitwise and the baseline catch it; calibrated,
    # and bitwise with the baseline off, pass it and say so on the verdict line.
    caught = done.step("small-bug", "parity check")
    assert caught.returncode == 1
    assert "logits [bitwise, fail], first differing element at index" in caught.output
    assert " vs baseline " in caught.output
    for flag, why in (
        ("--override 'logits=calibrated'", "(logits) passed their calibrated bound"),
        ("--baseline off", "(logits) failed their pinned class and passed by calibration alone"),
    ):
        passed = done.step("small-bug", f"parity check --isa AVX {flag}")
        verdict = _verdict(passed.output)
        assert passed.returncode == 0 and verdict.startswith("parity: PASS (0 of 4"), verdict
        assert ", not exact: " in verdict and why in verdict, verdict

    # The origin of the dropped transpose, named from the logits alone at the changed line.
    source = (done.project / "src" / "tinymlp" / "__init__.py").read_text().splitlines()
    bug = [i + 1 for i, line in enumerate(source) if "x @ w + b" in line]
    assert len(bug) == 1, source
    named = done.step("origin")
    assert named.returncode == 0
    assert f"localise: dot_general at src/tinymlp/__init__.py:{bug[0]} in " in named.output
    assert f"origin: dot_general at {done.project}/src/tinymlp/__init__.py:{bug[0]} in " in (
        named.output
    )
    assert "in forward.<locals>.dense, called from " in named.output  # its callers follow

    status = done.step("done", "git status").output.splitlines()
    assert status and all(line.startswith("!! ") for line in status), status
    assert list(done.tmp.iterdir()) == []  # no temporary worktree, golden or log left


def _verdict(output: str) -> str:
    """The verdict line of a check's output (the first that starts `parity: `)."""
    return next(line for line in output.splitlines() if line.startswith("parity: "))
