"""parity in a project that is not this one: a throwaway git repository with a small JAX
model of its own goes through docs/adopting.md: `[tool.parity]`, repin at the first
commit, a green check after a `lax.scan` refactor, exit 1 naming the broken layer's key
after a commit that breaks it, and a bisect that names that commit without touching the
checkout. Every command is the real CLI in a subprocess, run from the project's folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PYPROJECT = """\
[project]
name = "tinymlp"
version = "0.1.0"

[tool.parity]
producers = "tests/producers.py"
"""

LOOP = '''\
"""A 3-layer tanh MLP, per-layer weights stacked on a leading layer axis."""

import jax
import jax.numpy as jnp

N_LAYER, WIDTH = 3, 16


def init(key):
    kw, kb = jax.random.split(key)
    w = jax.random.normal(kw, (N_LAYER, WIDTH, WIDTH)) / jnp.sqrt(WIDTH)
    b = 0.1 * jax.random.normal(kb, (N_LAYER, WIDTH))
    return {"w": w, "b": b}


def forward(params, x):
    """x [batch, WIDTH] -> (logits [batch], activations [N_LAYER, batch, WIDTH])."""
    acts = []
    for i in range(N_LAYER):
        x = jnp.tanh(x @ params["w"][i].T + params["b"][i])
        acts.append(x)
    return x.sum(-1), jnp.stack(acts)
'''

SCAN = LOOP.replace(
    """    acts = []
    for i in range(N_LAYER):
        x = jnp.tanh(x @ params["w"][i].T + params["b"][i])
        acts.append(x)
    return x.sum(-1), jnp.stack(acts)
""",
    """
    def layer(x, wb):
        w, b = wb
        x = jnp.tanh(x @ w.T + b)
        return x, x

    x, acts = jax.lax.scan(layer, x, (params["w"], params["b"]))
    return x.sum(-1), acts
""",
)

BROKEN = SCAN.replace(
    '    return {"w": w, "b": b}',
    '    b = b.at[1].multiply(-1.0)  # the bug: flips layer 1\'s bias\n    return {"w": w, "b": b}',
)

PRODUCERS = '''\
"""What parity pins: the forward on fixed inputs, through the public API only."""

import jax

import tinymlp


def forward():
    params = jax.jit(tinymlp.init)(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (4, tinymlp.WIDTH))
    logits, acts = jax.jit(tinymlp.forward)(params, x)
    # A pytree: keys acts.0, acts.1, acts.2, logits, in this (forward) order.
    return {"acts": [acts[i] for i in range(tinymlp.N_LAYER)], "logits": logits}


GROUPS = {"forward": forward}
CLASS_MAP = [("acts.*", "fp32_reassoc"), ("logits", "fp32_reassoc")]
'''

TEST = """\
import tinymlp
import jax


def test_forward_matches_goldens(parity_check):
    params = jax.jit(tinymlp.init)(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (4, tinymlp.WIDTH))
    logits, acts = jax.jit(tinymlp.forward)(params, x)
    parity_check({"acts": list(acts), "logits": logits}, "forward")
"""


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


@pytest.mark.slow
def test_a_project_that_is_not_this_one_pins_checks_and_bisects(
    tmp_path: Path, git, run_parity, checkout_snapshot
) -> None:
    repo = tmp_path / "tinymlp"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    _write(
        repo,
        {
            "pyproject.toml": PYPROJECT,
            "src/tinymlp/__init__.py": LOOP,
            "tests/producers.py": PRODUCERS,
            "tests/test_forward.py": TEST,
        },
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "tinymlp: a 3-layer MLP, Python loop over layers")
    first = git(repo, "rev-parse", "HEAD")

    pinned = run_parity(repo, "repin", "--base", "HEAD")
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr
    assert f"pinned at {first}" in pinned.stdout
    assert "forward: new file, 4 arrays" in pinned.stdout
    assert (repo / "goldens" / "forward.h5").is_file()
    git(repo, "add", "goldens")
    git(repo, "commit", "-qm", "pin goldens at the loop")

    _write(repo, {"src/tinymlp/__init__.py": SCAN})
    git(repo, "commit", "-qam", "forward: lax.scan over layers")
    green = run_parity(repo, "check")
    assert green.returncode == 0, green.stdout + green.stderr
    assert "parity: PASS (0 of 4 arrays fail)" in green.stdout

    # The pytest plugin reads the same [tool.parity]: no options needed, and no PYTHONPATH
    # (a user's shell has none): the plugin puts the src roots on sys.path itself.
    plugin = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=repo,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        timeout=300,
    )
    assert plugin.returncode == 0, plugin.stdout + plugin.stderr
    assert "1 passed" in plugin.stdout

    _write(repo, {"src/tinymlp/__init__.py": BROKEN})
    git(repo, "commit", "-qam", "init: fold the bias scale")
    broken = git(repo, "rev-parse", "HEAD")
    (repo / "README.md").write_text("# tinymlp\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "-qm", "README")

    red = run_parity(repo, "check")
    assert red.returncode == 1, red.stdout + red.stderr
    assert "first breaking its class: acts.1 [fp32_reassoc, fail]" in red.stdout
    assert "forward/acts.0 " not in red.stdout.split("failures (")[1]

    before = checkout_snapshot(repo)
    found = run_parity(repo, "bisect", first, "HEAD", "--json", str(tmp_path / "bisect.json"))
    assert found.returncode == 0, found.stdout + found.stderr
    assert f"first bad commit: {broken}\n" in found.stdout
    assert "group forward, key acts.1, class fp32_reassoc" in found.stdout
    doc = json.loads((tmp_path / "bisect.json").read_text())
    assert (doc["status"], doc["first_bad_commit"], doc["key"]) == ("found", broken, "acts.1")
    assert [s["outcome"] for s in doc["steps"][:2]] == ["good", "bad"]  # GOOD, BAD confirmed
    assert checkout_snapshot(repo) == before
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert not (repo / ".git" / "BISECT_LOG").exists()
    assert list((tmp_path / "tmp").iterdir()) == []  # no temporary goldens or worktrees left
