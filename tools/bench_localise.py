"""Cost of `parity.localise` at the size of the `forward_llama` golden group.

Records the scanned GLU forward (`clean_output_and_activations` with every tap key, the
group's fused full-depth program) and `decomp.legacy`'s unrolled forward on the group's
model and tokens (`tests/equivalence/producers.py`: `glu_config("llama")`, seed 0, its
batch), aligns them under the class the live differential judges the pair by
(`fp32_reassoc`), and prints wall seconds per stage, the values recorded, the bytes held and
the peak resident memory of the process (`resource.getrusage`). Each op's first run
compiles it: the figures include compilation, as a first `parity check` would.

    XLA_FLAGS=--xla_cpu_max_isa=AVX2 .venv/bin/python tools/bench_localise.py

Issue 35 asks for at most 60 s and 2 GiB on one of the project's 2-core machines.
"""

from __future__ import annotations

import importlib.util
import resource
import sys
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_producers() -> ModuleType:
    """`tests/equivalence/producers.py`, imported as `producers`."""
    path = ROOT / "tests" / "equivalence" / "producers.py"
    spec = importlib.util.spec_from_file_location("producers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["producers"] = module
    spec.loader.exec_module(module)
    return module


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    started = time.perf_counter()
    producers = load_producers()
    from decomp import legacy
    from parity.judge._classes import REGISTRY
    from parity.origin import align, locate, matching_tolerance, record

    cfg = producers.glu_config("llama")
    model = producers._init_glu(cfg, 0)  # pyright: ignore[reportPrivateUsage]
    x = producers.tokens(cfg.vocab_size)
    wanted = tuple(producers.wanted_sets(cfg.n_layer)["full_depth"])
    setup_s = time.perf_counter() - started
    print(f"forward_llama: {cfg.n_layer} layers, d_model {cfg.d_model}, vocab {cfg.vocab_size}, "
          f"tokens {tuple(x.shape)}, {len(wanted)} taps; setup {setup_s:.1f} s, "
          f"peak RSS so far {_peak_mib():.0f} MiB")  # fmt: skip

    stages: dict[str, float] = {}
    t = time.perf_counter()
    new = record(lambda m, x: m.clean_output_and_activations(x, wanted), model, x)
    stages["record new (scan)"] = time.perf_counter() - t
    t = time.perf_counter()
    old = record(lambda m, x: legacy.clean_output_and_activations(m, x, wanted), model, x)
    stages["record old (unrolled)"] = time.perf_counter() - t
    t = time.perf_counter()
    origin = locate(new, old, class_map="fp32_reassoc")
    key = next(iter(old.outputs))
    rho = matching_tolerance(REGISTRY["fp32_reassoc"], old.output_arrays[key])
    alignment = align(new, old, rho)
    stages["align and locate"] = time.perf_counter() - t
    for stage, seconds in stages.items():
        print(f"  {stage:<24} {seconds:7.2f} s")
    summary_bytes = sum(a.nbytes for a in old.summary().to_arrays().values())
    print(f"values: new {len(new.values)}, old {len(old.values)}; arrays held: new "
          f"{new.nbytes / 2**20:.1f} MiB, old {old.nbytes / 2**20:.1f} MiB; old summary "
          f"(fingerprints, no arrays) {summary_bytes / 2**20:.2f} MiB")  # fmt: skip
    print(f"matched: {alignment.matched_fraction:.1%} of the new program's values "
          f"(rho {rho:.3g} from {key!r}); origin: {origin}")  # fmt: skip
    print(f"localise total {sum(stages.values()):.1f} s, whole run "
          f"{time.perf_counter() - started:.1f} s; peak RSS {_peak_mib():.0f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
