"""tools/compile_report.py: the A/B against a base commit, on a throwaway repository."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "compile_report.py"


def test_base_mode_measures_both_commits_separately(tmp_path, git, git_project):
    """Base: the scanned forward. Head: the same scan fully unrolled. The report must see one
    while loop at the base, none at head, and a larger HLO at head."""
    repo = git_project(
        tmp_path, table=None, files={"src": ROOT / "src"}, pin=None, message="scanned"
    )
    base = git(repo, "rev-parse", "HEAD")
    glu = repo / "src" / "decomp" / "targets" / "glu_transformer.py"
    text = glu.read_text()
    assert "return jax.lax.scan(body, x, xs)" in text
    glu.write_text(
        text.replace(
            "return jax.lax.scan(body, x, xs)", "return jax.lax.scan(body, x, xs, unroll=True)"
        )
    )
    git(repo, "commit", "-qam", "unrolled")
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(TOOL),
            "--repo",
            str(repo),
            "--base",
            base,
            "--layers",
            "3",
            "--functions",
            "forward_scan",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {r["arm"]: r for r in json.loads(out.read_text())}
    assert rows["base"]["while_loops"] == 1
    assert rows["current"]["while_loops"] == 0
    assert rows["current"]["hlo_bytes"] > rows["base"]["hlo_bytes"]
    for r in rows.values():
        assert {
            "function",
            "compile_s",
            "hlo_bytes",
            "instructions",
            "while_loops",
            "temp_bytes",
        } <= set(r)
    assert "cur/base" in proc.stdout
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_unknown_base_is_a_clear_error(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(TOOL),
            "--base",
            "0" * 40,
            "--layers",
            "1",
            "--functions",
            "forward_scan",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert "not a commit" in proc.stderr
    assert "Traceback" not in proc.stderr
