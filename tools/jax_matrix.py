"""`parity check` on every jax of a list, on a newcomer's project pinned elsewhere (issue 56).

The project is `tests/parity/_tinyformer.py`'s: a 4-layer pure-JAX transformer returning
its logits, under `CLASS_MAP = [("logits", "op_by_op")]`. Its goldens are pinned by the jax
running this tool (the pin: 0.10.2 under constraints.txt), then their provenance is
rewritten to say they were pinned on another processor (`GenuineIntel family 6 model 143`)
and no calibration is recorded: every check below runs off the pin's environment. Two
commits follow: the refactor (stacked weights, a `lax.scan`, an einsum) and the refactor
with a layer-norm epsilon 1e-5 -> 1e-6.

For each jax version a virtual environment is made once under `--venvs` (jax, jaxlib and
the harness's runtime dependencies from the package index; the harness itself from this
checkout's `src`, on `PYTHONPATH`), and in it

    parity check --json REPORT

runs on the refactor and on the bug. Printed per version: each exit code, whether the
refactor was proved op by op (or equal bit for bit to the base re-produced here), where the
bug's origin is named, any line saying what that jax cannot do, and the seconds.

    XLA_FLAGS=--xla_cpu_max_isa=AVX2 .venv/bin/python tools/jax_matrix.py \\
        [--versions 0.4.35,0.6.2,0.8.3,0.9.2,0.10.2] [--venvs DIR] [--json rows.json]

Nothing in the user's checkout is touched: the project lives in a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "parity"))

import _tinyformer as tf  # noqa: E402  # pyright: ignore[reportMissingImports]

VERSIONS = "0.4.35,0.6.2,0.8.3,0.9.2,0.10.2"
#: The machine the goldens say they were pinned on (not this one).
ELSEWHERE = {
    "cpu": "GenuineIntel family 6 model 143; avx avx2 fma sse sse2 sse4_1 sse4_2 ssse3",
    "processor": "Intel Xeon",
}
RUNTIME = ["h5py", "filelock", "lazy_loader", "ml_dtypes", "numpy"]


def _git(repo: Path, *args: str) -> str:
    ident = ["-c", "user.name=parity", "-c", "user.email=parity@localhost"]
    done = subprocess.run(
        ["git", *ident, *args], cwd=repo, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PARITY_", "PYTEST_"))}
    env.setdefault("XLA_FLAGS", "--xla_cpu_max_isa=AVX2")
    env["PYTHONPATH"] = str(ROOT / "src")
    return env | (extra or {})


def venv_for(version: str, venvs: Path) -> Path:
    """The python of a virtual environment with jax `version` (made once)."""
    python = venvs / version / "bin" / "python"
    if python.is_file():
        return python
    print(f"making a virtual environment with jax {version} in {venvs / version}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venvs / version)], check=True)
    pins = [f"jax=={version}", f"jaxlib=={version}"]
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-compile", *pins, *RUNTIME],
        check=True,
    )
    return python


def build_project(folder: Path) -> tuple[Path, dict[str, str]]:
    """The project pinned here at its model, its goldens said pinned elsewhere, and the
    refactor and the bug committed on top: `(repo, {"refactor": sha, "epsilon": sha})`."""
    repo = folder / "proj"
    (repo / "src" / "tinyformer").mkdir(parents=True)
    (repo / tf.MODEL_FILE).write_text(tf.MODEL)
    (repo / "producers.py").write_text(tf.PRODUCERS)
    (repo / "pyproject.toml").write_text(f"[tool.parity]\n{tf.TABLE}")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "model")
    pinned = subprocess.run(
        [sys.executable, "-m", "parity", "repin", "--base", "HEAD"],
        cwd=repo, env=_env(_private(folder)), capture_output=True, text=True,
    )  # fmt: skip
    if pinned.returncode:
        raise SystemExit(f"repin failed:\n{pinned.stdout}{pinned.stderr}")
    tf.with_provenance(repo / "goldens" / "forward.h5", ELSEWHERE)
    shas = {}
    for name, text in (("refactor", tf.REFACTOR), ("epsilon", tf.buggy("epsilon"))):
        (repo / tf.MODEL_FILE).write_text(text)
        _git(repo, "commit", "-qam", name)
        shas[name] = _git(repo, "rev-parse", "HEAD")
    return repo, shas


def _private(folder: Path) -> dict[str, str]:
    """A cache of baselines and a log folder of the tool's own, per jax (never the user's)."""
    return {"PARITY_BASELINE_CACHE": str(folder / "baselines"), "PARITY_LOGS": str(folder / "logs")}


def check(python: Path, repo: Path, sha: str, folder: Path) -> dict[str, object]:
    """`parity check --json` at `sha` with `python`: exit code, how the logits passed, the
    origin, any line on what that jax cannot do, seconds."""
    _git(repo, "checkout", "-q", sha)
    report = folder / f"{sha[:12]}.json"
    t0 = time.perf_counter()
    done = subprocess.run(
        [str(python), "-m", "parity", "check", "--json", str(report)],
        cwd=repo, env=_env(_private(folder)), capture_output=True, text=True,
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    row: dict[str, object] = {"exit": done.returncode, "seconds": round(seconds, 1)}
    lines = [ln.strip() for ln in done.stdout.splitlines()]
    row["origin"] = next((ln[len("origin: ") :] for ln in lines if ln.startswith("origin:")), "")
    row["recorder"] = next((ln for ln in lines if ln.startswith("recorder")), "")
    if report.is_file():
        doc = json.loads(report.read_text())
        (finding,) = doc["findings"]
        row["how"] = (
            "proved op by op" if doc["proved"] else
            "bit for bit" if finding["bitwise_equal"] else finding["verdict"]
        )  # fmt: skip
    else:
        row["how"] = "no report: " + (done.stderr.strip().splitlines() or ["?"])[-1][:200]
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--versions", default=VERSIONS, help=f"jax versions (default {VERSIONS})")
    p.add_argument(
        "--venvs",
        type=Path,
        default=Path.home() / ".cache" / "parity" / "jax-matrix",
        help="where the virtual environments are made once (default ~/.cache/parity/jax-matrix)",
    )
    p.add_argument("--json", type=Path, help="write the rows here too")
    args = p.parse_args(argv)
    import jax

    versions = [v.strip() for v in args.versions.split(",") if v.strip()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="parity-jax-matrix-") as tmp:
        repo, shas = build_project(Path(tmp))
        print(f"goldens pinned with jax {jax.__version__}, said pinned on {ELSEWHERE['cpu'][:34]}")
        for version in versions:
            python = sys.executable if version == jax.__version__ else venv_for(version, args.venvs)
            folder = Path(tmp) / version
            folder.mkdir()
            refactor = check(Path(python), repo, shas["refactor"], folder)
            bug = check(Path(python), repo, shas["epsilon"], folder)
            rows.append({"jax": version, "refactor": refactor, "epsilon": bug})
            print(
                f"jax {version:8} refactor: exit {refactor['exit']}, {refactor['how']} "
                f"({refactor['seconds']}s) | epsilon bug: exit {bug['exit']}, origin "
                f"{bug['origin'] or '-'} ({bug['seconds']}s)"
                + "".join(f"\n    {r['recorder']}" for r in (refactor, bug) if r["recorder"]),
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
