"""A newcomer's project (issue 48): a 4-layer pure-JAX transformer that returns only its
logits, written twice, as a user refactoring it would have it.

`MODEL` is the code as it was: a Python loop over a list of per-layer weight dicts, `@`
for every matmul. `REFACTOR` is the same model after the refactor: the layers' weights
stacked, the loop a `lax.scan`, one `einsum` for the attention scores. `BUGS` are three
one-line changes of the refactored code a review could miss: a layer-norm epsilon 1e-5 ->
1e-6, `gelu`'s tanh approximation, a causal mask off by one. Each module's text is kept
here so that a test can write it into a fresh git project, or import it in process
(`load`). As a project: the model at `MODEL_FILE`, `PRODUCERS` (one group, `forward`, its
logits under `op_by_op`) and its `[tool.parity]` table `TABLE`; `with_provenance` rewrites a
golden file's provenance (its arrays untouched), as if it were pinned elsewhere.
`REORDER` is the refactor with a sum reordered (for a proof up to rounding), and
`PLUGIN_VERDICTS` a test of the project that writes what the pytest plugin decided, which
`every_face` runs beside `parity check`, `parity bisect` and a live face.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

MODEL = """\
import jax
import jax.numpy as jnp

LAYERS, D, HEADS, VOCAB, T = 4, 32, 4, 64, 16


def init(key):
    keys = jax.random.split(key, 2 + 4 * LAYERS)
    scale = D ** -0.5
    layers = []
    for i in range(LAYERS):
        k = keys[2 + 4 * i : 6 + 4 * i]
        layers.append({
            "qkv": jax.random.normal(k[0], (D, 3 * D)) * scale,
            "out": jax.random.normal(k[1], (D, D)) * scale,
            "up": jax.random.normal(k[2], (D, 4 * D)) * scale,
            "down": jax.random.normal(k[3], (4 * D, D)) * (4 * D) ** -0.5,
        })
    return {
        "embed": jax.random.normal(keys[0], (VOCAB, D)),
        "unembed": jax.random.normal(keys[1], (D, VOCAB)) * scale,
        "layers": layers,
    }


def layer_norm(x):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5)


def causal_mask(t):
    return jnp.tril(jnp.ones((t, t), bool))


def attention(x, w):
    t = x.shape[0]
    q, k, v = jnp.split(x @ w["qkv"], 3, axis=-1)
    q, k, v = (a.reshape(t, HEADS, D // HEADS).transpose(1, 0, 2) for a in (q, k, v))
    scores = q @ k.transpose(0, 2, 1) / jnp.sqrt(D // HEADS)
    scores = jnp.where(causal_mask(t), scores, -1e9)
    out = jax.nn.softmax(scores, axis=-1) @ v
    return out.transpose(1, 0, 2).reshape(t, D) @ w["out"]


def mlp(x, w):
    return jax.nn.gelu(x @ w["up"], approximate=False) @ w["down"]


def block(x, w):
    x = x + attention(layer_norm(x), w)
    return x + mlp(layer_norm(x), w)


def forward(params, tokens):
    x = params["embed"][tokens]
    for w in params["layers"]:
        x = block(x, w)
    return layer_norm(x) @ params["unembed"]
"""

REFACTOR = MODEL.replace(
    """def forward(params, tokens):
    x = params["embed"][tokens]
    for w in params["layers"]:
        x = block(x, w)
    return layer_norm(x) @ params["unembed"]
""",
    """def stack(params):
    layers = jax.tree.map(lambda *ws: jnp.stack(ws), *params["layers"])
    return {**params, "layers": layers}


def forward(params, tokens):
    stacked = stack(params)
    x = stacked["embed"][tokens]

    def step(x, w):
        return block(x, w), None

    x, _ = jax.lax.scan(step, x, stacked["layers"])
    return layer_norm(x) @ stacked["unembed"]
""",
).replace(
    "    scores = q @ k.transpose(0, 2, 1) / jnp.sqrt(D // HEADS)\n",
    '    scores = jnp.einsum("hqd,hkd->hqk", q, k) / jnp.sqrt(D // HEADS)\n',
)

#: The refactor with its MLP's down projection summed in two halves of its contraction: a
#: reordered sum, which no proof op by op covers and a proof up to rounding does.
REORDER = REFACTOR.replace(
    '    return jax.nn.gelu(x @ w["up"], approximate=False) @ w["down"]\n',
    """    h = jax.nn.gelu(x @ w["up"], approximate=False)
    half = h.shape[-1] // 2
    return h[:, :half] @ w["down"][:half] + h[:, half:] @ w["down"][half:]
""",
)

#: The bugs: name -> (the line as the refactor has it, the line as the bug has it).
BUGS = {
    "epsilon": (
        "    return (x - mean) / jnp.sqrt(var + 1e-5)\n",
        "    return (x - mean) / jnp.sqrt(var + 1e-6)\n",
    ),
    "gelu_tanh": (
        '    return jax.nn.gelu(x @ w["up"], approximate=False) @ w["down"]\n',
        '    return jax.nn.gelu(x @ w["up"], approximate=True) @ w["down"]\n',
    ),
    "mask_off_by_one": (
        "    return jnp.tril(jnp.ones((t, t), bool))\n",
        "    return jnp.tril(jnp.ones((t, t), bool), k=1)\n",
    ),
}


MODEL_FILE = "src/tinyformer/__init__.py"
TABLE = 'producers = "producers.py"\nsrc = ["src"]\n'
PRODUCERS = """\
import jax

import tinyformer


def forward():
    params = tinyformer.init(jax.random.key(0))
    tokens = jax.numpy.arange(tinyformer.T) % tinyformer.VOCAB
    return {"logits": jax.jit(tinyformer.forward)(params, tokens)}


GROUPS = {"forward": forward}
CLASS_MAP = [("logits", "op_by_op")]
"""


#: The plugin's face: a test that writes each key's verdict and basis to verdicts.json.
PLUGIN_VERDICTS = """\
import json

import producers


def test_forward(parity_check):
    comparison = parity_check(producers.forward(), "forward", fail=False)
    verdicts = {f"forward/{f.key}": [f.verdict, f.basis] for f in comparison.findings}
    with open("verdicts.json", "w") as out:
        json.dump(verdicts, out)
"""


def every_face(
    repo: Path,
    shas: Mapping[str, str],
    live: Callable[[str], Any],
    *,
    run_parity: Callable[..., Any],
    run_pytest: Callable[..., Any],
    git: Callable[..., str],
    out: Path,
    bisect: Sequence[str] = (),
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """What each face decided of the project's commits `shas` (name -> sha, oldest first):
    `parity bisect` from the pin (the first commit's parent) to the last with `bisect`'s
    flags, then at each commit `parity check`, the plugin (`PLUGIN_VERDICTS`) and `live`
    (`assert_equivalent`'s face: name -> key -> [verdict, basis]).

    **Returns:** `(bisect's JSON report, {name: {face: {key: [verdict, basis]}}})`.
    """
    names = list(shas)
    git(repo, "checkout", "-q", shas[names[-1]])
    pin = git(repo, "rev-parse", f"{shas[names[0]]}~1")
    report = out / "bisect.json"
    done = run_parity(repo, "bisect", pin, shas[names[-1]], *bisect, "--origin", "off",
                      "--json", str(report))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(report.read_text())
    steps = {s["sha"]: s for s in found["steps"]}
    (repo / "test_forward.py").write_text(PLUGIN_VERDICTS)
    faces: dict[str, dict[str, Any]] = {}
    try:
        for name in names:
            git(repo, "checkout", "-q", shas[name])
            checked = out / f"check-{name}.json"
            run_parity(repo, "check", "--origin", "off", "--json", str(checked))
            ran = run_pytest(repo, "test_forward.py")
            assert ran.returncode == 0, ran.stdout + ran.stderr
            doc = json.loads(checked.read_text())
            faces[name] = {
                "check": {f["key"]: [f["verdict"], f["basis"]] for f in doc["findings"]},
                "bisect": steps[shas[name]]["verdicts"],
                "plugin": json.loads((repo / "verdicts.json").read_text()),
                "assert_equivalent": live(name),
            }
            (repo / "verdicts.json").unlink()
    finally:
        (repo / "test_forward.py").unlink()
    return found, faces


def with_provenance(path: Path, changes: Mapping[str, Any]) -> None:
    """Rewrite the golden file at `path` with `changes` (field -> value) over its
    provenance; its arrays, classes, class map and order stay."""
    import dataclasses

    from parity.store import open_goldens, write_goldens

    with open_goldens(path) as gf:
        arrays = {k: gf[k] for k in gf}
        classes = {k: gf.info(k).class_name for k in gf}
        prov, cmap, order = gf.provenance, gf.class_map_json, gf.ordered_keys()
    write_goldens(path, arrays, classes=classes, class_map_json=cmap,
                  provenance=dataclasses.replace(prov, **changes), order=order)  # fmt: skip


def buggy(name: str) -> str:
    """The refactored module with bug `name`."""
    was, now = BUGS[name]
    assert REFACTOR.count(was) == 1, name
    return REFACTOR.replace(was, now)


def bug_line(name: str) -> int:
    """The 1-based line of bug `name` in `buggy(name)`, found by text."""
    now = BUGS[name][1].rstrip("\n")
    return next(n for n, text in enumerate(buggy(name).splitlines(), 1) if text == now)


def load(text: str, path: Path) -> types.ModuleType:
    """`text` written to `path` and imported from there as a module of that file's name
    (so a source line an origin names is a line of `text`)."""
    import importlib.util

    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
