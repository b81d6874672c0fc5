"""This repository's equivalence on whatever backend jax has: a GPU, a TPU, or a CPU (issue
49; docs/adopting.md, "On a GPU or TPU").

Runs `parity check` on the clean tree, then on copies of the tree with deliberate changes
(a 10% RMS-norm epsilon by default), each under every `--env` setting asked for (e.g.
`JAX_DEFAULT_MATMUL_PRECISION=highest`, `JAX_PLATFORMS=cpu` for a CPU check on an
accelerator's host), and optionally `parity calibrate`; prints each run's exit status, its
verdict lines, the header lines that say what was judged against what, and its time. The
user's checkout is never edited: a change is made in a copy (its git history included, so
that the baseline can be re-produced at the goldens' base commit).

    python tools/accelerator_check.py                       # clean + eps10, default env
    python tools/accelerator_check.py --env JAX_DEFAULT_MATMUL_PRECISION=highest --env ''
    python tools/accelerator_check.py --calibrate --log /tmp/acc

A script that prints figures (docs/design.md: benchmarks are scripts, tests assert
behaviour); one check at a time, since an accelerator is held by one process.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_GROUPS = "forward_llama,forward_bf16,eval,train_branches"


@dataclass(frozen=True)
class Change:
    """A deliberate change of the subject, made as a text edit in a copy of the tree."""

    path: str
    old: str
    new: str
    what: str


#: The deliberate changes this tool can make (the sensitivity tests' kind, at tree level).
CHANGES: dict[str, Change] = {
    "eps10": Change(
        "src/decomp/nn.py",
        "keepdims=True) + eps)",
        "keepdims=True) + eps * 1.1)",
        "the RMS norm's epsilon 10% larger (1e-6 -> 1.1e-6)",
    ),
    "eps1000": Change(
        "src/decomp/nn.py",
        "keepdims=True) + eps)",
        "keepdims=True) + eps * 1000.0)",
        "the RMS norm's epsilon 1000x larger (1e-6 -> 1e-3)",
    ),
}

#: Lines of a check's output worth quoting: the verdicts, and what was judged against what.
_KEEP = re.compile(
    r"^(parity[:\s]|\s*(pinned on|checked on|sees|reference|environment|drift \d|first|origin)\b|"
    r".*\b(PASS|FAIL|not exact|error|skipped|measured against|perturbations)\b)",
    re.IGNORECASE,
)
_IGNORE = (".venv", ".whl-tpu", ".acc", "reports", "__pycache__", ".pytest_cache", ".ruff_cache")


def _copy_with(change: Change, into: Path) -> Path:
    """A copy of the checkout (git history included) with `change` made."""
    tree = into / "tree"
    shutil.copytree(ROOT, tree, symlinks=True, ignore=shutil.ignore_patterns(*_IGNORE))
    target = tree / change.path
    text = target.read_text()
    if change.old not in text:
        raise SystemExit(f"cannot make the change: {change.old!r} is not in {change.path}")
    target.write_text(text.replace(change.old, change.new, 1))
    return tree


def _env(setting: str) -> dict[str, str]:
    env = dict(os.environ)
    src = str(ROOT / "src")
    if src not in env.get("PYTHONPATH", "").split(os.pathsep):  # parity itself, from here
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), src]))
    env["PYTHONUNBUFFERED"] = "1"
    if setting:
        name, _, value = setting.partition("=")
        env[name] = value
    return env


def _run(argv: list[str], cwd: Path, setting: str, label: str, log: Path | None) -> int:
    t0 = time.perf_counter()
    done = subprocess.run(
        argv, cwd=cwd, env=_env(setting), capture_output=True, text=True, check=False
    )
    took = time.perf_counter() - t0
    output = done.stdout + done.stderr
    print(f"== {label} [{setting or 'default env'}]: exit {done.returncode} in {took:.1f}s")
    print(f"   $ {' '.join(argv[2:])}")
    for line in output.splitlines():
        if _KEEP.match(line):
            print(f"   {line.rstrip()[:400]}")
    if log is not None:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{label}-{setting or 'default'}")
        (log / f"{name}.log").write_text(output)
    sys.stdout.flush()
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--groups", default=DEFAULT_GROUPS, help=f"default {DEFAULT_GROUPS}")
    ap.add_argument("--changes", default="eps10", help=f"of {', '.join(CHANGES)}; '' for none")
    ap.add_argument("--env", action="append", default=None,
                    help="NAME=VALUE for a pass of every run ('' for the default env); "
                         "repeatable")  # fmt: skip
    ap.add_argument("--calibrate", action="store_true",
                    help="also `parity calibrate --groups forward_llama --perturb "
                         "isa,devices,processes,repeat`")  # fmt: skip
    ap.add_argument("--check-args", default="", help="more arguments for parity check")
    ap.add_argument("--log", type=Path, help="folder for every run's whole output")
    args = ap.parse_args(argv)
    settings = args.env if args.env is not None else [""]
    if args.log is not None:
        args.log.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT / "src"))
    from parity.calibration._perturbations import backend_here

    t0 = time.perf_counter()
    here = backend_here()
    print(f"backend here: {here} (asked in {time.perf_counter() - t0:.1f}s); sockets "
          f"{'allowed' if here.sockets else 'refused'}")  # fmt: skip
    check = [sys.executable, "-m", "parity", "check", "--groups", args.groups]
    check += args.check_args.split()
    codes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="parity-acc-") as tmp:
        trees = {"clean": ROOT}
        for name in filter(None, args.changes.split(",")):
            change = CHANGES[name]
            trees[name] = _copy_with(change, Path(tmp) / name)
            print(f"change {name}: {change.what} ({change.path})")
        for setting in settings:
            for name, tree in trees.items():
                codes[f"{name} [{setting or 'default'}]"] = _run(
                    check, tree, setting, f"check {name}", args.log
                )
        if args.calibrate:
            cal = [sys.executable, "-m", "parity", "calibrate", "--groups", "forward_llama",
                   "--perturb", "isa,devices,processes,repeat"]  # fmt: skip
            codes["calibrate"] = _run(cal, ROOT, "", "calibrate", args.log)
    print("summary: " + "; ".join(f"{k}: exit {v}" for k, v in codes.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
