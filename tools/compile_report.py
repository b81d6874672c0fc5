#!/usr/bin/env python
"""Compile statistics of every jitted entry point of the subject, optionally A/B against a base.

    python tools/compile_report.py [--layers 32] [--sites N] [--functions a,b] [--json FILE]
    python tools/compile_report.py --base SHA [...]

One row per function (tools/compile_entries.py): lowering and compile seconds, HLO text
bytes, instruction and while-loop counts, XLA's memory analysis. Every function compiles in
a fresh process with jax's persistent cache off, so nothing is shared between rows or arms.
With `--base SHA` the base commit is checked out in a temporary worktree (as repin does; your
checkout is untouched) and both arms are measured, side by side, with current/base ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIELDS = (
    "lower_s",
    "compile_s",
    "hlo_bytes",
    "instructions",
    "while_loops",
    "temp_bytes",
    "argument_bytes",
    "output_bytes",
    "alias_bytes",
)


def _measure_child(args: argparse.Namespace) -> int:
    """In a fresh process: build one entry against `--src` and print its statistics."""
    # parity comes from the current tree, imported before `--src` shadows the packages.
    from parity._compile_stats import compile_stats

    drop = {os.path.realpath(ROOT / "src")}
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") not in drop]
    sys.path.insert(0, os.path.realpath(args.src))
    for mod in [m for m in sys.modules if m == "decomp" or m.startswith("decomp.")]:
        del sys.modules[mod]
    import compile_entries as ce

    structure = ce.Structure(n_layer=args.layers)
    try:
        fn, fargs = ce.ENTRIES[args.measure](structure)
        stats = compile_stats(fn, *fargs, name=args.measure)
    except (ImportError, AttributeError) as e:
        print(json.dumps({"function": args.measure, "error": f"{type(e).__name__}: {e}"}))
        return 0
    print(json.dumps({"function": args.measure, **stats.to_dict()}))
    return 0


def _run_one(name: str, src: Path, layers: int) -> dict[str, Any]:
    from parity.machinery._devices import isolated_env

    # No persistent cache in the child at all: a compile is timed, never a cache load.
    env = {k: v for k, v in isolated_env(1).items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    cmd = [sys.executable, __file__, "--measure", name, "--src", str(src), "--layers", str(layers)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        return {"function": name, "error": f"measurement crashed (exit {proc.returncode}):\n{tail}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    if any("error" in r for r in rows):
        return next(r for r in rows if "error" in r)
    out = dict(rows[0])
    for f in ("lower_s", "compile_s"):
        out[f] = statistics.median(r[f] for r in rows)
    return out


def measure_arm(
    src: Path,
    names: Sequence[str],
    layers: int,
    repeats: int,
    progress: Callable[[str], None],
    arm: str = "current",
) -> list[dict[str, Any]]:
    rows = []
    for i, name in enumerate(names, 1):
        progress(f"[{arm} {i}/{len(names)}] {name}: compiling in a fresh process")
        rows.append(_median_row([_run_one(name, src, layers) for _ in range(repeats)]))
    return rows


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += [
        "  ".join(
            c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    return "\n".join(lines)


def _where(rows: Sequence[dict[str, Any]]) -> str:
    """The line that says where the rows were compiled: the backend names the figures."""
    backends = sorted({str(r["backend"]) for r in rows if r.get("backend")})
    return (
        f"compiled on {', '.join(backends) or 'an unknown backend'}, each in a fresh "
        "process with jax's persistent compilation cache off (a compile, never a cache load)\n"
    )


def format_single(rows: list[dict[str, Any]]) -> str:
    cols = ("compile_s", "lower_s", "hlo_bytes", "instructions", "while_loops", "temp_bytes")
    body = [
        [r["function"], *(_fmt(r.get(c)) if "error" not in r else "n/a" for c in cols)]
        for r in rows
    ]
    text = _where(rows) + _table(("function", *cols), body)
    errors = [f"{r['function']}: {r['error']}" for r in rows if "error" in r]
    by = {r["function"]: r for r in rows if "error" not in r}
    pairs = []
    for new, old in (
        ("forward_scan", "forward_legacy"),
        ("taps_scan", "taps_legacy"),
        ("ci_init_new", "ci_init_legacy"),
        ("sources_init_new", "sources_init_legacy"),
    ):
        if new in by and old in by:
            pairs.append(
                [
                    f"{new} / {old}",
                    f"{by[new]['compile_s'] / by[old]['compile_s']:.2f}x",
                    f"{by[new]['hlo_bytes'] / by[old]['hlo_bytes']:.2f}x",
                ]
            )
    if pairs:
        text += "\n\nnew against legacy\n" + _table(("pair", "compile", "hlo bytes"), pairs)
    if errors:
        text += "\n\nnot measured:\n" + "\n".join(errors)
    return text


def format_ab(base: list[dict[str, Any]], cur: list[dict[str, Any]], sha: str) -> str:
    cols = ("compile_s", "hlo_bytes", "instructions", "temp_bytes")
    body = []
    for b, c in zip(base, cur, strict=True):
        row = [c["function"]]
        for col in cols:
            bv = b.get(col) if "error" not in b else None
            cv = c.get(col) if "error" not in c else None
            ratio = f"{cv / bv:.2f}x" if bv and cv is not None else "-"
            row += [_fmt(bv), _fmt(cv), ratio]
        body.append(row)
    header = ["function"] + [f"{c} {arm}" for c in cols for arm in ("base", "cur", "ratio")]
    header = [h.replace(" ratio", " cur/base") for h in header]
    text = _where([*base, *cur]) + f"base {sha[:12]} against the current tree\n"
    text += _table(header, body)
    errors = [
        f"{arm} {r['function']}: {r['error']}"
        for arm, rows in (("base", base), ("cur", cur))
        for r in rows
        if "error" in r
    ]
    if errors:
        text += "\n\nnot measured:\n" + "\n".join(errors)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--base", help="commit to compare against (measured in a temporary worktree)")
    p.add_argument("--layers", type=int, default=None, help="GLU layers (default 32)")
    p.add_argument("--sites", type=int, default=None, help="sites (7 per layer; sets --layers)")
    p.add_argument("--functions", default="", help="comma-separated subset of entry points")
    p.add_argument("--repeats", type=int, default=1, help="fresh processes per function (median)")
    p.add_argument("--json", type=Path, help="write the rows as JSON")
    p.add_argument(
        "--repo",
        type=Path,
        default=ROOT,
        help="repository whose src/ is measured (default: this one)",
    )
    p.add_argument("--measure", help=argparse.SUPPRESS)
    p.add_argument("--src", default=str(ROOT / "src"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.sites is not None:
        if args.sites % 7:
            p.error(f"--sites must be a multiple of 7 (7 sites per layer), got {args.sites}")
        if args.layers is not None and args.layers * 7 != args.sites:
            p.error(f"--layers {args.layers} has {args.layers * 7} sites, not --sites {args.sites}")
        args.layers = args.sites // 7
    args.layers = 32 if args.layers is None else args.layers
    if args.layers < 1:
        p.error(f"--layers must be at least 1, got {args.layers}")
    if args.measure:
        return _measure_child(args)

    sys.path.insert(0, str(Path(__file__).parent))
    import compile_entries as ce

    names = [n for n in args.functions.split(",") if n] or list(ce.ENTRIES)
    unknown = [n for n in names if n not in ce.ENTRIES]
    if unknown:
        p.error(f"unknown function(s) {unknown}; choose from {', '.join(ce.ENTRIES)}")

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    from parity.machinery._worktree import GitError, resolve_sha, temporary_worktree

    repo = args.repo.resolve()
    sha = ""
    if args.base:
        try:
            sha = resolve_sha(repo, args.base)
        except GitError as e:
            print(f"compile_report: error: {e}", file=sys.stderr)
            return 2
    current = measure_arm(repo / "src", names, args.layers, args.repeats, progress)
    doc: dict[str, Any]
    if args.base:
        try:
            with temporary_worktree(repo, sha) as wt:
                base = measure_arm(wt / "src", names, args.layers, args.repeats, progress, "base")
        except GitError as e:
            print(f"compile_report: error: {e}", file=sys.stderr)
            return 2
        print(format_ab(base, current, sha))
        doc = {
            "layers": args.layers,
            "base_sha": sha,
            "rows": [dict(r, arm="current") for r in current] + [dict(r, arm="base") for r in base],
        }
    else:
        print(format_single(current))
        doc = {"layers": args.layers, "rows": [dict(r, arm="current") for r in current]}
    if args.json:
        # A list of rows, each with function, compile_s, hlo_bytes, instructions, while_loops,
        # temp_bytes (and the arm it belongs to).
        args.json.write_text(json.dumps(doc["rows"], indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
