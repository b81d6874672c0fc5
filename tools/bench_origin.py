"""Where `parity check` localises deliberate bugs on this repository's own goldens, and what
naming the origin costs (issue 47): the producers here do not trace as a whole, so each
origin rests on the programs they run being recorded (docs/design.md, "The unit is the
programs a producer runs").

For each bug (nine in the forward, four in the training code), the working tree's tracked
files are copied over a temporary worktree of HEAD (the goldens' base commit is in the
history; the user's checkout is never touched), the bug is applied, and

    parity check --groups GROUP --json REPORT

runs three times with a private cache of baselines: `--origin off` (the verdict alone),
then with the origin with an empty cache (the base re-produced and recorded), then again
with the base's recording cached. Printed per bug: how many producer runs each started
(the tree, the base, the recordings), the exit code, the origin's
`file:line in function` (and the library frame where the operation runs inside one), the
kind of change it is and the frames that called it (issue 58), and whether that function is
the one holding the changed line, the edit of the diff from the goldens' base commit that
the origin's line names and whether it is the changed line (issue 74), the seconds of each
run, and the largest resident memory of any process the runs started (`RUSAGE_CHILDREN`).
The last line is the share of bugs whose edit was named at the changed line.

    XLA_FLAGS=--xla_cpu_max_isa=AVX2 .venv/bin/python tools/bench_origin.py [--only NAME]
        [--group GROUP] [--edit-only]

`--edit-only` runs the check with its origin once per bug (no verdict-only or cold run: the
timings are then not printed), for the edit's share alone.

Issue 47 asks, on these 2-core machines, for a failing `forward_llama` check's origin in at
most 60 s more than its verdict with the base's recording cached, a train group's in at most
5 minutes, and at most 2 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from parity.machinery._worktree import git, temporary_worktree  # noqa: E402


@dataclass(frozen=True)
class Bug:
    """A deliberate change: `old` -> `new` in `file`, expected to be named in `function`."""

    name: str
    group: str
    file: str
    old: str
    new: str
    function: str


NN, GLU = "src/decomp/nn.py", "src/decomp/targets/glu_transformer.py"
BUGS = (
    Bug("epsilon", "forward_llama", NN, "keepdims=True) + eps)", "keepdims=True) + 1.1 * eps)",
        "rms_norm"),
    Bug("rotary base", "forward_llama", NN, "inv_freq = 1.0 / (theta**exponents)",
        "inv_freq = 1.0 / ((1.1 * theta) ** exponents)", "rope_inv_freq"),
    Bug("activation", "forward_llama", GLU, "inner = jax.nn.silu(site(",
        "inner = jax.nn.gelu(site(", "_block"),
    Bug("attention scale", "forward_llama", NN, "/ math.sqrt(head_dim)",
        "/ math.sqrt(head_dim + 1)", "attention"),
    Bug("rotate-half sign", "forward_llama", NN, "jnp.concatenate([-x2, x1], axis=-1)",
        "jnp.concatenate([x2, x1], axis=-1)", "_rotate_half"),
    # Issue 58's kinds of edit: a step removed, a read rewired, two arguments swapped at a
    # call site, an argument changed at a call site (named inside the callee, the call in
    # the chain).
    Bug("removed step", "forward_llama", GLU,
        'mlp_in = nn.rms_norm(post, layer["ln2"], cfg.rms_norm_eps)', "mlp_in = post", "_block"),
    Bug("rewired read", "forward_llama", GLU, 'k = site("k", h1)', 'k = site("k", x)', "_block"),
    Bug("swapped arguments", "forward_llama", GLU, "nn.apply_rope(q, cos, sin)",
        "nn.apply_rope(q, sin, cos)", "_block"),
    Bug("call-site argument", "forward_llama", GLU,
        'h1 = nn.rms_norm(x, layer["ln1"], cfg.rms_norm_eps)',
        'h1 = nn.rms_norm(x, layer["ln1"], 2 * cfg.rms_norm_eps)', "_block"),
    Bug("mask key", "train_remat_nothing", "src/decomp/masks.py",
        "jax.random.fold_in(key, i))(jnp.asarray(positions))",
        "jax.random.fold_in(key, i + 1))(jnp.asarray(positions))", "stochastic_masks_by_kind"),
    Bug("faithfulness term", "train_remat_nothing", "src/decomp/losses.py",
        "return sum_in_order(layout.canonical(per_site)) / count",
        "return sum_in_order(layout.canonical(per_site)) / (count - 1)", "faithfulness_loss"),
    Bug("adam eps", "train_remat_nothing", "src/decomp/train.py",
        "optax.adamw(config.lr_components, weight_decay=config.weight_decay)",
        "optax.adamw(config.lr_components, eps=1e-6, weight_decay=config.weight_decay)",
        "_train_step"),
    # Adam's bias correction cancels b1 in the first step up to rounding: see the notes.
    Bug("adam b1", "train_remat_nothing", "src/decomp/train.py",
        "optax.adamw(config.lr_components, weight_decay=config.weight_decay)",
        "optax.adamw(config.lr_components, b1=0.8, weight_decay=config.weight_decay)",
        "_train_step"),
)  # fmt: skip


def _copy_tree(tree: Path) -> None:
    for rel in git(ROOT, "ls-files", "-z").split("\0"):
        if rel and (ROOT / rel).is_file():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, tree / rel)


def _runs(stderr: str) -> int:
    """How many producer runs a command started: each says when it starts its first group."""
    return len(re.findall(r"^\[producers\] \[1/\d+\] \S+: (?:running|recording)$", stderr, re.M))


def _check(tree: Path, bug: Bug, cache: Path, *args: str) -> tuple[int, float, dict, int]:
    report = cache.parent / "report.json"
    report.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PARITY_", "PYTEST_"))}
    env["PARITY_BASELINE_CACHE"] = str(cache)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "parity", "check", "--groups", bug.group, "--json", str(report),
         *args],
        cwd=tree, env=env, capture_output=True, text=True,
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    doc = json.loads(report.read_text()) if report.is_file() else {}
    return proc.returncode, seconds, doc, _runs(proc.stderr)


def _edit_named(origin: dict | None, bug: Bug, text: str) -> str:
    """The edit the origin names, and whether one of its hunks holds the bug's line."""
    edit = (origin or {}).get("edit")
    if not edit:
        return "MISS (no edit said)"
    at = text[: text.index(bug.new)].count("\n") + 1
    named = [(h["file"], h["start"], len(h["added"])) for h in edit["hunks"]]
    hit = any(f == bug.file and s <= at < s + max(n, 1) for f, s, n in named)
    shown = ", ".join(f"{f}:{s}" for f, s, _ in named[:3]) or "none"
    alone = " alone" if len(named) == 1 else f" among {len(named)}"
    verdict = f"OK{alone}" if hit else f"MISS (expected {bug.file}:{at})"
    return f"{verdict}: {shown} by {edit['evidence']} of {edit['of']} hunks"


def run(bug: Bug, edit_only: bool = False) -> bool:
    """Checks `bug` and prints what was named; **returns** whether its edit was named at
    the changed line."""
    with temporary_worktree(ROOT, "HEAD") as tree, tempfile.TemporaryDirectory() as tmp:
        _copy_tree(tree)
        path = tree / bug.file
        text = path.read_text()
        if text.count(bug.old) != 1:
            print(f"{bug.name}: {bug.file} no longer holds {bug.old!r} once; skipped")
            return False
        text = text.replace(bug.old, bug.new)
        path.write_text(text)
        cache = Path(tmp) / "baselines"
        if edit_only:
            code, cached_s, doc, cached_n = _check(tree, bug, cache)
            verdict_s = cold_s = float("nan")
            verdict_n = cold_n = 0
        else:
            code, verdict_s, _, verdict_n = _check(tree, bug, cache, "--origin", "off")
            shutil.rmtree(cache, ignore_errors=True)  # the origin's cold run builds the base
            _, cold_s, _, cold_n = _check(tree, bug, cache)
            _, cached_s, doc, cached_n = _check(tree, bug, cache)
    checks = doc.get("checks") or [{}]
    origin, line = checks[0].get("origin"), checks[0].get("origin_line") or ""
    where = "not named"
    if origin:
        where = f"{origin['file']}:{origin['line']} in {origin['function']}"
        where += f" [{origin['primitive']}]" + (
            f" (in {origin['library']})" if origin.get("library") else ""
        )
    # The function holding the changed line, or a lambda or comprehension inside it; or,
    # for an argument changed at a call site, a frame of the chain that called the origin.
    function = origin["function"].split(".<locals>")[0] if origin else ""
    hit = bool(origin) and function == bug.function and origin["file"] == bug.file
    callers = origin.get("chain", [])[1:] if origin else []
    hit = hit or any(f.startswith(f"{bug.file}:") and f.endswith(f" in {bug.function}")
                     for f in callers)  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"{bug.name:18s} {bug.group:20s} exit {code}  {where}  "
          f"{'OK' if hit else 'MISS (expected ' + bug.function + ')'}")  # fmt: skip
    edit = _edit_named(origin, bug, text)
    print(f"{'':18s} the edit: {edit}")
    if edit_only:
        print(f"{'':18s} {cached_s:.1f} s; peak RSS of a child so far {peak:.0f} MiB")
        return edit.startswith("OK")
    print(f"{'':18s} verdict {verdict_s:6.1f} s; with origin, cold {cold_s:6.1f} s "
          f"(+{cold_s - verdict_s:.1f}), base cached {cached_s:6.1f} s "
          f"(+{cached_s - verdict_s:.1f}); peak RSS of a child so far {peak:.0f} MiB")  # fmt: skip
    print(f"{'':18s} producer runs: verdict {verdict_n}, with origin cold {cold_n}, "
          f"base cached {cached_n}")  # fmt: skip
    if origin and origin.get("change"):  # the kind of change (issue 58) and the frames above
        print(f"{'':18s} {origin['change']}: {origin['change_detail']}")
    if origin and len(origin.get("chain") or ()) > 1:
        print(f"{'':18s} called from {' < '.join(origin['chain'][1:4])}")
    if not origin:
        print(f"{'':18s} {line}")
    elif origin.get("beyond"):
        b = origin["beyond"]
        print(f"{'':18s} by the class's tolerance alone: {b['file']}:{b['line']} in "
              f"{b['function']} [{b['primitive']}]")  # fmt: skip
    return edit.startswith("OK")


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--only", default=None, help="run only the bug of this name")
    p.add_argument("--group", default=None, help="run only the bugs of this group")
    p.add_argument("--edit-only", action="store_true", help="one check each, for the edit")
    args = p.parse_args()
    print(f"processor: {_processor()}")
    hits: list[bool] = []
    for bug in BUGS:
        if args.only in (None, bug.name) and args.group in (None, bug.group):
            hits.append(run(bug, args.edit_only))
    print(f"the edit named at the changed line: {sum(hits)} of {len(hits)} bugs")


def _processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
