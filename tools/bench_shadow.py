"""Cost of a proof up to rounding (issue 59, `parity.origin._shadow`) on the subject's forward,
and how it grows with the number of layers.

For each depth (2, 4 and 8 layers of `tests/equivalence/producers.py`'s `glu_config("llama")`,
seed 0, the group's tokens, every tap) and each refactor, a child process times:

- `verdict`: both forwards jitted and run, their outputs compared (`parity.compare_trees`
  under `bitwise`), as a check's verdict costs;
- `base`: the base's recording with its values (`record(..., keep_arrays=True)`), what a
  cache of the base would hold;
- `replay`: the new forward recorded op by op with its shadow replay on the base's values,
  and every key proved (`Shadow.proofs`): the cost over the verdict with the base cached;

and prints the keys proved, how many values were equal op by op or within their
operation's rounding, and the child's peak resident memory. The refactors, each against
`decomp.legacy`'s unrolled forward:

- `scan`: the scanned forward as it is (its operations are the legacy loop's: a proof op by
  op, the replay does nothing beyond it);
- `split dot`: every site's matmul split into two half contractions summed (`x[:, :h] @
  W[:, :h].T + x[:, h:] @ W[:, h:].T`): a reassociation, proved only up to rounding.

    XLA_FLAGS=--xla_cpu_max_isa=AVX2 .venv/bin/python tools/bench_shadow.py [--repeat 3]

With `--train REMAT` (`none`, `nothing`, `dots`) it measures instead the train group's
3-step trajectory (`tests/equivalence/producers.py`'s `train_group`) of the step stacked
per kind (`decomp.train`) against the per-site reference step (`decomp.legacy.train`),
each recorded from the programs it dispatched (`record_programs`): the base's recording
with its values, then the replay, the keys proved and the first key not proved, and per
primitive of the step how many of its values were the base's bit for bit, within their
operation's rounding, or new with no rounding model (issue 75).

Issue 59 asks for a forward group within 60 s over its verdict with the base cached, and
2 GiB.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tools"))
LAYERS = (2, 4, 8)
REFACTORS = ("scan", "split dot")


def _split_site(kind: str, w: Any, site_x: Any, x: Any) -> Any:
    """A site's `x @ w.T` as two half contractions summed: the same products, reassociated."""
    del kind, site_x
    h = x.shape[-1] // 2
    return x[..., :h] @ w[:, :h].T + x[..., h:] @ w[:, h:].T


def child(layers: int, refactor: str) -> dict[str, Any]:
    """One measurement, in this process (`--child`)."""
    import jax

    from bench_localise import load_producers
    from decomp import legacy
    from parity.judge._compare import compare_trees
    from parity.origin._record import record
    from parity.origin._shadow import Shadow

    producers = load_producers()
    cfg = dataclasses.replace(producers.glu_config("llama"), n_layer=layers)
    model = producers._init_glu(cfg, 0)  # pyright: ignore[reportPrivateUsage]
    x = producers.tokens(cfg.vocab_size)
    wanted = tuple(producers.wanted_sets(layers)["full_depth"])
    site = {"scan": None, "split dot": _split_site}[refactor]

    def new(m: Any, tokens: Any) -> Any:
        kw = {} if site is None else {"site_apply": site}
        return m._clean_forward(tokens, wanted, True, **kw)  # pyright: ignore[reportPrivateUsage]

    def old(m: Any, tokens: Any) -> Any:
        return legacy.clean_output_and_activations(m, tokens, wanted)

    t = time.perf_counter()
    verdict = compare_trees(jax.jit(new)(model, x), jax.jit(old)(model, x), class_map="bitwise")
    verdict_s = time.perf_counter() - t
    t = time.perf_counter()
    base = record(old, model, x, keep_arrays=True)
    base_s = time.perf_counter() - t
    t = time.perf_counter()
    shadow = Shadow(base)
    recording = record(new, model, x, keep_arrays=False, shadow=shadow)
    proofs = shadow.proofs(recording)
    replay_s = time.perf_counter() - t
    statuses = [s.status for s in shadow.shades.values()]
    return {
        "verdict_s": verdict_s,
        "base_s": base_s,
        "replay_s": replay_s,
        "failing": sum(1 for f in verdict.findings if f.verdict == "fail"),
        "keys": len(proofs),
        "proved": sum(1 for p in proofs.values() if p.proved),
        "values": len(recording.values),
        "same": statuses.count("same"),
        "exact": statuses.count("exact"),
        "rounded": statuses.count("rounded"),
        "part": statuses.count("part"),
        "fresh": statuses.count("fresh"),
        "base_mib": base.nbytes / 2**20,
        "peak_mib": _peak(),
        "unproved": next((p.describe() for p in proofs.values() if not p.proved), ""),
    }


def train(remat: str) -> None:
    """The train group's trajectory, per kind against per site (`--train`), printed."""
    import collections

    from bench_localise import load_producers
    from parity.judge._dataflow import numpy_conversions
    from parity.origin._flushing import FLUSH_ABOVE
    from parity.origin._programs import capture
    from parity.origin._record import record_programs
    from parity.origin._shadow import Shadow

    producers = load_producers()
    mode = None if remat == "none" else remat

    def recorded(legacy: bool, shadow: Shadow | None) -> tuple[Any, dict[str, Any]]:
        with numpy_conversions() as converted, capture() as programs:
            out = producers._train_group.__wrapped__(mode, legacy)  # pyright: ignore[reportPrivateUsage]
        recording, _ = record_programs(
            programs, out, sources=converted.source, keep_arrays=shadow is None,
            flush_above=FLUSH_ABOVE, shadow=shadow,
        )  # fmt: skip
        assert recording is not None
        return recording, out

    t = time.perf_counter()
    base, old = recorded(True, None)
    print(f"base (per site): {len(base.values)} values, {base.nbytes / 2**20:.1f} MiB held, "
          f"{time.perf_counter() - t:.1f} s, peak {_peak():.0f} MiB", flush=True)  # fmt: skip
    t = time.perf_counter()
    shadow = Shadow(base)
    recording, new = recorded(False, shadow)
    keys = [k for k in recording.outputs if k in base.outputs]
    proofs = shadow.proofs(recording, keys, root=ROOT)
    print(f"replay (per kind): {len(recording.values)} values, {time.perf_counter() - t:.1f} s, "
          f"peak {_peak():.0f} MiB", flush=True)  # fmt: skip
    print(dict(collections.Counter(s.status for s in shadow.shades.values())))
    _by_primitive(recording, shadow)
    bits = sum(1 for k in keys if new[k].tobytes() == old[k].tobytes())
    proved = sum(1 for p in proofs.values() if p.proved)
    print(f"keys {len(keys)}: equal bit for bit {bits}, proved up to rounding {proved}")
    first = next((p for p in proofs.values() if not p.proved), None)
    if first is not None:
        print(f"first not proved: {first.key}: {first.describe()}")


def _by_primitive(recording: Any, shadow: Any) -> None:
    """Per primitive of the new program: how many of its values were the base's bit for bit
    (`same`, `exact`, a `part`), within their operation's rounding (`rounded`, or new and
    modelled), or new with no model (the reason the first of them gave)."""
    import collections

    rows: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    why: dict[str, str] = {}
    for v in recording.values:
        s = shadow.shades.get(v.id)
        if s is None or v.kind in ("input", "const"):
            continue
        if s.status in ("same", "exact", "part"):
            kind = "exact"
        elif s.status == "rounded" or (s.status == "fresh" and s.model is not None):
            kind = "rounding"
        else:
            kind = "unmodelled"
            why.setdefault(v.primitive, s.why)
        rows[v.primitive][kind] += 1
    print(f"{'primitive':24s} {'exact':>7s} {'rounding':>8s} {'unmodelled':>10s}")
    for name, c in sorted(rows.items(), key=lambda kv: -sum(kv[1].values())):
        print(f"{name:24s} {c['exact']:7d} {c['rounding']:8d} {c['unmodelled']:10d}"
              f"{'  ' + why[name] if why.get(name) else ''}")  # fmt: skip


def _peak() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _measure(layers: int, refactor: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(layers), refactor],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=1, help="runs per figure (medians printed)")
    p.add_argument("--child", nargs=2, metavar=("LAYERS", "REFACTOR"), help=argparse.SUPPRESS)
    p.add_argument("--train", metavar="REMAT", help="the train group instead (none, nothing, dots)")
    args = p.parse_args()
    if args.train:
        train(args.train)
        return
    if args.child:
        print(json.dumps(child(int(args.child[0]), args.child[1])))
        return
    print(f"medians of {args.repeat} run(s) per row; each row a fresh process")
    print(f"{'refactor':10s} {'layers':>6s} {'verdict':>8s} {'base':>7s} {'replay':>7s} "
          f"{'proved':>9s} {'values':>7s} {'same':>6s} {'exact':>6s} {'rounded':>7s} "
          f"{'part':>6s} {'fresh':>6s} {'base MiB':>8s} {'peak MiB':>8s}")  # fmt: skip
    for refactor in REFACTORS:
        for layers in LAYERS:
            runs = [_measure(layers, refactor) for _ in range(args.repeat)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "unproved"}
            print(f"{refactor:10s} {layers:6d} {med['verdict_s']:7.1f}s {med['base_s']:6.1f}s "
                  f"{med['replay_s']:6.1f}s {int(med['proved']):4d}/{int(med['keys']):<4d} "
                  f"{int(med['values']):7d} {int(med['same']):6d} {int(med['exact']):6d} "
                  f"{int(med['rounded']):7d} {int(med['part']):6d} {int(med['fresh']):6d} "
                  f"{med['base_mib']:8.1f} "
                  f"{med['peak_mib']:8.0f}")  # fmt: skip
            if runs[0]["unproved"]:
                print(f"{'':17s} first key not proved: {runs[0]['unproved']}")


if __name__ == "__main__":
    main()
