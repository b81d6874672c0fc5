"""Cost of reading goldens through the user's converter (issue 73,
`parity.judge._converting`) at a GPT-2-small size: 12 layers of q, k, v and o (768 x 768),
an MLP (768 x 3072, 3072 x 768), their biases, and an embedding (50257 x 768), about 124 M
float32 parameters, fused and stacked by one converter (q, k, v into `qkv`, every layer's
weights on a leading axis, the rest passed through).

For each of `--repeat` runs, in a child process of its own, it prints:

- `probe`: the converter run on the two numberings of the goldens' layout, and what it
  does kept (`probe`), seconds;
- `read`: the tree in the converter's layout read back into the goldens' layout
  (`Conversion.to_expected_layout`), seconds, and whether every key came back bit for bit;
- the child's peak resident memory (MiB).

    .venv/bin/python tools/bench_convert.py [--repeat 3]

numpy only: the converter here is plain numpy, as a checkpoint converter often is.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

D, F, L, V = 768, 3072, 12, 50257


def layout() -> dict[str, tuple[int, ...]]:
    """The goldens' keys and shapes, in their order."""
    out: dict[str, tuple[int, ...]] = {"params.embed": (V, D)}
    for i in range(L):
        for n in ("q", "k", "v", "o"):
            out[f"params.blocks.{i}.attn.{n}.w"] = (D, D)
            out[f"params.blocks.{i}.attn.{n}.b"] = (D,)
        out[f"params.blocks.{i}.mlp.up"] = (D, F)
        out[f"params.blocks.{i}.mlp.down"] = (F, D)
    return out


def convert(g: dict[str, Any]) -> dict[str, Any]:
    """q, k and v fused, every layer stacked on a leading axis, the embedding as it was."""
    blocks = [g["params"]["blocks"][str(i)] for i in range(L)]

    def stacked(get: Any) -> np.ndarray:
        return np.stack([get(b) for b in blocks])

    def qkv(b: dict[str, Any], p: str) -> np.ndarray:
        return np.concatenate([b["attn"][n][p] for n in "qkv"], axis=-1)

    return {
        "params": {
            "embed": g["params"]["embed"],
            "blocks": {
                "attn": {
                    "qkv": {p: stacked(lambda b, p=p: qkv(b, p)) for p in "wb"},
                    "o": {p: stacked(lambda b, p=p: b["attn"]["o"][p]) for p in "wb"},
                },
                "mlp": {n: stacked(lambda b, n=n: b["mlp"][n]) for n in ("up", "down")},
            },
        }
    }


def child() -> None:
    from parity.judge._converting import nested, probe
    from parity.judge._trees import flatten

    shapes = layout()
    t0 = time.perf_counter()
    conversion = probe(convert, shapes)
    probe_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    goldens = {k: rng.standard_normal(s, dtype=np.float32) for k, s in shapes.items()}
    tree = flatten(convert(nested(goldens)))
    t0 = time.perf_counter()
    back = conversion.to_expected_layout(tree)
    read_s = time.perf_counter() - t0
    same = sorted(back) == sorted(goldens) and all(
        np.array_equal(back[k], goldens[k]) for k in goldens
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    params = sum(int(np.prod(s)) for s in shapes.values())
    print(json.dumps({"probe": probe_s, "read": read_s, "same": same, "peak_mib": peak,
                      "params": params}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child()
        return
    runs = []
    for i in range(args.repeat):
        out = subprocess.run(
            [sys.executable, __file__, "--child"], capture_output=True, text=True, check=True
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = runs[-1]
        print(f"run {i + 1}: probe {r['probe']:.2f} s, read {r['read']:.2f} s, "
              f"bit for bit {r['same']}, peak {r['peak_mib']:.0f} MiB")  # fmt: skip
    print(f"{runs[0]['params'] / 1e6:.0f} M parameters, {args.repeat} runs, medians: "
          f"probe {statistics.median(r['probe'] for r in runs):.2f} s, "
          f"read {statistics.median(r['read'] for r in runs):.2f} s, "
          f"peak {statistics.median(r['peak_mib'] for r in runs):.0f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
