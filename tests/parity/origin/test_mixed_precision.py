"""Mixed precision (issue 71): a model that computes in bfloat16 over float32 parameters,
with its output cast to float32 by a policy constant, as `jmp` and flax's `dtype=` do.

- A recording of it keeps every bfloat16 value's dtype through its file (the store's
  codec), where it came back as raw `|V2` bytes.
- The MLP's down projection split in two half contractions summed (a reorder in
  bfloat16) is proved up to rounding, and the verdict says in which precision.
- A norm epsilon 10% larger fails, named as a changed constant in `norm`.
- The output cast dropped, made to float16, or a cast added are each named as a changed
  dtype, at the line of the cast, with both dtypes.

And the same of a training loop as users write one (`TRAIN`): an equinox GPT computing in
bfloat16 over float32 parameters, optax's adamw, a static loss scale unscaled before the
update, three steps: the split down projection proved on every loss and parameter; an
epsilon, adamw's weight decay, the unscale by the wrong factor and the attention scores
softmaxed in bfloat16 each named at their line, with their kind.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import ml_dtypes
import numpy as np
import pytest
from _model_files import model_module

import parity
from parity.origin import record
from parity.origin._edit import edit_of
from parity.origin._hunks import Diff, parse_diff
from parity.origin._recording import Recording
from parity.origin._shadow import Shadow

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
    # The edit (issue 74): of the two files' hunks (the split and the bug), the bug's, set
    # far from where it is used (a module constant, the policy's dtype) but for the cast
    # added at its use.
    edit = failed.origin.edit
    assert edit is not None and len(edit.hunks) == 1, failed.origin.line
    assert any(after in t for t in edit.hunks[0].added), failed.origin.line
    assert edit.evidence == {"constant": "constant", "dtype": "dtype"}[kind] or bug == "cast added"


def test_the_policys_output_dtype_changed_is_named_as_a_changed_dtype(tmp_path: Path) -> None:
    """The output cast is the policy's (no float32 loss after it): the key itself comes out
    in bfloat16, fails on its dtype, and the origin found by alignment is the first
    operation that computes in bfloat16 where the base cast to float32 first."""
    plain = MODEL.replace(").astype(jnp.float32)\n", ")\n", 1)
    assert plain != MODEL
    base = model_module(tmp_path / "base", plain)
    tree = model_module(
        tmp_path / "tree", plain.replace("OUTPUT = jnp.float32", "OUTPUT = jnp.bfloat16")
    )
    failed = _held(tree, base)
    assert isinstance(failed, parity.NotEquivalent)
    assert failed.origin is not None and failed.origin.origin is not None, str(failed)
    origin = failed.origin.origin
    z = next(n for n, t in enumerate(plain.splitlines(), 1) if "z = y.astype" in t)
    assert origin.change == "dtype", failed.origin.line
    assert (
        f"the base's cast to float32 at {tmp_path}/base/model.py:{z} in head"
        in origin.change_detail
    )


TRAIN = """\
import equinox as eqx
import jax
import jax.numpy as jnp
import optax

D, T, V = 32, 16, 64
EPS = 1e-5
DECAY = 0.01
SCALE = 2.0**8


class Block(eqx.Module):
    ln1: jax.Array
    qkv: jax.Array
    proj: jax.Array
    ln2: jax.Array
    up: jax.Array
    down: jax.Array


class GPT(eqx.Module):
    emb: jax.Array
    blocks: list
    lnf: jax.Array


def init(key):
    keys = iter(jax.random.split(key, 12))
    normal = lambda *shape: jax.random.normal(next(keys), shape) * 0.05
    blocks = [Block(jnp.ones(D), normal(D, 3 * D), normal(D, D), jnp.ones(D), normal(D, 4 * D),
                    normal(4 * D, D)) for _ in range(2)]
    return GPT(normal(V, D), blocks, jnp.ones(D))


def norm(x, g):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + EPS)
    return (y * g).astype(x.dtype)


def mlp(h, b):
    m = jax.nn.gelu(norm(h, b.ln2) @ b.up)
    return m @ b.down


def forward(model, tokens):
    model = jax.tree.map(lambda w: w.astype(jnp.bfloat16), model)
    h = model.emb[tokens]
    for b in model.blocks:
        q, k, v = jnp.split(norm(h, b.ln1) @ b.qkv, 3, axis=-1)
        scores = (q @ k.T).astype(jnp.float32) / jnp.sqrt(D)
        scores = jnp.where(jnp.tril(jnp.ones((T, T), bool)), scores, -1e9)
        h = h + (jax.nn.softmax(scores, axis=-1).astype(h.dtype) @ v) @ b.proj
        h = h + mlp(h, b)
    return (norm(h, model.lnf) @ model.emb.T).astype(jnp.float32)


def loss_fn(model, tokens, targets):
    logp = jax.nn.log_softmax(forward(model, tokens))
    return -jnp.mean(jnp.take_along_axis(logp, targets[:, None], axis=-1)) * SCALE


def train(model, tokens, targets):
    opt = optax.adamw(1e-3, weight_decay=DECAY)
    state = opt.init(model)
    out = {}
    for s in range(3):
        loss, grads = jax.value_and_grad(loss_fn)(model, tokens, targets)
        grads = jax.tree.map(lambda g: g / SCALE, grads)
        updates, state = opt.update(grads, state, model)
        model = eqx.apply_updates(model, updates)
        out[f"loss{s}"] = loss / SCALE
    return {"model": model, **out}
"""

TRAIN_SPLIT = (
    "    return m @ b.down\n",
    "    n = m.shape[-1] // 2\n    return m[:, :n] @ b.down[:n] + m[:, n:] @ b.down[n:]\n",
)
#: (old text, new text, the kind, the text of the line named, its function).
TRAIN_BUGS = {
    "epsilon": ("EPS = 1e-5", "EPS = 1.1e-5", "constant", "keepdims=True) + EPS)", "norm"),
    "weight decay": ("DECAY = 0.01", "DECAY = 0.02", "constant", "opt.update(", "train"),
    "unscale": ("g / SCALE, grads", "g / (SCALE / 2), grads", "constant", "g / (SCALE / 2)",
                "train.<locals>.<lambda>"),
    "softmax in bfloat16": (".astype(jnp.float32) / jnp.sqrt(D)", " / jnp.sqrt(D)", "dtype",
                            "/ jnp.sqrt(D)", "forward"),
}  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[tuple[Any, ...], Recording]:
    """The base's training loop recorded once, with its values."""
    module = model_module(tmp_path_factory.mktemp("train") / "base", TRAIN)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (module.T,), 0, module.V)
    args = (module.init(jax.random.PRNGKey(0)), tokens, jax.numpy.roll(tokens, -1))
    return args, record(module.train, *args, keep_arrays=True)


def _trained_again(trained: Any, tmp: Path, *edits: tuple[str, str]) -> tuple[Recording, Shadow]:
    args, old = trained
    text = TRAIN
    for before, after in edits:
        assert text.count(before) == 1, before
        text = text.replace(before, after)
    shadow = Shadow(old)
    new = record(model_module(tmp / "tree", text).train, *args, keep_arrays=False, shadow=shadow)
    return new, shadow


#: The training tests share one worker, so the base's loop is recorded once a session.
TRAINING = pytest.mark.xdist_group("mixed_precision_training")


@pytest.mark.slow
@TRAINING
def test_the_split_down_projection_is_proved_through_three_training_steps(
    trained: Any, tmp_path: Path
) -> None:
    new, shadow = _trained_again(trained, tmp_path, TRAIN_SPLIT)
    proofs = shadow.proofs(new)
    assert len(proofs) == len(trained[1].outputs) > 10
    assert all(p.proved for p in proofs.values()), [p.reason for p in proofs.values()][:3]
    moved = [
        k
        for k, a in trained[1].output_arrays.items()
        if not np.array_equal(a, new.output_arrays[k])
    ]
    assert moved, "the split moved no key's bits: the test proves nothing"
    assert all(proofs[k].precision == "bfloat16" for k in moved), {
        k: proofs[k].precision for k in moved
    }


@pytest.mark.slow
@TRAINING
@pytest.mark.parametrize("bug", list(TRAIN_BUGS))
def test_a_training_bug_beside_the_split_is_named_at_its_line(
    trained: Any, tmp_path: Path, bug: str
) -> None:
    before, after, kind, text, function = TRAIN_BUGS[bug]
    new, shadow = _trained_again(trained, tmp_path, TRAIN_SPLIT, (before, after))
    failed = [p for p in shadow.proofs(new).values() if not p.proved]
    assert failed, "the bug was proved"
    origin = shadow.origin(new, min(failed, key=lambda p: p.origin), root=tmp_path)
    assert origin is not None
    lines = (tmp_path / "tree" / "model.py").read_text().splitlines()
    line = next(n for n, t in enumerate(lines, 1) if text in t)
    assert (origin.change, origin.line, origin.function) == (kind, line, function), (
        origin.describe()
    )
    # The edit (issue 74): of the split's hunk and the bug's, the bug's, though the epsilon
    # and the weight decay are set at the top of the file, far from the line named.
    tree = (tmp_path / "tree" / "model.py").read_text().splitlines()
    diff = difflib.unified_diff(TRAIN.splitlines(), tree, "a", "tree/model.py", n=0, lineterm="")
    text = "\n".join(diff)
    edit = edit_of(origin, Diff(parse_diff(text), {"tree/model.py": "\n".join(tree)}))
    assert len(edit.hunks) == 1 and after.strip() in edit.hunks[0].added[0], edit.line
    assert edit.evidence == ("constant" if bug in ("epsilon", "weight decay") else "frame"), (
        edit.line
    )
