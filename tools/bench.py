"""Compile-time benchmarks of the SPD subject: legacy against new implementations.

Each section is a function registered with `@section(name)`; it measures what it measures
and writes median seconds into one shared results dict (printed as a table, and written with
`--json FILE`). Add a section by writing another registered function.

    .venv/bin/python tools/bench.py --section inits --repeats 3 --json bench.json

Compile seconds are lower + compile of `jax.jit(f)`, with the persistent compilation cache
off and `jax.clear_caches()` before every repeat, so each repeat compiles from scratch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from parity.machinery._devices import set_cpu_device_count

#: A section: `(args, results) -> None`, adding median seconds (and table rows) to `results`.
SectionFn = Callable[[argparse.Namespace, "Results"], None]
SECTIONS: dict[str, SectionFn] = {}


@dataclass
class Results:
    """What the sections measured: median seconds by JSON key, and the table rows."""

    medians: dict[str, float] = field(default_factory=dict)
    rows: list[tuple[str, str, list[float], list[float]]] = field(default_factory=list)

    def add_pair(
        self, section: str, what: str, key: str, legacy: list[float], new: list[float]
    ) -> None:
        """Record a legacy-against-new pair under `{key}_legacy_s` and `{key}_new_s`."""
        self.medians[f"{key}_legacy_s"] = statistics.median(legacy)
        self.medians[f"{key}_new_s"] = statistics.median(new)
        self.rows.append((section, what, legacy, new))


def section(name: str) -> Callable[[SectionFn], SectionFn]:
    """Register a benchmark section under `name` (a `--section` choice)."""

    def register(fn: SectionFn) -> SectionFn:
        SECTIONS[name] = fn
        return fn

    return register


def compile_seconds(lower: Callable[[], Sequence[Any]], repeats: int) -> list[float]:
    """Seconds to lower and compile, once per repeat, from empty in-memory caches.

    **Arguments:**

    - `lower`: returns the `jax.stages.Lowered` of every jit to count (lowering included in
      the time); each is then compiled.
    - `repeats`: how many times to measure.

    **Returns:** one figure per repeat.
    """
    import jax

    out = []
    for _ in range(repeats):
        jax.clear_caches()
        t0 = time.perf_counter()
        for lowered in lower():
            lowered.compile()
        out.append(time.perf_counter() - t0)
    return out


# --- sections ------------------------------------------------------------------------------


@section("inits")
def bench_inits(args: argparse.Namespace, results: Results) -> None:
    """CI-function init (loop-and-stack against vmap) and persistent-sources init (one draw
    per site against stack-per-C-group then fan out), on a 32-layer GLU structure."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from decomp import sources
    from decomp.ci_function import init_ci_function
    from decomp.config import CIConfig
    from decomp.legacy import ci_init as legacy_ci, sources_init as legacy_sources
    from decomp.taps import parse_site, site_names
    from decomp.targets.glu_transformer import GLUConfig

    glu = GLUConfig(
        n_layer=args.n_layer,
        d_model=32,
        n_head=2,
        n_kv_head=1,
        head_dim=16,
        d_mlp=64,
        vocab_size=64,
    )
    names = site_names(glu.n_layer)
    shapes = glu.site_shapes()
    dims = {n: (shapes[parse_site(n)[1]][0], args.c) for n in names}
    ci_cfg = CIConfig(d_hidden=32, n_blocks=2, n_head=2, d_mlp=64, sites_per_chunk=7)
    key = jax.random.key(0)
    n_chunks = len(names) // ci_cfg.sites_per_chunk

    def ci_lowered(init: Callable[..., Any]) -> Callable[[], list[Any]]:
        return lambda: [jax.jit(lambda k: init(ci_cfg, names, dims, key=k)).lower(key)]

    results.add_pair(
        "inits",
        f"CI-function init, {n_chunks} chunks",
        "ci_init",
        compile_seconds(ci_lowered(legacy_ci.init_ci_function), args.repeats),
        compile_seconds(ci_lowered(init_ci_function), args.repeats),
    )

    site_cs = {n: args.c for n in names}
    dtype = jnp.dtype(jnp.float32)
    mesh = Mesh(np.array(jax.devices()), ("dp",))
    sharding = NamedSharding(mesh, PartitionSpec())
    static = tuple(site_cs.items())

    def sources_legacy() -> list[Any]:
        fn = legacy_sources._jit(site_cs, sharding)
        return [fn.lower(key, site_cs=static, seq_len=args.seq_len, dtype=dtype)]

    def sources_new() -> list[Any]:
        # Stage 1 (one jit per C group) and the slicing jit, lowered on stage 1's outputs.
        plan = sources._plan(site_cs, args.seq_len, dtype, sharding)
        stage_one = [fn.lower(key, **kw) for fn, kw in plan.stage_one]
        fan_out, kw = plan.fan_out
        stacks = tuple(low.out_info for low in stage_one)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=sources._UNUSED_DONATION)
            return [*stage_one, fan_out.lower(stacks, **kw)]

    results.add_pair(
        "inits",
        f"sources init, {len(site_cs)} sites",
        "sources_init",
        compile_seconds(sources_legacy, args.repeats),
        compile_seconds(sources_new, args.repeats),
    )


def _toy_width_glu(args: argparse.Namespace) -> tuple[Any, Any]:
    """The GLU of the train-step sections (`--n-layer` layers at toy widths) and its batch
    of 4 token sequences of `--seq-len`."""
    import jax

    from decomp.targets.glu_transformer import GLUConfig, GLUTransformer

    glu = GLUConfig(
        n_layer=args.n_layer, d_model=32, n_head=2, n_kv_head=1, head_dim=16, d_mlp=64,
        vocab_size=64,
    )  # fmt: skip
    model = jax.jit(lambda k: GLUTransformer.init(glu, key=k))(jax.random.key(0))
    inputs = jax.random.randint(jax.random.key(1), (4, args.seq_len), 0, glu.vocab_size)
    return model, inputs


@section("train_step")
def bench_train_step(args: argparse.Namespace, results: Results) -> None:
    """SPD train step on the GLU structure (`--n-layer`, `--c`, `--seq-len`; batch 4): the
    masked forward's scan body checkpointed saving nothing (`remat="nothing"`) against no
    checkpointing (`remat=None`).

    `train_step_{remat,noremat}_s`: median seconds of one executed step (compiled, after a
    warm-up step). `train_step_{remat,noremat}_compile_s`: median lower + compile seconds.
    """
    import jax
    import jax.numpy as jnp

    from decomp.config import CIConfig, Remat, SPDConfig
    from decomp.train import init_train_state, make_train_step

    model, inputs = _toy_width_glu(args)
    modes: tuple[tuple[Remat, str], ...] = (
        ("nothing", "train_step_remat"),
        (None, "train_step_noremat"),
    )
    for remat, key in modes:
        cfg = SPDConfig(
            n_components=args.c,
            ci=CIConfig(d_hidden=32, n_blocks=2, n_head=2, d_mlp=64, sites_per_chunk=7),
            recon_sites_per_chunk=7,
            remat=remat,
        )
        state = init_train_state(model, cfg, key=jax.random.key(2), seq_len=args.seq_len)
        step = make_train_step(model, cfg)
        compile_s = compile_seconds(
            lambda: [step.lower(state, inputs, jax.random.key(3))],  # noqa: B023
            args.repeats,
        )
        state, metrics = step(state, inputs, jax.random.key(3))
        jax.block_until_ready(metrics)
        run_s = []
        for i in range(args.repeats):
            t0 = time.perf_counter()
            state, metrics = step(state, inputs, jax.random.key(4 + i))
            jax.block_until_ready((state, metrics))
            run_s.append(time.perf_counter() - t0)
        total = float(jnp.asarray(metrics["total"]))
        results.medians[f"{key}_s"] = statistics.median(run_s)
        results.medians[f"{key}_compile_s"] = statistics.median(compile_s)
        runs = ", ".join(f"{x * 1e3:.2f}" for x in run_s)
        print(
            f"train_step remat={remat!r}: step {statistics.median(run_s) * 1e3:.2f} ms "
            f"[{runs}], compile {_fmt(compile_s)} s, total loss {total:.4g}"
        )


@section("step_time")
def bench_step_time(args: argparse.Namespace, results: Results) -> None:
    """Wall time of one executed SPD train step, the stacked step (`decomp.train`) against
    the per-site one it replaced (`decomp.legacy.train`), in both remat modes, on the GLU
    structure (`--n-layer`, `--c`, `--seq-len`; toy widths, batch 4). Both are compiled and
    warmed up first; then `--steps` steps of each, alternating old and new, so that the
    machine's load falls on both alike. Records `step_{remat}_{legacy,new}_s` (medians).
    """
    import jax

    from decomp import train
    from decomp.config import CIConfig, SPDConfig
    from decomp.legacy import train as legacy_train

    model, inputs = _toy_width_glu(args)
    for remat in ("nothing", "dots"):
        cfg = SPDConfig(
            n_components=args.c,
            ci=CIConfig(d_hidden=32, n_blocks=2, n_head=2, d_mlp=64, sites_per_chunk=7),
            recon_sites_per_chunk=7,
            remat=remat,
        )
        runs: dict[str, Any] = {}
        for name, impl in (("legacy", legacy_train), ("new", train)):
            state = impl.init_train_state(model, cfg, key=jax.random.key(2), seq_len=args.seq_len)
            step = impl.make_train_step(model, cfg)
            state, metrics = step(state, inputs, jax.random.key(3))
            jax.block_until_ready((state, metrics))
            runs[name] = [step, state, []]
        for i in range(args.steps):
            for name in ("legacy", "new"):
                step, state, times = runs[name]
                t0 = time.perf_counter()
                state, metrics = step(state, inputs, jax.random.key(4 + i))
                jax.block_until_ready((state, metrics))
                times.append(time.perf_counter() - t0)
                runs[name][1] = state
        legacy_s, new_s = runs["legacy"][2], runs["new"][2]
        results.add_pair("step", f"train step remat={remat}", f"step_{remat}", legacy_s, new_s)
        print(
            f"train step remat={remat!r}, {args.n_layer} layers: per-site "
            f"{statistics.median(legacy_s) * 1e3:.2f} ms, stacked "
            f"{statistics.median(new_s) * 1e3:.2f} ms (medians of {args.steps}; stacked/per-site "
            f"{statistics.median(new_s) / statistics.median(legacy_s):.3f})"
        )


@section("cache_put")
def bench_cache_put(args: argparse.Namespace, results: Results) -> None:
    """One write into the size-limited jax compilation cache that parity shares per machine
    (`parity.machinery._jax_cache`), in a folder already holding `--entries` entries of 27 KB (a
    cold test suite leaves ~1,900): jax's own write, which lists the folder and reads every
    entry's access time first, against the write with parity's size tally
    (`keep_a_size_tally`). Each in its own copy of the folder; `--steps` writes each.
    Records `cache_put_{legacy,new}_s` (medians)."""
    import tempfile
    from pathlib import Path

    from jax._src.lru_cache import LRUCache

    from parity.machinery import _jax_cache as jax_cache

    value = b"x" * 27_000

    def filled(folder: Path) -> LRUCache:
        cache = LRUCache(str(folder), max_size=jax_cache.MAX_BYTES)
        for i in range(args.entries):
            (folder / f"old{i}-cache").write_bytes(value)
            (folder / f"old{i}-atime").write_bytes(time.time_ns().to_bytes(8, "little"))
        return cache

    def puts(cache: LRUCache) -> list[float]:
        out = []
        for i in range(args.steps):
            t0 = time.perf_counter()
            cache.put(f"new{i}", value)
            out.append(time.perf_counter() - t0)
        return out

    with tempfile.TemporaryDirectory(prefix="bench_cache_put_") as tmp:
        legacy_folder, new_folder = Path(tmp, "jax"), Path(tmp, "tally")
        legacy_folder.mkdir()
        new_folder.mkdir()
        legacy = puts(filled(legacy_folder))
        if not jax_cache.keep_a_size_tally():
            raise SystemExit("this jax has no LRUCache._evict_if_needed to wrap")
        new = puts(filled(new_folder))
    results.add_pair("cache", f"cache write, {args.entries} entries", "cache_put", legacy, new)
    print(
        f"cache write into {args.entries} entries: jax's {statistics.median(legacy) * 1e3:.2f} "
        f"ms, with the size tally {statistics.median(new) * 1e3:.2f} ms (medians of "
        f"{args.steps}; the first write with the tally lists the folder once)"
    )


# --- driver --------------------------------------------------------------------------------


def _fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):8.2f}  [{', '.join(f'{x:.2f}' for x in xs)}]"


def print_table(results: Results) -> None:
    print(f"{'section':<8} {'what':<34} {'legacy s (median [runs])':<32} {'new s':<32} ratio")
    for sec, what, legacy, new in results.rows:
        ratio = statistics.median(legacy) / statistics.median(new)
        print(f"{sec:<8} {what:<34} {_fmt(legacy):<32} {_fmt(new):<32} {ratio:6.1f}x")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--section", choices=[*SECTIONS, "all"], default="all")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per figure")
    parser.add_argument("--json", metavar="FILE", help="write the median seconds here")
    parser.add_argument("--devices", type=int, default=1, help="simulated CPU devices")
    parser.add_argument("--n-layer", type=int, default=32, help="GLU layers (7 sites each)")
    parser.add_argument("--c", type=int, default=8, help="components per site")
    parser.add_argument("--seq-len", type=int, default=16, help="T of the sources")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (step_time, cache_put)")
    parser.add_argument("--entries", type=int, default=2000, help="cache entries (cache_put)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    set_cpu_device_count(args.devices)
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    print(f"jax {jax.__version__}, {jax.device_count()} {jax.default_backend()} device(s)")

    results = Results()
    for name, fn in SECTIONS.items():
        if args.section in (name, "all"):
            fn(args, results)
    print_table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results.medians, f, indent=2, sort_keys=True)
            f.write("\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
