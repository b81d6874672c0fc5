"""Start-up of `parity diff`: the whole process on two small files against a plain h5py one.

`tools/bench_diff.py` prints this table (and `--startup` prints only it); this file runs
on its own too. Writes two small parity files (the same few float32 arrays, with classes,
class map, order and provenance) and the same arrays as plain h5py files, then runs, in
rounds, each command once per round in turn (so that every command of a round sees the
same load on a shared machine), each as a fresh process:

- `raw`: a plain Python process that imports h5py and numpy, reads both plain files and
  compares every pair with `np.array_equal`: the yardstick (the target is at most 1.2x).
- `parity diff`: `python -m parity diff` on the parity files (checksums verified, every
  array under its class), and on the plain files; and the installed `parity` script (the
  `parity` beside this interpreter, where the package is installed) on the parity files,
  the command as a user types it (no `runpy`).
- `python -c pass` and `import h5py, numpy`: the interpreter, and the imports that the
  raw process pays too.

Printed per command: the median wall time and the median CPU time (user + system, steadier
than wall time on a loaded machine) over `--rounds`; per parity command, its ratio to
`raw` both as the ratio of the medians and as the median of the ratios within one round.

Bytecode (`--bytecode`): `cached` (the default) runs every process with
`PYTHONPYCACHEPREFIX` set to a fresh temporary folder that a first, untimed round fills,
as an installed package runs (pip compiles it); `none` runs them with
`PYTHONDONTWRITEBYTECODE=1` and no cache for `parity` (a source checkout with
`PYTHONDONTWRITEBYTECODE` set: every module of parity compiled from source on every run;
numpy and h5py keep the bytecode of their install). `both` prints the two tables.

Usage:

    python tools/bench_startup.py [--rounds 11] [--bytecode cached|none|both] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from parity.judge._tolerance import ClassMap
from parity.store import write_goldens
from parity.store._provenance import collect_provenance

#: The plain process parity diff is measured against (tools/bench_diff.py uses it too).
RAW_PROCESS = """
import sys
import h5py
import numpy as np

with h5py.File(sys.argv[1], "r") as fa, h5py.File(sys.argv[2], "r") as fg:
    names = []
    fg.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    ok = all(np.array_equal(fa[n][()], fg[n][()]) for n in names)
print("equal" if ok else "differ")
"""


def small_arrays() -> dict[str, np.ndarray]:
    """Eight float32 arrays of a few KiB, named like a model's taps, and a scalar loss."""
    rng = np.random.default_rng(0)
    arrays = {
        f"taps.layers.{i}": rng.standard_normal((4, 12, 32)).astype(np.float32) for i in range(8)
    }
    arrays["loss"] = np.asarray(rng.standard_normal(), dtype=np.float32)
    return arrays


def write_files(folder: Path) -> dict[str, Path]:
    """Write the parity pair (`actual`, `golden`) and the plain pair (`actual_plain`,
    `golden_plain`) of `small_arrays` in `folder`; **returns** name -> path."""
    arrays = small_arrays()
    cmap = ClassMap((("taps.*", "fp32_reassoc"),), default="bitwise")
    paths = {name: folder / f"{name}.h5" for name in ("actual", "golden")}
    for path in paths.values():
        write_goldens(
            path,
            arrays,
            classes={k: cmap.class_for(k) for k in arrays},
            class_map_json=cmap.to_json(),
            order=list(arrays),
            provenance=collect_provenance(base_sha="0" * 40),
        )
    for name in ("actual_plain", "golden_plain"):
        paths[name] = folder / f"{name}.h5"
        with h5py.File(paths[name], "w") as f:
            for key, value in arrays.items():
                f.create_dataset(key.replace(".", "/"), data=value)
    return paths


def _timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run `cmd` to its end; **returns** (wall seconds, CPU seconds of the process)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err.decode(errors='replace')}")
    return wall, usage.ru_utime + usage.ru_stime


def measure(paths: dict[str, Path], rounds: int, bytecode: str) -> dict[str, Any]:
    """The rounds of one bytecode mode (`cached` or `none`, see the module docstring);
    **returns** per command its wall and CPU times, medians and ratios to `raw`."""
    py = sys.executable
    commands = {
        "raw": [py, "-c", RAW_PROCESS, str(paths["actual_plain"]), str(paths["golden_plain"])],
        "parity diff": [py, "-m", "parity", "diff", str(paths["actual"]), str(paths["golden"])],
        "parity diff, plain files": [
            py,
            "-m",
            "parity",
            "diff",
            str(paths["actual_plain"]),
            str(paths["golden_plain"]),
        ],
        "python -c pass": [py, "-c", "pass"],
        "import h5py, numpy": [py, "-c", "import h5py, numpy"],
    }
    script = shutil.which("parity", path=str(Path(py).parent))
    if script is not None:  # the installed `parity` script: `parity diff` as a user types it
        typed = [script, "diff", str(paths["actual"]), str(paths["golden"])]
        items = list(commands.items())
        commands = dict([*items[:2], ("parity diff (the script)", typed), *items[2:]])
    times: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in commands}
    with tempfile.TemporaryDirectory(prefix="bench_startup_pyc_") as pyc:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")
        }
        if bytecode == "cached":
            env["PYTHONPYCACHEPREFIX"] = pyc
        else:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        for cmd in commands.values():  # untimed: fills the bytecode and the page cache
            _timed(cmd, env)
        for r in range(rounds):
            names = list(commands)
            for name in names[r % len(names) :] + names[: r % len(names)]:
                wall, cpu = _timed(commands[name], env)
                times[name]["wall"].append(wall)
                times[name]["cpu"].append(cpu)
    rows: dict[str, Any] = {}
    raw = times["raw"]
    for name, t in times.items():
        row: dict[str, Any] = {
            "wall_s": statistics.median(t["wall"]),
            "cpu_s": statistics.median(t["cpu"]),
            "runs": t,
        }
        for kind in ("wall", "cpu"):
            row[f"{kind}_ratio_of_medians"] = row[f"{kind}_s"] / statistics.median(raw[kind])
            row[f"{kind}_median_ratio"] = statistics.median(
                a / b for a, b in zip(t[kind], raw[kind], strict=True)
            )
        rows[name] = row
    return rows


def print_table(rows: dict[str, Any], rounds: int, bytecode: str) -> None:
    """Print `measure`'s rows: medians, and each command's ratio to `raw`."""
    print(
        f"start-up, two small files; bytecode {bytecode}; median of {rounds} rounds; ratio "
        "to raw: of the medians / median within a round (goal: parity diff <= 1.2x)"
    )
    print(f"  {'command':<26} {'wall s':>7} {'cpu s':>7}  {'wall ratio':>11}  {'cpu ratio':>11}")
    for name, row in rows.items():
        print(
            f"  {name:<26} {row['wall_s']:7.3f} {row['cpu_s']:7.3f}  "
            f"{row['wall_ratio_of_medians']:5.2f}/{row['wall_median_ratio']:<5.2f}  "
            f"{row['cpu_ratio_of_medians']:5.2f}/{row['cpu_median_ratio']:<5.2f}"
        )


def startup(rounds: int, bytecode: str = "cached") -> dict[str, Any]:
    """Write the files, measure in the bytecode mode(s) asked (`cached`, `none`, `both`),
    print each table; **returns** mode -> rows."""
    modes = ("cached", "none") if bytecode == "both" else (bytecode,)
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
        paths = write_files(Path(tmp))
        for mode in modes:
            figures[mode] = measure(paths, rounds, mode)
            print_table(figures[mode], rounds, mode)
    return figures


def main(argv: list[str] | None = None) -> int:
    """Run the start-up benchmark and print its figures; **returns** 0."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=11, help="runs per command (median)")
    parser.add_argument("--bytecode", choices=("cached", "none", "both"), default="cached")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    figures = startup(args.rounds, args.bytecode)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
