"""Cost of a proof up to rounding of a mixed-precision forward (issue 71): a plain-JAX GPT
whose parameters are float32 and whose forward computes in bfloat16 (every weight cast at
the top, as a `jmp` policy `params=float32,compute=bfloat16,output=float32` does; layer
norms' statistics and the attention's softmax in float32, the logits cast to float32).

Default size GPT-2 small: 12 layers, d 768, 12 heads, sequence 128, vocabulary 50,257 (124 M
parameters). Each row is a child process on whatever backend jax has (the CPU here; the TPU
through the device tool), which times:

- `verdict`: both forwards jitted and run, their outputs compared (`parity.compare_trees`
  under `bitwise`), as a check's verdict costs;
- `base`: the base's recording with its values (`record(..., keep_arrays=True)`);
- `replay`: the tree's forward recorded op by op with its shadow replay on the base's values,
  and every key proved or its origin named (the cost over the verdict with the base cached);

and prints the keys proved, the precision the proof says, the origin where one is named, and
the child's peak resident memory. The rows:

- `split down`: each layer's MLP down projection as two half contractions summed in
  bfloat16 (a reorder): proved up to rounding;
- `split down + epsilon`: the same with the layer norms' epsilon 10% larger: not proved,
  named at the layer norm's add, a changed constant.

    XLA_FLAGS=--xla_cpu_max_isa=AVX2 .venv/bin/python tools/bench_mixed_precision.py [--repeat 3]
        [--layers 12] [--d 768] [--seq 128] [--vocab 50257] [--compute bfloat16]

Issue 71 asks for the proof within 60 s over the verdict and 2 GiB, on these 2-core machines.
"""

from __future__ import annotations

import argparse
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
ROWS = ("split down", "split down + epsilon")


def _init(layers: int, d: int, seq: int, vocab: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    keys = iter(jax.random.split(jax.random.PRNGKey(0), 4 + 4 * layers))

    def normal(*shape: int) -> Any:
        return jax.random.normal(next(keys), shape, jnp.float32) * 0.02

    def norm() -> dict[str, Any]:
        return {"g": jnp.ones((d,), jnp.float32), "b": jnp.zeros((d,), jnp.float32)}

    blocks = [
        {"ln1": norm(), "qkv": normal(d, 3 * d), "proj": normal(d, d), "ln2": norm(),
         "fc": normal(d, 4 * d), "down": normal(4 * d, d)}
        for _ in range(layers)
    ]  # fmt: skip
    return {"wte": normal(vocab, d), "wpe": normal(seq, d), "blocks": blocks, "lnf": norm()}


def _forward(split: bool, eps: float, heads: int, compute: str) -> Any:
    """The forward; `split`: the down projection in two halves; `eps`: the norms' epsilon;
    `compute`: the policy's compute dtype."""
    import jax
    import jax.numpy as jnp

    def layer_norm(x: Any, p: dict[str, Any]) -> Any:
        x32 = x.astype(jnp.float32)
        mu = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mu), axis=-1, keepdims=True)
        y = (x32 - mu) * jax.lax.rsqrt(var + eps)
        return (y * p["g"] + p["b"]).astype(x.dtype)

    def attention(a: Any, blk: dict[str, Any]) -> Any:
        t, d = a.shape
        q, k, v = jnp.split(a @ blk["qkv"], 3, axis=-1)
        q, k, v = (z.reshape(t, heads, d // heads).transpose(1, 0, 2) for z in (q, k, v))
        scores = (q @ k.transpose(0, 2, 1)).astype(jnp.float32) / jnp.sqrt(d // heads)
        scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)
        y = jax.nn.softmax(scores, axis=-1).astype(a.dtype) @ v
        return y.transpose(1, 0, 2).reshape(t, d) @ blk["proj"]

    def down(m: Any, w: Any) -> Any:
        if not split:
            return m @ w
        n = m.shape[-1] // 2
        return m[:, :n] @ w[:n] + m[:, n:] @ w[n:]

    def forward(params: dict[str, Any], tokens: Any) -> dict[str, Any]:
        p = jax.tree.map(lambda w: w.astype(compute), params)  # the policy's compute
        h = p["wte"][tokens] + p["wpe"]
        for blk in p["blocks"]:
            h = h + attention(layer_norm(h, blk["ln1"]), blk)
            h = h + down(jax.nn.gelu(layer_norm(h, blk["ln2"]) @ blk["fc"]), blk["down"])
        logits = layer_norm(h, p["lnf"]) @ p["wte"].T
        return {"logits": logits.astype(jnp.float32)}  # the policy's output

    return forward


def child(row: str, layers: int, d: int, seq: int, vocab: int, compute: str) -> dict[str, Any]:
    """One measurement, in this process (`--child`)."""
    import jax

    from parity.judge._compare import compare_trees
    from parity.origin._record import record
    from parity.origin._shadow import Shadow

    params = _init(layers, d, seq, vocab)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (seq,), 0, vocab)
    heads = max(d // 64, 1)
    old = _forward(False, 1e-5, heads, compute)
    new = _forward(True, 1.1e-5 if "epsilon" in row else 1e-5, heads, compute)
    t = time.perf_counter()
    verdict = compare_trees(
        jax.jit(new)(params, tokens), jax.jit(old)(params, tokens), class_map="bitwise"
    )
    verdict_s = time.perf_counter() - t
    t = time.perf_counter()
    base = record(old, params, tokens, keep_arrays=True)
    base_s = time.perf_counter() - t
    t = time.perf_counter()
    shadow = Shadow(base)
    recording = record(new, params, tokens, keep_arrays=False, shadow=shadow)
    proofs = shadow.proofs(recording)
    first = next((p for p in proofs.values() if not p.proved), None)
    origin = None if first is None else shadow.origin(recording, first)
    replay_s = time.perf_counter() - t
    return {
        "backend": jax.devices()[0].device_kind,
        "verdict_s": verdict_s,
        "base_s": base_s,
        "replay_s": replay_s,
        "moved": sum(1 for f in verdict.findings if f.verdict == "fail"),
        "keys": len(proofs),
        "proved": sum(1 for p in proofs.values() if p.proved),
        "values": len(recording.values),
        "precision": next((p.precision for p in proofs.values() if p.proved), ""),
        "origin": "" if origin is None else origin.describe()[:200],
        "base_mib": base.nbytes / 2**20,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=1, help="runs per row (medians printed)")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d", type=int, default=768)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument(
        "--compute", default="bfloat16", help="the compute dtype (float32: a TPU's dots then "
        "round their operands to bfloat16 at the default precision)",
    )  # fmt: skip
    p.add_argument("--child", metavar="ROW", help=argparse.SUPPRESS)
    args = p.parse_args()
    size = (args.layers, args.d, args.seq, args.vocab, args.compute)
    if args.child:
        print(json.dumps(child(args.child, *size)))
        return
    print(f"GPT forward, {args.layers} layers, d {args.d}, seq {args.seq}, vocab {args.vocab}, "
          f"{args.compute} compute over float32 parameters; medians of {args.repeat} run(s), each "
          "a fresh process")  # fmt: skip
    for row in ROWS:
        runs = []
        for _ in range(args.repeat):
            done = subprocess.run(
                [sys.executable, __file__, "--child", row, "--layers", str(args.layers),
                 "--d", str(args.d), "--seq", str(args.seq), "--vocab", str(args.vocab),
                 "--compute", args.compute],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        med = {
            k: statistics.median(r[k] for r in runs) for k in runs[0] if k.endswith(("_s", "_mib"))
        }
        last = runs[-1]
        print(f"{row} on {last['backend']}: verdict {med['verdict_s']:.1f} s (keys whose bits "
              f"moved: {last['moved']}), base recorded {med['base_s']:.1f} s "
              f"({med['base_mib']:.0f} MiB of values), replay and proofs {med['replay_s']:.1f} s "
              f"over the verdict; proved {last['proved']}/{last['keys']} "
              f"({last['values']} values){' in ' + last['precision'] if last['precision'] else ''}"
              "; "
              f"peak {med['peak_mib']:.0f} MiB")  # fmt: skip
        if last["origin"]:
            print(f"  origin: {last['origin']}")


if __name__ == "__main__":
    main()
