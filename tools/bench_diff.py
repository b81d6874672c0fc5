"""Throughput of `parity diff` against a raw h5py read-and-`np.array_equal` loop.

Writes two pairs of files holding the same ~600 arrays (float32 taps of shape (4, 12, 32)
and (4, 12, 64), (32, 8) weights, scalars; a few MB in all): plain h5py files for the raw
loop, parity files (checksums, classes, order, provenance) for parity. Then times, as the
median of `--repeats` runs:

- `raw`: open both plain files, list their datasets, read each pair, `np.array_equal`.
- `parity`: `parity._cli.run_diff` on the parity files plus `format_table`, the in-process
  path of `python -m parity diff` (checksums verified, every array compared under its
  class).
- `parity_plain`: the same on the plain files (no checksums or attributes to read).
- `cli`: wall time of `python -m parity diff` as a subprocess (on the parity files, and on
  the plain files the raw process reads), and of `python -c "import parity._cli"` for the
  interpreter and import share of it.
- `raw_process`: wall time of a plain Python process that imports h5py and numpy, reads
  both plain files and compares every pair with `np.array_equal` (the `raw` loop as a
  whole process): the yardstick of `cli`. These processes run with
  `PYTHONDONTWRITEBYTECODE=1`, so parity is compiled from source on every run; the start-up
  table below measures `parity diff` as installed (bytecode cached) too. Start-up counts
  here: `parity diff` imports neither jax nor ml_dtypes for float32 files (ml_dtypes 0.7.0
  alone takes 0.5 s or more to import).

Then the start-up table (`tools/bench_startup.py`, which says what it runs): `python -m
parity diff` of two small files as a whole process against the raw process, each the
median of `--rounds` rounds, the ratio measured in the same run (the target is at most
1.2x), with the bytecode cached (`--bytecode cached`, as installed), compiled on every
run (`none`) or both. `--startup` prints that table alone.

With `--sizes`, the scale table instead (issue: bounded memory on large goldens): for each
size, two parity files each holding one bfloat16 array of about that many bytes (shaped
like logits, `[8, T, V]`; the actual a copy of the golden with one element in 8 moved by
one ulp, and again with none moved), written in a temporary folder and deleted after;
with `--plain`, plain h5py files (no parity attributes) of one float32 array instead,
which `parity diff` reads by hyperslab in the same chunks. `--memory MIB` is passed to
`parity diff` (its default budget, 512 MiB, otherwise): at a budget below the smallest
file every size is compared in chunks of one size, so peak RSS must not grow with the
size, which small files then show as well as files of GiB.
Each figure is a fresh process, its peak RSS read from `os.wait4`, the median of
`--repeats` runs:

- `plain`: h5py reads both whole arrays, `np.array_equal` (no checksum, no figures): the
  yardstick of throughput;
- `parity`: `python -m parity diff` (checksums verified, every figure of a finding), with
  its default memory budget;

and the same for a file of `--many` small arrays (0 to skip). Throughput is the bytes of
both files over the wall time.

Usage:

    python tools/bench_diff.py [--repeats 5] [--json FILE] [--profile]
        [--startup] [--rounds 11] [--bytecode cached|none|both]
    python tools/bench_diff.py --sizes 64M,1G,4G [--plain] [--memory MIB] [--many 100000]
        [--repeats 3] [--json FILE]

`--profile` prints the top functions of one in-process `parity diff` under cProfile.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from parity._cli import run_diff
from parity.judge._tolerance import ClassMap
from parity.report import format_table
from parity.store import write_goldens
from parity.store._provenance import collect_provenance

# (shape, count) per kind: 600 arrays, about 3.3 MB of float32.
_MIX = (("taps", (4, 12, 32), 200), ("mlp", (4, 12, 64), 150), ("weights", (32, 8), 150))
_N_SCALARS = 100


def make_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    """The benchmark's arrays: ~600 float32 keys in a realistic mix of shapes.

    **Arguments:**

    - `seed`: the random seed.

    **Returns:** key -> array, keys like `"taps.layers.17"`, `"scalars.3"`.
    """
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for kind, shape, count in _MIX:
        for i in range(count):
            arrays[f"{kind}.layers.{i}"] = rng.standard_normal(shape).astype(np.float32)
    for i in range(_N_SCALARS):
        arrays[f"scalars.{i}"] = np.asarray(rng.standard_normal(), dtype=np.float32)
    return {k: np.asarray(v) for k, v in arrays.items()}


def write_plain(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write `arrays` with bare h5py, one dataset per key at its path with '.' -> '/'."""
    with h5py.File(path, "w") as f:
        for key, value in arrays.items():
            f.create_dataset(key.replace(".", "/"), data=value)


def write_parity(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write `arrays` as a parity golden file with classes, class map, order, provenance."""
    cmap = ClassMap((("taps.*", "fp32_reassoc"), ("mlp.*", "fp32_reassoc")), default="bitwise")
    write_goldens(
        path,
        arrays,
        classes={k: cmap.class_for(k) for k in arrays},
        class_map_json=cmap.to_json(),
        provenance=collect_provenance(base_sha="0" * 40),
        order=sorted(arrays, key=lambda k: (k.split(".")[0], int(k.rsplit(".", 1)[1]))),
    )


def raw_diff(actual: Path, golden: Path) -> bool:
    """The baseline: read every dataset of both plain files and `np.array_equal` them.

    **Returns:** whether every dataset is equal (and both files list the same ones).
    """
    with h5py.File(actual, "r") as fa, h5py.File(golden, "r") as fg:
        names: list[str] = []
        fg.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        ok = True
        for name in names:
            a = fa[name]
            g = fg[name]
            assert isinstance(a, h5py.Dataset) and isinstance(g, h5py.Dataset)
            ok &= bool(np.array_equal(a[()], g[()]))
        return ok


def parity_diff(actual: Path, golden: Path) -> bool:
    """`python -m parity diff` in process: `run_diff` and the terminal table.

    **Returns:** whether every array holds its class.
    """
    result = run_diff(actual, golden)
    format_table(result.comparison, header=result.header)
    return result.comparison.passed


def _median_s(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm the page cache and imports
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its figures.

    **Arguments:**

    - `argv`: command-line arguments (see the module docstring).

    **Returns:** 0.
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure (median)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--profile", action="store_true", help="cProfile one parity diff")
    parser.add_argument(
        "--sizes", metavar="LIST", help="the scale table at these file sizes (64M,1G,4G)"
    )
    parser.add_argument(
        "--many", type=int, default=100_000, help="small arrays in the --sizes table's last row"
    )
    parser.add_argument(
        "--plain",
        action="store_true",
        help="--sizes: plain h5py files of float32 (no parity attributes) instead of goldens",
    )
    parser.add_argument(
        "--memory",
        type=int,
        metavar="MIB",
        help="--sizes: parity diff --memory MIB (default: its own, 512); a budget below the "
        "smallest file shows peak RSS flat across sizes without files of GiB",
    )
    parser.add_argument("--startup", action="store_true", help="only the start-up table")
    parser.add_argument("--rounds", type=int, default=11, help="start-up: rounds (median)")
    parser.add_argument("--bytecode", choices=("cached", "none", "both"), default="cached")
    args = parser.parse_args(argv)
    import bench_startup  # tools/bench_startup.py, beside this file

    if args.startup:
        startup = bench_startup.startup(args.rounds, args.bytecode)
        if args.json:
            Path(args.json).write_text(json.dumps({"startup": startup}, indent=2) + "\n")
        return 0
    if args.sizes:
        sizes = [_parse_size(t) for t in args.sizes.split(",")]
        return scale_table(
            sizes, args.many, args.repeats, args.json, plain_files=args.plain, memory=args.memory
        )

    arrays = make_arrays()
    with tempfile.TemporaryDirectory(prefix="bench_diff_") as tmp:
        d = Path(tmp)
        write_plain(d / "actual_plain.h5", arrays)
        write_plain(d / "golden_plain.h5", arrays)
        write_parity(d / "actual.h5", arrays)
        write_parity(d / "golden.h5", arrays)
        n_bytes = sum(a.nbytes for a in arrays.values())
        sizes = {p.name: p.stat().st_size for p in d.iterdir()}
        pa, pg = d / "actual.h5", d / "golden.h5"
        qa, qg = d / "actual_plain.h5", d / "golden_plain.h5"
        assert raw_diff(qa, qg) and parity_diff(pa, pg) and parity_diff(qa, qg)

        raw_s = _median_s(lambda: raw_diff(qa, qg), args.repeats)
        parity_s = _median_s(lambda: parity_diff(pa, pg), args.repeats)
        plain_s = _median_s(lambda: parity_diff(qa, qg), args.repeats)
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        cli = [sys.executable, "-m", "parity", "diff", str(pa), str(pg)]
        cli_s = _median_s(
            lambda: subprocess.run(cli, check=True, capture_output=True, env=env), args.repeats
        )
        cli_plain = [sys.executable, "-m", "parity", "diff", str(qa), str(qg)]
        cli_plain_s = _median_s(
            lambda: subprocess.run(cli_plain, check=True, capture_output=True, env=env),
            args.repeats,
        )
        raw_proc = [sys.executable, "-c", bench_startup.RAW_PROCESS, str(qa), str(qg)]
        raw_wall_s = _median_s(lambda: _run(raw_proc), args.repeats)
        imp = [sys.executable, "-c", "import parity._cli"]
        import_s = _median_s(lambda: _run(imp), args.repeats)

        if args.profile:
            prof = cProfile.Profile()
            prof.runcall(parity_diff, pa, pg)
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
            print(text.getvalue())

    figures = {
        "arrays": len(arrays),
        "array_bytes": n_bytes,
        "file_bytes": sizes,
        "repeats": args.repeats,
        "raw_s": raw_s,
        "parity_s": parity_s,
        "parity_plain_s": plain_s,
        "ratio_parity_raw": parity_s / raw_s,
        "ratio_parity_plain_raw": plain_s / raw_s,
        "cli_wall_s": cli_s,
        "raw_process_wall_s": raw_wall_s,
        "ratio_cli_raw_process": cli_s / raw_wall_s,
        "cli_plain_wall_s": cli_plain_s,
        "ratio_cli_plain_raw_process": cli_plain_s / raw_wall_s,
        "import_wall_s": import_s,
    }
    print(f"{len(arrays)} arrays, {n_bytes / 1e6:.2f} MB of data; median of {args.repeats} runs")
    print(f"  raw h5py read + np.array_equal     {raw_s:8.4f} s")
    print(f"  parity diff (in process, checked)  {parity_s:8.4f} s   {parity_s / raw_s:5.2f}x raw")
    print(f"  parity diff on the plain files     {plain_s:8.4f} s   {plain_s / raw_s:5.2f}x raw")
    print(
        f"  python -m parity diff (wall)       {cli_s:8.4f} s   {cli_s / raw_wall_s:5.2f}x "
        "the raw process (parity compiled each run)"
    )
    print(
        f"  ... on the plain files (wall)      {cli_plain_s:8.4f} s   "
        f"{cli_plain_s / raw_wall_s:5.2f}x the raw process"
    )
    print(f"  raw h5py process (wall)            {raw_wall_s:8.4f} s")
    print(f"  python -c 'import parity._cli'      {import_s:8.4f} s")
    figures["startup"] = bench_startup.startup(args.rounds, args.bytecode)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


# --------------------------------------------------------------------------- scale table

_WRITE_BIG = """
import sys
import h5py
import ml_dtypes
import numpy as np
from parity.store import write_goldens

n_bytes, vocab, every = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
plain = sys.argv[4] == "plain"
golden, actual = sys.argv[5], sys.argv[6]
# Plain HDF5 has no bfloat16: plain files hold float32.
dtype = np.dtype(np.float32 if plain else ml_dtypes.bfloat16)
t = max(1, n_bytes // (dtype.itemsize * 8 * vocab))
rng = np.random.default_rng(0)
g = np.empty((8, t, vocab), dtype)
for i in range(8):  # drawn a slice at a time: the float32 draw is twice the bf16 array
    g[i] = (4 * rng.standard_normal((t, vocab), dtype=np.float32)).astype(dtype)


def write(path, classes):
    if not plain:
        write_goldens(path, {"logits": g}, classes=classes)
        return
    with h5py.File(path, "w") as f:
        f.create_dataset("logits", data=g)


write(golden, {"logits": "fp32_reassoc"})
if every:  # one ulp on one element in `every`
    g.view(f"u{dtype.itemsize}").reshape(-1)[::every] ^= 1
write(actual, {})
"""

_WRITE_MANY = """
import sys
import h5py
import numpy as np
from parity.store import write_goldens

n, plain, golden, actual = int(sys.argv[1]), sys.argv[2] == "plain", sys.argv[3], sys.argv[4]
rng = np.random.default_rng(0)
arrays = {f"acts.{i // 1000}.k{i}": rng.standard_normal(16).astype(np.float32) for i in range(n)}


def write(path, classes):
    if not plain:
        write_goldens(path, arrays, classes=classes)
        return
    with h5py.File(path, "w") as f:
        for key, value in arrays.items():
            f.create_dataset(key.replace(".", "/"), data=value)


write(golden, dict.fromkeys(arrays, "fp32_reassoc"))
for i, v in enumerate(arrays.values()):
    if i % 8 == 0:
        v.view(np.uint32)[0] ^= 1
write(actual, {})
"""

_PLAIN_READ = """
import sys
import h5py
import numpy as np

with h5py.File(sys.argv[1], "r") as fa, h5py.File(sys.argv[2], "r") as fg:
    names = []
    fg.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    same = [np.array_equal(fa[n][()], fg[n][()]) for n in names]
print(sum(same), len(same))
"""


def _parse_size(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _timed_process(cmd: list[str]) -> tuple[float, float, float, int]:
    """Run `cmd`; **returns** (wall seconds, CPU seconds, peak RSS in bytes, exit status)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024.0, proc.returncode


def _measure(cmd: list[str], repeats: int, ok: tuple[int, ...]) -> dict[str, float]:
    walls, cpus, peaks = [], [], []
    _timed_process(cmd)  # warm the page cache
    for _ in range(repeats):
        wall, cpu, peak, code = _timed_process(cmd)
        if code not in ok:
            raise SystemExit(f"{' '.join(cmd)} exited {code}")
        walls.append(wall)
        cpus.append(cpu)
        peaks.append(peak)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus),
            "peak_rss": max(peaks)}  # fmt: skip


def scale_table(
    sizes: list[int],
    many: int,
    repeats: int,
    json_path: str | None,
    *,
    plain_files: bool = False,
    memory: int | None = None,
) -> int:
    """The `--sizes` table: throughput and peak RSS of `parity diff` against a plain read.

    **Arguments:**

    - `sizes`: bytes of one file, per pair of rows (1/8 of the elements moved, and equal).
    - `many`: small arrays in the last row (0: no such row).
    - `repeats`: runs per figure (median; peak RSS: the largest).
    - `json_path`: also write the rows there, if given.
    - `plain_files`: plain h5py files of float32 instead of parity files of bfloat16.
    - `memory`: `parity diff --memory MIB`, if given (its default, 512, otherwise).

    **Returns:** 0.
    """
    rows: list[dict[str, Any]] = []
    cases: list[tuple[str, list[str]]] = []
    kind = "plain" if plain_files else "parity"
    for n in sizes:
        big = [_WRITE_BIG, str(n), "32000"]
        cases.append((f"{n / 2**20:g} MiB, 1/8 moved", [*big, "8", kind]))
        cases.append((f"{n / 2**20:g} MiB, equal", [*big, "0", kind]))
    if many:
        cases.append((f"{many} arrays", [_WRITE_MANY, str(many), kind]))
    print(
        f"{'plain h5py files of float32' if plain_files else 'parity files of bfloat16'}; "
        f"parity diff --memory {memory if memory is not None else 'default'}; "
        f"median of {repeats} runs; throughput = both files' bytes / wall time; CPU = user + "
        "system seconds (steadier than wall time on a shared machine); ratio = parity's "
        "throughput / plain's, by wall and by CPU"
    )
    print(
        f"{'case':>22}  {'file MB':>8}  {'plain s':>8}  {'cpu s':>6}  {'GB/s':>6}  "
        f"{'RSS MB':>7}  {'parity s':>8}  {'cpu s':>6}  {'GB/s':>6}  {'RSS MB':>7}  "
        f"{'ratio':>5}  {'cpu ratio':>9}"
    )
    for label, (script, *params) in cases:
        with tempfile.TemporaryDirectory(prefix="bench_diff_scale_") as tmp:
            golden, actual = Path(tmp) / "golden.h5", Path(tmp) / "actual.h5"
            subprocess.run(
                [sys.executable, "-c", script, *params, str(golden), str(actual)], check=True
            )
            both = golden.stat().st_size + actual.stat().st_size
            plain = _measure(
                [sys.executable, "-c", _PLAIN_READ, str(actual), str(golden)], repeats, (0,)
            )
            diff = [sys.executable, "-m", "parity", "diff", str(actual), str(golden)]
            if memory is not None:
                diff += ["--memory", str(memory)]
            par = _measure(diff, repeats, (0, 1))
        row = {
            "case": label,
            "file_bytes": both // 2,
            "plain": plain,
            "parity": par,
            "plain_gb_s": both / plain["wall_s"] / 1e9,
            "parity_gb_s": both / par["wall_s"] / 1e9,
        }
        row["throughput_ratio"] = row["parity_gb_s"] / row["plain_gb_s"]
        row["cpu_ratio"] = plain["cpu_s"] / par["cpu_s"]
        rows.append(row)
        print(
            f"{label:>22}  {both / 2 / 1e6:8.1f}  {plain['wall_s']:8.2f}  {plain['cpu_s']:6.2f}  "
            f"{row['plain_gb_s']:6.3f}  {plain['peak_rss'] / 1e6:7.1f}  {par['wall_s']:8.2f}  "
            f"{par['cpu_s']:6.2f}  {row['parity_gb_s']:6.3f}  {par['peak_rss'] / 1e6:7.1f}  "
            f"{row['throughput_ratio']:5.2f}  {row['cpu_ratio']:9.2f}"
        )
    if json_path:
        doc = {"repeats": repeats, "files": kind, "memory_mib": memory, "rows": rows}
        Path(json_path).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
