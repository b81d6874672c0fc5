"""Any layout a refactor makes (issue 73): the goldens read through the user's own
converter. A producers file declares `CONVERT = {"group": function}`, the function that
turns an old checkpoint into the refactor's layout; parity probes it on the goldens' layout
(never their values), refuses one that computes, and reads the tree in the goldens' layout
through it, so each golden key is judged under its own class and a failure names it and
where the tree holds its element.

The project is a plain-JAX two-layer attention model whose q, k and v projections are then
fused into one `qkv` (initialised by the user's own `fuse`), its trajectory producer
returning the parameters after two jitted SGD steps; then a bug that scales the k rows of
the fused bias at load.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import parity
from parity.judge._converting import (
    Conversion,
    ConvertError,
    concatenation_offer,
    nested,
    probe,
)
from parity.judge._trees import flatten

D, L = 4, 2


def _fuse(block: dict[str, Any]) -> dict[str, Any]:
    """The user's converter of one block: q, k and v concatenated on their outputs."""
    return {
        "qkv": {
            "w": np.concatenate([block[n]["w"] for n in "qkv"], axis=1),
            "b": np.concatenate([block[n]["b"] for n in "qkv"]),
        }
    }


def _fuse_params(params: dict[str, Any]) -> dict[str, Any]:
    return {"blocks": {i: {"attn": _fuse(b["attn"])} for i, b in params["blocks"].items()}}


LAYOUT = {
    f"params.blocks.{i}.attn.{n}.{p}": ((D, D) if p == "w" else (D,))
    for i in range(L)
    for n in "qkv"
    for p in "wb"
}


def _goldens() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {k: rng.normal(size=s).astype(np.float32) for k, s in LAYOUT.items()}


def test_a_fusing_converter_is_read_as_moves_and_the_tree_is_read_back_in_the_goldens_layout() -> (
    None
):
    conversion = probe(lambda g: {**g, "params": _fuse_params(g["params"])}, LAYOUT)
    assert {k: m.shape for k, m in conversion.maps.items()} == {
        f"params.blocks.{i}.attn.qkv.{p}": ((D, 3 * D) if p == "w" else (3 * D,))
        for i in range(L)
        for p in "wb"
    }
    goldens = _goldens()
    tree = flatten({"params": _fuse_params(nested(goldens)["params"])})
    back = conversion.to_expected_layout(tree)
    # Every golden key rebuilt, in its place, from the fused tree's elements, bit for bit.
    assert sorted(back) == sorted(goldens)
    assert all(np.array_equal(back[k], goldens[k]) for k in goldens)
    # Where the tree holds an element of a golden key: k's column 3 is the fused column 7.
    assert (
        conversion.read_as("params.blocks.1.attn.k.w", (2, 3)) == "params.blocks.1.attn.qkv.w[2, 7]"
    )
    assert conversion.read_as("params.blocks.0.attn.v.b", (1,)) == "params.blocks.0.attn.qkv.b[9]"
    # Carried across the producer process's edge as arrays, and back.
    again = Conversion.from_arrays(conversion.to_arrays())
    assert again.sources == conversion.sources
    assert all(np.array_equal(again.maps[k], m) for k, m in conversion.maps.items())
    # A tree key of another shape than the converter's is left as it is: its goldens missing.
    other = dict(tree, **{"params.blocks.0.attn.qkv.w": np.zeros((3 * D, D), np.float32)})
    partly = conversion.to_expected_layout(other)
    assert "params.blocks.0.attn.qkv.w" in partly and "params.blocks.0.attn.q.w" not in partly
    assert "params.blocks.0.attn.q.b" in partly  # the bias still reads through


def test_missing_keys_a_new_key_holds_concatenated_are_offered_the_converter() -> None:
    """q, k and v missing and `qkv` new, of the shapes they concatenate to on one axis:
    each missing key is offered the converter; keys of other shapes or dtypes are not."""
    f32 = "float32"
    missing = {k: (tuple(s), f32) for k, s in LAYOUT.items() if ".0." in k}
    missing["params.blocks.0.attn.o.w"] = ((D, D), "bfloat16")  # another dtype: not part
    new = {
        "params.blocks.0.attn.qkv.w": ((D, 3 * D), f32),
        "params.blocks.0.attn.qkv.b": ((3 * D,), f32),
        "params.blocks.0.mlp.w": ((D, 2 * D), f32),  # no siblings of its leaf: nothing
    }
    offered = concatenation_offer(missing, new)
    assert offered == {
        **{f"params.blocks.0.attn.{n}.w": ("params.blocks.0.attn.qkv.w", 1) for n in "qkv"},
        **{f"params.blocks.0.attn.{n}.b": ("params.blocks.0.attn.qkv.b", 0) for n in "qkv"},
    }
    assert concatenation_offer(missing, {"params.blocks.0.attn.qkv.w": ((D, 2 * D), f32)}) == {}


def test_a_converter_that_stacks_the_layers_and_fuses_q_k_v_in_one_is_read_back() -> None:
    """Layers stacked and q, k, v fused in one commit, said by one converter and no
    `STACK`: every per-layer, per-projection golden key is rebuilt from the stacked, fused
    tree, and an element of layer 1's k is found in the stacked key's row 1."""

    def convert(g: dict[str, Any]) -> dict[str, Any]:
        fused = [_fuse(g["params"]["blocks"][str(i)]["attn"])["qkv"] for i in range(L)]
        return {"params": {"attn": {p: np.stack([f[p] for f in fused]) for p in "wb"}}}

    conversion = probe(convert, LAYOUT)
    goldens = _goldens()
    tree = flatten(convert(nested(goldens)))
    assert sorted(tree) == ["params.attn.b", "params.attn.w"]
    back = conversion.to_expected_layout(tree)
    assert sorted(back) == sorted(goldens)
    assert all(np.array_equal(back[k], goldens[k]) for k in goldens)
    assert conversion.read_as("params.blocks.1.attn.k.w", (0, 2)) == "params.attn.w[1, 0, 6]"


@pytest.mark.parametrize(
    ("convert", "said"),
    [
        (
            lambda g: {"x": g["params"]["blocks"]["0"]["attn"]["k"]["b"] * 2},
            "no golden element moved",
        ),
        (
            lambda g: {"x": g["params"]["blocks"]["0"]["attn"]["k"]["b"] + 1},
            "no golden element moved",
        ),
        (
            lambda g: {"x": g["params"]["blocks"]["0"]["attn"]["k"]["b"].astype(np.float32)},
            "it returned float32",
        ),
        (
            lambda g: {"x": np.tile(g["params"]["blocks"]["0"]["attn"]["k"]["b"], 2)},
            "reads one golden element into two places",
        ),
        (lambda g: g["nothing"], "the converter raised KeyError"),
    ],
)
def test_a_converter_that_computes_copies_or_raises_is_refused_saying_where(
    convert: Callable[[dict[str, Any]], Any], said: str
) -> None:
    with pytest.raises(ConvertError, match=said):
        probe(convert, LAYOUT)


def test_assert_equivalent_reads_a_fused_tree_through_the_users_converter() -> None:
    """`assert_equivalent(convert=)`: the fused tree judged under the unfused keys of the
    reference, a bug in its k rows named by the old key and where the tree holds it."""
    goldens = _goldens()
    expected = nested(goldens)
    fused = {"params": _fuse_params(expected["params"])}

    def convert(g: dict[str, Any]) -> dict[str, Any]:
        return {"params": _fuse_params(g["params"])}

    comparison = parity.assert_equivalent(fused, expected, convert=convert)
    assert sorted(f.key for f in comparison.findings) == sorted(goldens)
    b = fused["params"]["blocks"]["1"]["attn"]["qkv"]["b"]
    b[D + 2] += 1e-3  # the k rows' third element
    with pytest.raises(parity.NotEquivalent) as failed:
        parity.assert_equivalent(fused, expected, convert=convert)
    message = str(failed.value)
    assert "params.blocks.1.attn.k.b" in message, message
    assert f"the tree's element: params.blocks.1.attn.qkv.b[{D + 2}]" in message, message
    with pytest.raises(parity.CheckError, match="the converter computes"):
        parity.assert_equivalent(fused, expected, convert=lambda g: {"x": g["params"] and 1.0})


def test_assert_equivalent_follows_the_converter_to_the_origin_of_a_bug() -> None:
    """With the functions given, a failing key of the reference's layout is settled through
    the converter: its origin is the operation that made the fused output's k part."""
    import jax.numpy as jnp

    x = jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32)

    def old_fn(a: Any) -> Any:
        return {"q": jnp.tanh(a) * 2.0, "k": jnp.tanh(a) * 3.0}

    def new_fn(a: Any) -> Any:
        return {"qk": jnp.concatenate([jnp.tanh(a) * 2.0, jnp.tanh(a) * 3.01])}  # the bug

    def convert(g: dict[str, Any]) -> dict[str, Any]:
        return {"qk": jnp.concatenate([g["q"], g["k"]])}

    with pytest.raises(parity.NotEquivalent) as failed:
        parity.assert_equivalent(
            new_fn(x), old_fn(x), convert=convert, new_fn=new_fn, old_fn=old_fn, args=(x,)
        )
    found = failed.value.origin
    assert found is not None and found.origin is not None, str(failed.value)
    line = new_fn.__code__.co_firstlineno + 1
    assert (found.origin.primitive, found.origin.line, found.key) == ("mul", line, "k"), found.line


MODEL = """\
import jax
import jax.numpy as jnp
import numpy as np

D, L = 4, 2


def init(key):
    blocks = []
    for k in jax.random.split(key, L):
        ks = jax.random.split(k, 6)
        blocks.append({"attn": {
            n: {"w": jax.random.normal(ks[2 * j], (D, D)) * D**-0.5,
                "b": jax.random.normal(ks[2 * j + 1], (D,)) * 0.1}
            for j, n in enumerate("qkv")
        }})
    return {"blocks": blocks}


def attend(x, p):
    q, k, v = (x @ p[n]["w"] + p[n]["b"] for n in "qkv")
    return x + jax.nn.softmax(q @ k.T / D**0.5) @ v


def forward(params, x):
    for b in params["blocks"]:
        x = attend(x, b["attn"])
    return x


def loss(params, x):
    return jnp.mean(forward(params, x) ** 2)


def step(params, x):
    g = jax.grad(loss)(params, x)
    return jax.tree.map(lambda p, d: p - 0.1 * d, params, g)
"""

#: The refactor: q, k and v fused into one projection, initialised by the user's own
#: converter of a checkpoint (`fuse`), which the producers' CONVERT then names in one line.
FUSED = MODEL.replace(
    """    return {"blocks": blocks}
""",
    """    return {"blocks": [{"attn": fuse(b["attn"])} for b in blocks]}


def fuse(attn):
    cat = jnp.concatenate if isinstance(attn["q"]["w"], jax.Array) else np.concatenate
    return {"qkv": {"w": cat([attn[n]["w"] for n in "qkv"], axis=1),
                    "b": cat([attn[n]["b"] for n in "qkv"])}}


def fuse_checkpoint(params):
    return {"blocks": {i: {"attn": fuse(b["attn"])} for i, b in params["blocks"].items()}}
""",
).replace(
    """    q, k, v = (x @ p[n]["w"] + p[n]["b"] for n in "qkv")
""",
    """    q, k, v = jnp.split(x @ p["qkv"]["w"] + p["qkv"]["b"], 3, axis=-1)
""",
)

#: The bug: the k rows of the fused bias scaled at load.
BUGGY = FUSED.replace(
    """    return {"blocks": [{"attn": fuse(b["attn"])} for b in blocks]}
""",
    """    fused = [{"attn": fuse(b["attn"])} for b in blocks]
    fused[1]["attn"]["qkv"]["b"] = fused[1]["attn"]["qkv"]["b"].at[D : 2 * D].multiply(1.01)
    return {"blocks": fused}
""",
)

PRODUCERS = """\
import jax
import jax.numpy as jnp

import model


def train():
    params = model.init(jax.random.key(0))
    x = jnp.linspace(-1.0, 1.0, 6 * model.D).reshape(6, model.D)
    step = jax.jit(model.step)
    for _ in range(2):
        params = step(params, x)
    return {"params": params}


GROUPS = {"train": train}
CLASS_MAP = [("*", "fp32_reassoc")]
"""

#: The project's test through the pytest plugin: no converter of its own, the producers'
#: CONVERT read as `parity check` reads it.
PLUGIN_TEST = """\
import producers


def test_train(parity_check):
    parity_check(producers.train(), "train")
"""

CONVERT = 'CONVERT = {"train": lambda g: {**g, "params": model.fuse_checkpoint(g["params"])}}\n'


@pytest.mark.slow
def test_a_fused_qkv_refactor_passes_its_unfused_goldens_through_the_users_converter(
    tmp_path_factory: pytest.TempPathFactory,
    git_project: Any,
    git: Any,
    run_parity: Callable[..., Any],
    run_pytest: Callable[..., Any],
) -> None:
    repo: Path = git_project(
        tmp_path_factory.mktemp("fused"), PRODUCERS,
        'producers = "producers.py"\nsrc = ["src"]\n', files={"src/model.py": MODEL},
    )  # fmt: skip
    model, producers = repo / "src" / "model.py", repo / "producers.py"
    model.write_text(FUSED)
    # Without the converter, the fused keys are new and the unfused goldens missing.
    undeclared = run_parity(repo, "check", "--origin", "off")
    assert undeclared.returncode == 1, undeclared.stdout + undeclared.stderr
    said = "its elements are part of the new key 'params.blocks.0.attn.qkv.w' (by shapes"
    assert said in undeclared.stdout, undeclared.stdout
    # Declared in one line, the tree is read in the goldens' layout: every unfused golden
    # key holds its class, none missing, none new.
    producers.write_text(PRODUCERS + CONVERT)
    done = run_parity(repo, "check", "--origin", "off")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "qkv" not in done.stdout and "missing" not in done.stdout, done.stdout
    # The bug fails under the old key it moved, and says where the tree holds its element;
    # its origin is followed through the converter (the golden key gathered from the fused
    # output, a move) to the line that scaled the k rows.
    model.write_text(BUGGY)
    bug = run_parity(repo, "check")
    assert bug.returncode == 1, bug.stdout + bug.stderr
    failures = bug.stdout[bug.stdout.index("failures (") :]
    assert "train/params.blocks.1.attn.k.b [fp32_reassoc, fail]" in failures, failures
    assert "the tree's element: params.blocks.1.attn.qkv.b[" in failures, failures
    assert "attn.q.b" not in failures and "attn.v.b" not in failures, failures
    line = next(n for n, t in enumerate(BUGGY.splitlines(), 1) if "multiply(1.01)" in t)
    origin = next(ln for ln in bug.stdout.splitlines() if ln.strip().startswith("origin:"))
    assert f"at src/model.py:{line} in init" in origin, origin
    # The pytest plugin reads CONVERT as the check does: the same key fails, said the same.
    (repo / "test_train.py").write_text(PLUGIN_TEST)
    try:
        plugged = run_pytest(repo, "test_train.py", "--parity-origin", "off")
    finally:
        (repo / "test_train.py").unlink()
    assert plugged.returncode == 1, plugged.stdout + plugged.stderr
    assert "params.blocks.1.attn.k.b [fp32_reassoc, fail]" in plugged.stdout, plugged.stdout
    assert "the tree's element: params.blocks.1.attn.qkv.b[" in plugged.stdout
    assert "missing" not in plugged.stdout and "attn.q.b" not in plugged.stdout
    # A converter that computes is refused, naming the key and the element (exit 2).
    producers.write_text(
        PRODUCERS + 'CONVERT = {"train": lambda g: {"params": {"w": '
        'g["params"]["blocks"]["0"]["attn"]["q"]["w"] * 2}}}\n'
    )
    refused = run_parity(repo, "check", "--origin", "off")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = refused.stdout + refused.stderr
    assert "CONVERT['train'] cannot be used: the converter computes 'params.w'" in said, said
