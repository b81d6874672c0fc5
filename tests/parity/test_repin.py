"""Repin on a throwaway git repository: base values, untouched checkout, cleanup, errors."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from parity.repin import RepinError, repin
from parity.store import open_goldens
from parity.worktree import GitError

ROOT = Path(__file__).resolve().parents[2]


def _write_lib(repo: Path, body: str) -> None:
    pkg = repo / "src" / "tinylib"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(body))


@pytest.fixture
def repo(tmp_path: Path, git) -> tuple[Path, str, str]:
    """A repository with two commits of a tiny library, and a dirty working tree."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    _write_lib(repo, "VALUE = 1.0\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "first")
    first = git(repo, "rev-parse", "HEAD")
    _write_lib(repo, "VALUE = 2.0\nNEW_THING = 5\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "second")
    second = git(repo, "rev-parse", "HEAD")
    # Uncommitted work the tool must neither use nor touch.
    _write_lib(repo, "VALUE = 3.0\nNEW_THING = 6\n")
    (repo / "untracked.txt").write_text("mine")
    return repo, first, second


def _producers(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "producers.py"
    path.write_text(textwrap.dedent(body))
    return path


PLAIN = """
    import ml_dtypes
    import numpy as np
    import tinylib

    def _group():
        return {
            "x": np.full(3, tinylib.VALUE, np.float32),
            "b": np.full((2, 2), tinylib.VALUE, ml_dtypes.bfloat16),
            "s": np.float32(tinylib.VALUE),
        }

    GROUPS = {"g": _group}
    CLASS_MAP = [("*", "bitwise")]
"""


def _snapshot(repo: Path, git) -> dict[str, str]:
    """Every file of the checkout (working tree and .git minus worktree bookkeeping) by hash."""
    out = {}
    for p in sorted(repo.rglob("*")):
        rel = p.relative_to(repo).as_posix()
        if p.is_file() and not rel.startswith(".git/logs"):
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    out["<status>"] = git(repo, "--no-optional-locks", "status", "--porcelain")
    out["<branches>"] = git(repo, "branch", "-a", "-v")
    out["<worktrees>"] = git(repo, "worktree", "list", "--porcelain")
    return out


def test_repin_pins_the_base_commit_values_not_the_head_or_dirty_tree(repo, tmp_path, git):
    repo_dir, first, _ = repo
    producers = _producers(tmp_path, PLAIN)
    before = _snapshot(repo_dir, git)
    result = repin(
        first,
        producers=producers,
        out_dir=tmp_path / "goldens",
        repo=repo_dir,
        progress=lambda _: None,
    )
    assert result.sha == first
    with open_goldens(tmp_path / "goldens" / "g.h5") as g:
        np.testing.assert_array_equal(g["x"], np.full(3, 1.0, np.float32))
        assert g["b"].dtype.name == "bfloat16"
        assert g["s"].shape == ()  # 0-d stays 0-d through the subprocess hand-off
        assert g.provenance["base_sha"] == first
        assert "--xla_cpu_max_isa=AVX2" in g.provenance["xla_flags"]
    assert _snapshot(repo_dir, git) == before


def test_provenance_describes_the_producer_process_not_the_callers_shell(
    repo, tmp_path, monkeypatch
):
    """x64 mode, XLA flags and device count are collected where the arrays are made: the
    caller's JAX_ENABLE_X64 and XLA_FLAGS never reach the producers, so they must not be
    recorded; a producer that turns x64 on is recorded with it."""
    repo_dir, first, _ = repo
    producers = _producers(
        tmp_path,
        """
        import jax
        import numpy as np

        def _plain():
            return {"x64": np.bool_(jax.config.jax_enable_x64), "n": np.int64(jax.device_count())}

        def _x64():
            jax.config.update("jax_enable_x64", True)
            return {"x64": np.bool_(jax.config.jax_enable_x64)}

        GROUPS = {"a_plain": _plain, "b_x64": _x64}
        CLASS_MAP = [("*", "bitwise")]
        """,
    )
    monkeypatch.setenv("JAX_ENABLE_X64", "1")
    monkeypatch.setenv(
        "XLA_FLAGS", "--xla_bogus_shell_flag=1 --xla_force_host_platform_device_count=7"
    )
    out = tmp_path / "goldens"
    repin(first, producers=producers, out_dir=out, repo=repo_dir, progress=lambda _: None)
    with open_goldens(out / "a_plain.h5") as g:
        made = {"x64": bool(g["x64"]), "n": int(g["n"])}
        prov = g.provenance
    assert made == {"x64": False, "n": 1}
    assert prov["x64"] is False and prov["device_count"] == 1
    assert "bogus" not in prov["xla_flags"] and "device_count=1" in prov["xla_flags"]
    assert prov["isa_cap"] == "AVX2" and prov["base_sha"] == first and prov["producer_digest"]
    with open_goldens(out / "b_x64.h5") as g:
        assert bool(g["x64"]) is True and g.provenance["x64"] is True


def test_repin_twice_gives_byte_identical_files_and_reports_changes(repo, tmp_path):
    repo_dir, first, second = repo
    producers = _producers(tmp_path, PLAIN)
    out = tmp_path / "goldens"
    repin(first, producers=producers, out_dir=out, repo=repo_dir, progress=lambda _: None)
    once = (out / "g.h5").read_bytes()
    again = repin(first, producers=producers, out_dir=out, repo=repo_dir, progress=lambda _: None)
    assert (out / "g.h5").read_bytes() == once
    assert all(c.unchanged for c in again.changes)
    moved = repin(second, producers=producers, out_dir=out, repo=repo_dir, progress=lambda _: None)
    (change,) = moved.changes
    assert {k for k, _ in change.changed} == {"x", "b", "s"}
    assert "max abs 1" in dict(change.changed)["x"]


def test_unknown_sha_is_a_clear_error(repo, tmp_path):
    repo_dir, _, _ = repo
    with pytest.raises(GitError, match="not a commit"):
        repin(
            "0123456789abcdef0123456789abcdef01234567",
            producers=_producers(tmp_path, PLAIN),
            out_dir=tmp_path / "g",
            repo=repo_dir,
        )


def test_base_lacking_a_symbol_is_named(repo, tmp_path, git):
    repo_dir, first, _ = repo
    producers = _producers(
        tmp_path,
        """
        import numpy as np
        from tinylib import NEW_THING

        GROUPS = {"g": lambda: {"x": np.array([NEW_THING])}}
        CLASS_MAP = [("*", "bitwise")]
    """,
    )
    with pytest.raises(RepinError, match="NEW_THING") as info:
        repin(
            first,
            producers=producers,
            out_dir=tmp_path / "g",
            repo=repo_dir,
            progress=lambda _: None,
        )
    assert "lacks" in str(info.value)
    assert git(repo_dir, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_crashing_producer_shows_its_traceback_and_leaves_old_goldens(repo, tmp_path):
    repo_dir, first, _ = repo
    out = tmp_path / "goldens"
    repin(
        first,
        producers=_producers(tmp_path, PLAIN),
        out_dir=out,
        repo=repo_dir,
        progress=lambda _: None,
    )
    old = (out / "g.h5").read_bytes()
    crash = _producers(
        tmp_path,
        """
        def _boom():
            raise RuntimeError("producer exploded on purpose")

        GROUPS = {"g": _boom}
        CLASS_MAP = [("*", "bitwise")]
    """,
    )
    with pytest.raises(RepinError, match="producer exploded on purpose") as info:
        repin(first, producers=crash, out_dir=out, repo=repo_dir, progress=lambda _: None)
    assert "Traceback" in str(info.value)
    assert (out / "g.h5").read_bytes() == old
    assert sorted(p.name for p in out.iterdir()) == ["g.h5"]


def test_sigint_leaves_old_goldens_and_no_worktree(repo, tmp_path, git):
    repo_dir, first, _ = repo
    out = tmp_path / "goldens"
    repin(
        first,
        producers=_producers(tmp_path, PLAIN),
        out_dir=out,
        repo=repo_dir,
        progress=lambda _: None,
    )
    old = (out / "g.h5").read_bytes()
    marker = tmp_path / "started"
    slow = _producers(
        tmp_path,
        f"""
        import pathlib, time
        import numpy as np

        def _slow():
            pathlib.Path({str(marker)!r}).write_text("go")
            time.sleep(120)
            return {{"x": np.zeros(1)}}

        GROUPS = {{"g": _slow}}
        CLASS_MAP = [("*", "bitwise")]
    """,
    )
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    code = (
        "import sys\n"
        "from parity.repin import repin\n"
        f"repin({first!r}, producers={str(slow)!r}, out_dir={str(out)!r}, repo={str(repo_dir)!r})\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "TMPDIR": str(tmpdir)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "producer never started"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    assert proc.returncode != 0
    assert (out / "g.h5").read_bytes() == old
    assert sorted(p.name for p in out.iterdir()) == ["g.h5"]
    assert git(repo_dir, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert list(tmpdir.iterdir()) == []


def test_repin_tool_exit_code_and_message_for_unknown_sha(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "repin_goldens.py"),
            "--base",
            "no-such-rev",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 1
    assert "not a commit" in proc.stderr
    assert "Traceback" not in proc.stderr
