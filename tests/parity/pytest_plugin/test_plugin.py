"""The pytest plugin, driven through inner pytest sessions (pytester).

Each inner session runs in its own process (`runpytest_subprocess`): jax fixes its device
count once per process, and the plugin must set it before jax starts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from parity.judge._tolerance import ClassMap
from parity.store import write_goldens

pytest_plugins = ["pytester"]

# The arrays of the golden group "g", as source so inner tests rebuild them exactly.
_ARRAYS_SRC = """
import numpy as np

def arrays():
    return {
        "layers.0.h1": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
        "layers.1.h1": np.arange(12, dtype=np.float32).reshape(3, 4) / 9,
        "logits": np.linspace(-1, 1, 5, dtype=np.float32),
    }
"""

_CMAP = ClassMap((("layers.*", "fp32_reassoc"),), default="bitwise")


def _arrays() -> dict[str, np.ndarray]:
    namespace: dict[str, object] = {}
    exec(_ARRAYS_SRC, namespace)
    return namespace["arrays"]()  # pyright: ignore[reportCallIssue, reportReturnType]


def _pin(root: Path, group: str, arrays: dict[str, np.ndarray], order: list[str]) -> None:
    (root / "goldens").mkdir(exist_ok=True)
    write_goldens(
        root / "goldens" / f"{group}.h5",
        arrays,
        classes={k: _CMAP.class_for(k) for k in arrays},
        class_map_json=_CMAP.to_json(),
        order=order,
    )


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester whose inner sessions see a clean jax environment on the CPU."""
    for var in (
        "PARITY_DEVICES",
        "PARITY_JAX_CACHE",
        "XLA_FLAGS",
        "PYTEST_ADDOPTS",
        "PYTEST_XDIST_WORKER",
        "PYTEST_XDIST_WORKER_COUNT",
        "PYTEST_XDIST_TESTRUNUID",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    pytester.makepyfile(golden_arrays=_ARRAYS_SRC)
    return pytester


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    # No compile cache: the inner tests compile nothing worth keeping.
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--parity-jax-cache", "none", *args
    )


# --------------------------------------------------------------------------- devices


@pytest.mark.parametrize("how", ["option", "env"])
def test_the_simulated_device_count_reaches_jax(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    inner.makepyfile(
        test_devices="""
        import jax

        def test_two_devices():
            assert jax.device_count() == 2
        """
    )
    if how == "env":
        monkeypatch.setenv("PARITY_DEVICES", "2")
        result = _run(inner)
    else:
        result = _run(inner, "--parity-devices", "2")
    result.assert_outcomes(passed=1)


def test_a_conftest_that_started_jax_makes_another_count_a_usage_error(
    inner: pytest.Pytester,
) -> None:
    # The rootdir conftest is imported before pytest_configure, so jax starts with 1 device.
    inner.makeconftest(
        """
        import jax
        jax.numpy.zeros(1)
        """
    )
    inner.makepyfile(test_x="def test_x():\n    pass\n")
    result = _run(inner, "--parity-devices", "3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stderr.str() + result.stdout.str()
    assert "jax already started with 1 device" in text
    assert "but 3 were asked for" in text and "--parity-devices" in text
    assert "Traceback" not in text


# --------------------------------------------------------------------------- parity_check


def test_parity_check_passes_fails_names_keys_and_writes_the_report(
    inner: pytest.Pytester,
) -> None:
    arrays = _arrays()
    # logits has no place in the pinned order: it must come after the ordered keys.
    _pin(inner.path, "g", arrays, order=["layers.0.h1", "layers.1.h1"])
    inner.makepyfile(
        test_checks="""
        from golden_arrays import arrays

        def test_matches(parity_check):
            assert parity_check(arrays(), "g").passed

        def test_perturbed(parity_check):
            a = arrays()
            a["logits"][2] += 1
            a["layers.1.h1"][0, 1] += 1e-3
            parity_check(a, "g", name="perturbed")

        def test_no_such_group(parity_check):
            parity_check(arrays(), "nope")
        """
    )
    result = _run(inner, "--parity-report", "rep")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    assert "parity check 'perturbed' failed" in out
    assert "logits [bitwise, fail]" in out and "layers.1.h1 [fp32_reassoc, fail]" in out
    assert "first breaking its class: layers.1.h1" in out
    # No producers file here: the origin cannot be recorded, and the failure says why.
    assert "origin: not named: no producers file is configured" in out
    assert "no golden file for group 'nope'" in out and "parity repin --base" in out
    assert "During handling of the above exception" not in out
    # The end-of-session section.
    assert re.search(r"^=+ parity =+$", out, re.MULTILINE), out
    assert "2 checks, 6 arrays" in out

    rep = inner.path / "rep"
    assert "FAIL" in (rep / "report.txt").read_text()
    assert (rep / "index.html").is_file()
    doc = json.loads((rep / "report.json").read_text())
    assert doc["verdict"] == "fail"
    assert {"produce_s", "load_s", "compare_s", "report_s"} <= set(doc["timing"])
    checks = {c["name"]: c for c in doc["checks"]}
    assert set(checks) == {"g", "perturbed"}
    assert checks["g"]["passed"] and not checks["perturbed"]["passed"]
    # Keys are named with their check; the first divergence is per check, never merged.
    failing = {f["key"] for f in doc["findings"] if f["verdict"] != "pass"}
    assert failing == {"perturbed/logits", "perturbed/layers.1.h1"}
    assert "first_failure" not in doc
    assert checks["perturbed"]["first_failure"]["key"] == "layers.1.h1"
    assert checks["g"]["first_failure"] is None


def test_a_damaged_golden_fails_the_test_with_one_line_not_an_internal_error(
    inner: pytest.Pytester,
) -> None:
    from _damage import flip_stored_byte

    arrays = _arrays()
    for group in ("data", "meta"):
        _pin(inner.path, group, arrays, order=list(arrays))
    path = inner.path / "goldens" / "data.h5"
    flip_stored_byte(path, "logits/%value", 3, 0x40)
    path = inner.path / "goldens" / "meta.h5"
    raw = bytearray(path.read_bytes())
    at = raw.index(b'"logits"')  # in the index text, a root attribute
    raw[at + 2] ^= 0x01
    path.write_bytes(bytes(raw))
    inner.makepyfile(
        test_damaged="""
        from golden_arrays import arrays

        def test_data(parity_check):
            parity_check(arrays(), "data")

        def test_meta(parity_check):
            parity_check(arrays(), "meta")
        """
    )
    result = _run(inner)
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "golden group 'data' is unusable" in out and "'logits' is corrupt" in out
    assert "golden group 'meta' is unusable" in out and "damaged" in out
    assert "INTERNALERROR" not in out and "Traceback" not in out


# --------------------------------------------------------------------------- unchecked goldens


@pytest.mark.parametrize("mode", ["warn", "fail"])
def test_goldens_no_test_checked_are_listed_and_can_fail_the_session(
    inner: pytest.Pytester, mode: str
) -> None:
    _pin(inner.path, "g", _arrays(), order=[])
    _pin(
        inner.path,
        "other",
        {"a": np.zeros(2, np.float32), "b": np.ones(2, np.float32)},
        order=[],
    )
    inner.makepyfile(
        test_one="""
        from golden_arrays import arrays

        def test_g(parity_check):
            parity_check(arrays(), "g")
        """
    )
    result = _run(inner, "--parity-unchecked", mode)
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert f"2 golden keys no test checked ({mode}):" in out
    assert "other: 2: a, b" in out
    assert "g:" not in out.split("no test checked")[1]
    # The goldens record no provenance, so the check has a "bits" and an "info" drift line;
    # the session summary keeps both.
    summary = out.split(" parity ===")[1]
    assert "can change XLA's last bits" in summary
    assert "environment drift (informational)" in summary
    if mode == "fail":
        assert result.ret == pytest.ExitCode.TESTS_FAILED
    else:
        assert result.ret == pytest.ExitCode.OK


# --------------------------------------------------------------------------- xdist


def test_the_report_merges_checks_from_xdist_workers(inner: pytest.Pytester) -> None:
    _pin(inner.path, "g", _arrays(), order=[])
    inner.makepyfile(
        test_workers="""
        from golden_arrays import arrays

        def test_first(parity_check):
            parity_check(arrays(), "g", name="first")

        def test_second(parity_check):
            parity_check(arrays(), "g", name="second")
        """
    )
    result = _run(inner, "-n", "2", "--parity-report", "rep")
    result.assert_outcomes(passed=2)
    doc = json.loads((inner.path / "rep" / "report.json").read_text())
    assert sorted(c["name"] for c in doc["checks"]) == ["first", "second"]
    assert doc["verdict"] == "pass" and len(doc["findings"]) == 6
    assert "2 checks, 6 arrays" in result.stdout.str()


# --------------------------------------------------------------------- selection, actual arrays


def test_unchecked_goldens_are_judged_against_the_selected_tests(inner: pytest.Pytester) -> None:
    _pin(inner.path, "g", _arrays(), order=[])
    _pin(inner.path, "other", {"a": np.zeros(2, np.float32)}, order=[])
    inner.makepyfile(
        test_both="""
        import numpy as np
        from golden_arrays import arrays

        def test_g(parity_check):
            parity_check(arrays(), "g")

        def test_other(parity_check):
            parity_check({"a": np.zeros(2, np.float32)}, "other")
        """
    )
    # Everything selected: nothing unchecked.
    full = _run(inner, "--parity-unchecked", "fail")
    full.assert_outcomes(passed=2)
    assert "no test checked" not in full.stdout.str()
    # -k leaves test_other out: its group is not judged, so the session stays green.
    for narrowed in (("-k", "test_g"), ("test_both.py::test_g",)):
        result = _run(inner, "--parity-unchecked", "fail", *narrowed)
        result.assert_outcomes(passed=1)
        assert result.ret == pytest.ExitCode.OK, result.stdout.str()
        assert "no test checked" not in result.stdout.str()
    # A group nobody selected a test for is still judged in a full run.
    only_g = (
        "from golden_arrays import arrays\n\n"
        "def test_g(parity_check):\n    parity_check(arrays(), 'g')\n"
    )
    inner.makepyfile(test_both=only_g)
    result = _run(inner, "--parity-unchecked", "fail")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "other: 1: a" in result.stdout.str()


def test_a_failing_check_leaves_its_actual_arrays_for_parity_diff(inner: pytest.Pytester) -> None:
    _pin(inner.path, "g", _arrays(), order=["layers.0.h1", "layers.1.h1"])
    inner.makepyfile(
        test_fail="""
        from golden_arrays import arrays

        def test_perturbed(parity_check):
            a = arrays()
            a["layers.0.h1"][1, 1] += 1e-2
            parity_check(a, "g", overrides=[("logits", "fp32_reassoc")])
        """
    )
    result = _run(inner, "-n", "2", "--parity-save-actual", "actual")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    saved = inner.path / "actual" / "g.h5"
    assert saved.is_file() and f"actual arrays written to {saved}" in out
    command = next(line.strip() for line in out.splitlines() if "parity diff" in line)
    assert "--override 'logits=fp32_reassoc'" in command
    diff = subprocess.run(
        command.replace("python", sys.executable, 1), shell=True, capture_output=True, text=True
    )
    assert diff.returncode == 1, diff.stderr
    assert "layers.0.h1 [fp32_reassoc, fail]" in diff.stdout
    assert "first breaking its class: layers.0.h1" in diff.stdout


# --------------------------------------------------------------------------- vocabulary

_ONE_ULP = """
import numpy as np
from golden_arrays import arrays

def test_logits_one_ulp_off(parity_check):
    a = arrays()
    a["logits"] = np.nextafter(a["logits"], np.float32(2))  # bitwise in the pinned map
    parity_check(a, "g"{keyword})
"""


@pytest.mark.parametrize("how", ["none", "--parity-override", "--parity-class", "overrides="])
def test_the_session_and_call_rules_mirror_the_command_line(
    inner: pytest.Pytester, how: str
) -> None:
    _pin(inner.path, "g", _arrays(), order=["layers.0.h1", "layers.1.h1"])
    keyword = f", {how}[('logits', 'fp32_reassoc')]" if how.endswith("=") else ""
    inner.makepyfile(test_ulp=_ONE_ULP.format(keyword=keyword))
    options = {
        "--parity-override": ("--parity-override", "logits=fp32_reassoc"),
        "--parity-class": ("--parity-class", "fp32_reassoc"),
    }.get(how, ())
    result = _run(inner, *options)
    result.assert_outcomes(**({"failed": 1} if how == "none" else {"passed": 1}))


def test_a_bad_session_rule_is_a_usage_error(inner: pytest.Pytester) -> None:
    for option in (("--parity-override", "logits"), ("--parity-class", "nope")):
        result = _run(inner, *option)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, option
        assert option[1] in result.stderr.str()


def test_a_session_rule_s_unknown_class_names_the_option_that_gave_it_and_the_nearest(
    inner: pytest.Pytester,
) -> None:
    result = _run(inner, "--parity-override", "logits=fp32_reasoc")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "--parity-override 'logits=fp32_reasoc' names the unknown tolerance class" in err
    assert "did you mean 'fp32_reassoc'?" in err and "--class" not in err
    result = _run(inner, "--parity-class", "bitwse")
    assert "--parity-class names the unknown tolerance class 'bitwse'" in result.stderr.str()


def test_a_live_check_compares_non_array_leaves_as_assert_equivalent_does(
    inner: pytest.Pytester,
) -> None:
    inner.makepyfile(
        test_statics="""
        import numpy as np
        import pytest
        import parity

        def tree(act):
            return {"w": np.ones(3, np.float32), "act": act, "name": "mlp"}

        def test_same_leaves(parity_check):
            assert parity_check(tree(np.tanh), tree(np.tanh)).passed
            parity.assert_equivalent(tree(np.tanh), tree(np.tanh))
            # a misspelt option is refused, not ignored
            with pytest.raises(TypeError, match="parity_check.*'clas_map'.*class_map"):
                parity_check(tree(np.tanh), tree(np.tanh), clas_map="fp32_reassoc")

        def test_other_function(parity_check):
            with pytest.raises(AssertionError) as e:
                parity.assert_equivalent(tree(np.tanh), tree(np.sin))
            assert "act: actual <ufunc 'tanh'> vs expected <ufunc 'sin'>" in str(e.value)
            parity_check(tree(np.tanh), tree(np.sin), name="other")
        """
    )
    result = _run(inner)
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "parity check 'other' failed" in out
    assert "non-array leaves that differ (1):" in out
    assert "act: actual <ufunc 'tanh'> vs expected <ufunc 'sin'>" in out


# --------------------------------------------------------------------------- adopting


def _bare_env() -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH (which would hide whether the plugin
    finds the project's code), no outer pytest or jax settings."""
    drop = ("PYTHONPATH", "PYTEST_ADDOPTS", "XLA_FLAGS")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in drop and not k.startswith(("PYTEST_XDIST", "PARITY_"))
    }
    return env | {"JAX_PLATFORMS": "cpu"}


def _pytest_bare(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m pytest ARGV` in `cwd` with `_bare_env()`, as a user's shell runs it."""
    return subprocess.run([sys.executable, "-m", "pytest", *argv], cwd=cwd, env=_bare_env(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_the_plugin_puts_the_configured_src_roots_on_sys_path(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "mypkg"\n\n[tool.parity]\nsrc = "src"\n'
    )
    (tmp_path / "src" / "mypkg").mkdir(parents=True)
    (tmp_path / "src" / "mypkg" / "__init__.py").write_text("ANSWER = 42\n")
    (tmp_path / "tests").mkdir()
    # A conftest is imported before pytest_configure: the roots must be there by then.
    (tmp_path / "tests" / "conftest.py").write_text("import mypkg  # noqa: F401\n")
    (tmp_path / "tests" / "test_mine.py").write_text(
        "import mypkg\n\n\ndef test_imports():\n    assert mypkg.ANSWER == 42\n"
    )
    done = _pytest_bare(
        tmp_path, "-q", "-p", "no:cacheprovider", "--parity-jax-cache", "none", "tests"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_the_default_compile_cache_is_the_machine_s_outside_the_checkout(
    tmp_path: Path, git, git_project
) -> None:
    files = {
        ".gitignore": "__pycache__/\n",
        "pyproject.toml": '[project]\nname = "p"\n\n[tool.parity]\n',
        "tests/test_jit.py": "import jax\nimport jax.numpy as jnp\n\n\n"
        "def test_jit():\n    assert float(jax.jit(jnp.sin)(0.0)) == 0.0\n",
    }
    proj = git_project(
        tmp_path, table=None, files=files, pin=None, message="a project", branch=None
    )
    home = tmp_path / "cache-home"
    env = _bare_env() | {"XDG_CACHE_HOME": str(home)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "tests"], cwd=proj,
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # one folder for both xdist workers, under the user's cache folder
    (folder,) = (home / "parity" / "jax").iterdir()
    assert any(folder.glob("jit_sin-*-cache")), "the cache stayed empty"
    assert "XLA compiled" in done.stdout and "(2 processes)" in done.stdout, done.stdout
    assert "program(s)" not in done.stdout and "process(es)" not in done.stdout
    assert git(proj, "status", "--porcelain", "--untracked-files=all") == ""


def test_a_failing_assert_equivalent_points_at_the_test_not_at_parity(
    inner: pytest.Pytester,
) -> None:
    """`assert_equivalent` hides its own frame (`__tracebackhide__`): the traceback pytest
    prints ends at the test's line, as a failing `assert` would."""
    inner.makepyfile(
        test_hidden="""
        import numpy as np
        import parity

        def test_moved():
            parity.assert_equivalent({"y": np.ones(3)}, {"y": np.zeros(3)})
        """
    )
    result = _run(inner)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "test_hidden.py:5: NotEquivalent" in out, out  # an AssertionError, by its name
    assert "parity/_assertions.py" not in out and "def assert_equivalent" not in out, out
