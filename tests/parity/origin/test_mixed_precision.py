"""Mixed precision (issue 71): a model that computes in bfloat16 over float32 parameters,
with its output cast to float32 by a policy constant, as `jmp` and flax's `dtype=` do.

- A recording of it keeps every bfloat16 value's dtype through its file (the store's
  codec), where it came back as raw `|V2` bytes.
- The MLP's down projection split in two half contractions summed (a reorder in
  bfloat16) is proved up to rounding, and the verdict says in which precision.
- A norm epsilon 10% larger fails, named as a changed constant in `norm`.
- The output cast dropped, made to float16, or a cast added are each named as a changed
  dtype, at the line of the cast, with both dtypes.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import jax
import ml_dtypes
import numpy as np
import pytest
from _model_files import model_module

import parity
from parity.origin import record
from parity.origin._recording import Recording

MODEL = """\
import jax
import jax.numpy as jnp

COMPUTE = jnp.bfloat16
OUTPUT = jnp.float32
EPS = 1e-5


def norm(x):
    x32 = x.astype(jnp.float32)
    m = jnp.mean(x32 * x32, axis=-1, keepdims=True)
    return (x32 * jax.lax.rsqrt(m + EPS)).astype(x.dtype)


def mlp(h, up, down):
    a = jax.nn.gelu(h @ up.astype(COMPUTE))
    return a @ down.astype(COMPUTE)


def head(y):
    z = y.astype(OUTPUT)
    return jax.nn.log_softmax(jnp.tanh(z) * 3 + z).astype(jnp.float32)


def forward(x, up, down):
    h = norm(x.astype(COMPUTE))
    return {"y": head(mlp(h, up, down))}
"""

SPLIT = (
    "    return a @ down.astype(COMPUTE)\n",
    "    n = a.shape[-1] // 2\n"
    "    return a[:, :n] @ down[:n].astype(COMPUTE) + a[:, n:] @ down[n:].astype(COMPUTE)\n",
)

#: (old text, new text, the kind, the line's text in the tree, words the detail holds).
BUGS = {
    "epsilon": ("EPS = 1e-5", "EPS = 1.1e-5", "constant", "rsqrt(m + EPS)", ["1.1e-05"]),
    "cast dropped": ("OUTPUT = jnp.float32", "OUTPUT = jnp.bfloat16", "dtype", "jnp.tanh(z)",
                     ["base/model.py:{z} in head is not made", "the base's cast to float32 at ",
                      "in bfloat16 where the base computed in float32"]),
    "cast changed": ("OUTPUT = jnp.float32", "OUTPUT = jnp.float16", "dtype", "z = y.astype",
                     ["it casts to float16 where the base cast to float32",
                      "base/model.py:{z} in head"]),
    "cast added": ("jnp.tanh(z) * 3", "jnp.tanh(z).astype(COMPUTE) * 3", "dtype",
                   ".astype(COMPUTE) * 3", ["tree/model.py:{line} in head, where",
                                            "a cast to bfloat16 at ",
                                            "the base's operand was float32"]),
}  # fmt: skip


def _inputs() -> tuple[jax.Array, ...]:
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    # Inputs small enough that the norm's epsilon is a visible part of the mean square.
    return (
        jax.random.normal(keys[0], (8, 32)) * 0.003,
        jax.random.normal(keys[1], (32, 128)) * 0.1,
        jax.random.normal(keys[2], (128, 32)) * 0.1,
    )


def _held(new: ModuleType, old: ModuleType) -> parity.NotEquivalent | parity.Comparison:
    args = _inputs()
    try:
        return parity.assert_equivalent(
            new.forward(*args), old.forward(*args), class_map="up_to_rounding",
            new_fn=new.forward, old_fn=old.forward, args=args,
        )  # fmt: skip
    except parity.NotEquivalent as e:
        return e


def test_a_bfloat16_recording_keeps_its_dtypes_through_its_file(tmp_path: Path) -> None:
    base = model_module(tmp_path / "base", MODEL)
    recording = record(base.forward, *_inputs(), keep_arrays=True)
    assert recording.arrays is not None
    path = tmp_path / "recording.npz"
    np.savez(path, **recording.to_arrays())  # pyright: ignore[reportArgumentType]
    back = Recording.read(path)
    assert back.arrays is not None
    bf16 = [i for i, v in enumerate(recording.values) if v.dtype == "bfloat16"]
    assert bf16, "the model computes nothing in bfloat16: the test proves nothing"
    for i, (a, b) in enumerate(zip(recording.arrays, back.arrays, strict=True)):
        assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), i
    assert all(back.arrays[i].dtype == np.dtype(ml_dtypes.bfloat16) for i in bf16)


def test_a_reorder_in_bfloat16_is_proved_in_its_precision(tmp_path: Path) -> None:
    base = model_module(tmp_path / "base", MODEL)
    split = model_module(tmp_path / "tree", MODEL.replace(*SPLIT))
    args = _inputs()
    assert not np.array_equal(split.forward(*args)["y"], base.forward(*args)["y"])  # premise
    result = _held(split, base)
    assert isinstance(result, parity.Comparison), str(result)
    (finding,) = result.findings
    assert finding.basis == "rounding", finding.note
    assert finding.note.startswith("proved up to rounding: "), finding.note
    assert "in bfloat16 (u = 2^-8: a change smaller than one bfloat16 rounding" in finding.note


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_bug_beside_the_reorder_is_named_at_its_line_with_its_kind(
    tmp_path: Path, bug: str
) -> None:
    before, after, kind, text, words = BUGS[bug]
    assert MODEL.count(before) == 1
    base = model_module(tmp_path / "base", MODEL)
    tree = model_module(tmp_path / "tree", MODEL.replace(*SPLIT).replace(before, after))
    failed = _held(tree, base)
    assert isinstance(failed, parity.NotEquivalent), "the bug was proved"
    assert "not proved up to rounding: " in str(failed)
    assert failed.origin is not None and failed.origin.origin is not None, str(failed)
    origin = failed.origin.origin
    lines = (tmp_path / "tree" / "model.py").read_text().splitlines()
    line = next(n for n, t in enumerate(lines, 1) if text in t)
    assert (origin.change, origin.line) == (kind, line), failed.origin.line
    z = next(n for n, t in enumerate(MODEL.splitlines(), 1) if "z = y.astype" in t)
    said = [w.format(z=z, line=line) for w in words]
    assert all(w in origin.change_detail for w in said), origin.change_detail
