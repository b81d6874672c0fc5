"""The origin at the size users train (issue 76): a plain-JAX GPT forward pinned with
`parity repin`, then checked clean and with a 10% layer-norm epsilon bug, each check a
`python -m parity check` of its own, as a user runs it.

It makes a git project in a temporary folder: `src/gpt.py` (pre-norm blocks: layer norm,
attention with a causal mask, layer norm, a GELU MLP; tied embedding), `producers.py` (one
group, `forward`, the logits of one sequence under the class `fp32_reassoc`), and pins it.
For each of `--repeat` rounds it then times, each in a process of its own:

- `clean`: `parity check` of the pinned tree (passes);
- `failing`: `parity check` with the layer norms' epsilon 1e-5 -> 1.1e-5 in the working
  tree (fails; its origin is named: the base is recorded once, then cached, so the first
  round pays for the base and the later ones do not, which the lines say);

and prints each one's seconds, the peak resident memory of the largest process it waited
for (`getrusage(RUSAGE_CHILDREN)`: the producers, the recording, the check), and the
failing check's `origin:` line. Sizes: `--size 0.2b` (12 layers, d 1024, sequence 256,
vocabulary 32,000: 0.22 B parameters), `--size 1b` (18 layers, d 2048: 0.97 B), or `--size
tiny` (2 layers, d 128: a minute, to try the script).

    .venv/bin/python tools/bench_origin_scale.py [--size 0.2b] [--repeat 3] [--keep DIR]

Issue 76 asks, on these 2-core machines: the failing check's peak within 1.5x the clean
check's, its time within 60 s over the verdict at 0.2 B, and the 1 B run to complete in
24 GiB.
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

SIZES = {"tiny": (2, 128, 32, 1000), "0.2b": (12, 1024, 256, 32000), "1b": (18, 2048, 256, 32000)}

MODEL = """\
import jax
import jax.numpy as jnp

LAYERS, D, SEQ, VOCAB = {layers}, {d}, {seq}, {vocab}
HEADS = D // 64
EPS = 1e-5


def init(key):
    keys = iter(jax.random.split(key, 2 + 4 * LAYERS))

    def normal(*shape):
        return jax.random.normal(next(keys), shape, jnp.float32) * 0.02

    def norm():
        return {{"g": jnp.ones((D,), jnp.float32), "b": jnp.zeros((D,), jnp.float32)}}

    blocks = [
        {{"ln1": norm(), "qkv": normal(D, 3 * D), "proj": normal(D, D), "ln2": norm(),
          "up": normal(D, 4 * D), "down": normal(4 * D, D)}}
        for _ in range(LAYERS)
    ]
    return {{"embed": normal(VOCAB, D), "pos": normal(SEQ, D), "blocks": blocks,
            "ln_f": norm()}}


def layer_norm(x, p):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + EPS) * p["g"] + p["b"]


def attention(x, p):
    q, k, v = jnp.split(x @ p["qkv"], 3, axis=-1)
    split = lambda t: t.reshape(SEQ, HEADS, D // HEADS).transpose(1, 0, 2)
    q, k, v = split(q), split(k), split(v)
    s = q @ k.transpose(0, 2, 1) / jnp.sqrt(D // HEADS)
    s = jnp.where(jnp.tril(jnp.ones((SEQ, SEQ), bool)), s, -1e9)
    o = jax.nn.softmax(s, axis=-1) @ v
    return o.transpose(1, 0, 2).reshape(SEQ, D) @ p["proj"]


def forward(params, tokens):
    x = params["embed"][tokens] + params["pos"]
    for p in params["blocks"]:
        x = x + attention(layer_norm(x, p["ln1"]), p)
        x = x + jax.nn.gelu(layer_norm(x, p["ln2"]) @ p["up"]) @ p["down"]
    return layer_norm(x, params["ln_f"]) @ params["embed"].T
"""

PRODUCERS = """\
import jax
import jax.numpy as jnp

import gpt


def forward():
    params = gpt.init(jax.random.PRNGKey(0))
    tokens = jnp.arange(gpt.SEQ) % gpt.VOCAB
    return {"logits": jax.jit(gpt.forward)(params, tokens)}


GROUPS = {"forward": forward}
CLASS_MAP = [("*", "fp32_reassoc")]
"""

#: Runs a command and prints the largest resident memory of any process it waited for.
_MEASURED = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
    "sys.stdout.write(done.stdout)\n"
    "sys.stderr.write(done.stderr)\n"
    "print(f'@@peak {peak:.0f} {done.returncode}')\n"
)


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def _measured(repo: Path, *args: str) -> tuple[float, float, int, str]:
    """`python -m parity ARGS` in `repo`: seconds, peak MiB, exit code, its output."""
    env = dict(os.environ, XLA_FLAGS="--xla_cpu_max_isa=AVX2",
               PARITY_BASELINE_CACHE=str(repo.parent / "baselines"))  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _MEASURED, sys.executable, "-m", "parity", *args],
        cwd=repo, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    last = [ln for ln in done.stdout.splitlines() if ln.startswith("@@peak ")][-1].split()
    return seconds, float(last[1]), int(last[2]), done.stdout + done.stderr


def _project(root: Path, size: tuple[int, int, int, int]) -> Path:
    layers, d, seq, vocab = size
    repo = root / "gpt-project"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "gpt.py").write_text(MODEL.format(layers=layers, d=d, seq=seq, vocab=vocab))
    (repo / "producers.py").write_text(PRODUCERS)
    (repo / "pyproject.toml").write_text('[tool.parity]\nproducers = "producers.py"\n')
    _git(repo.parent, "init", "-q", str(repo))
    _git(repo, "-c", "user.name=bench", "-c", "user.email=bench@example.com", "add", "-A")
    _git(repo, "-c", "user.name=bench", "-c", "user.email=bench@example.com",
         "commit", "-qm", "the model")  # fmt: skip
    return repo


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="0.2b")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="build the project here and keep it")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="parity-bench-origin-"))
    try:
        layers, d, seq, vocab = SIZES[args.size]
        params = layers * 12 * d * d + vocab * d + seq * d
        repo = _project(root, SIZES[args.size])
        print(f"{args.size}: {layers} layers, d {d}, sequence {seq}, vocabulary {vocab}: "
              f"{params / 1e9:.2f} B parameters")  # fmt: skip
        seconds, peak, code, out = _measured(repo, "repin", "--base", "HEAD")
        assert code == 0, out
        print(f"repin: {seconds:.1f} s, peak {peak:.0f} MiB")
        model = repo / "src" / "gpt.py"
        pinned = model.read_text()
        rows: dict[str, list[tuple[float, float]]] = {"clean": [], "failing": []}
        for i in range(args.repeat):
            model.write_text(pinned)
            seconds, peak, code, out = _measured(repo, "check")
            assert code == 0, out
            rows["clean"].append((seconds, peak))
            model.write_text(pinned.replace("EPS = 1e-5", "EPS = 1.1e-5"))
            seconds, peak, code, out = _measured(repo, "check")
            assert code == 1, out
            rows["failing"].append((seconds, peak))
            origin = next((ln.strip() for ln in out.splitlines() if "origin:" in ln), "")
            base = "the base recorded now" if i == 0 else "the base cached"
            print(f"round {i + 1}: clean {rows['clean'][-1][0]:.1f} s, "
                  f"{rows['clean'][-1][1]:.0f} MiB; failing ({base}) {seconds:.1f} s, "
                  f"{peak:.0f} MiB")  # fmt: skip
            if i == 0:
                print(f"  {origin[:200]}")
        model.write_text(pinned)
        summary = {
            name: {
                "seconds": statistics.median(s for s, _ in got),
                "peak_mib": statistics.median(p for _, p in got),
            }
            for name, got in rows.items()
        }
        later = rows["failing"][1:] or rows["failing"]
        print(
            f"medians of {args.repeat}: clean {summary['clean']['seconds']:.1f} s, "
            f"{summary['clean']['peak_mib']:.0f} MiB; failing "
            f"{summary['failing']['seconds']:.1f} s, {summary['failing']['peak_mib']:.0f} MiB; "
            f"failing with the base cached (rounds 2..): "
            f"{statistics.median(s for s, _ in later):.1f} s"
        )
        print(json.dumps(summary))
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
