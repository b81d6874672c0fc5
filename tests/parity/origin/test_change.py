"""The kind of change at the origin (issue 58, `parity.origin._change`): a changed constant,
a changed edge (a step removed or added, two arguments swapped, a read rewired) and a
changed operation, each named with what changed, on two copies of one small model file
(the base's and the edited one, the same file name and function names, as a golden check
sees them), through `parity.localise`.
"""

from __future__ import annotations

from pathlib import Path

import jax
import pytest
from _model_files import model_module

import parity
from parity.origin._change import CHANGES

#: The base's model: a module-level constant, a norm, an MLP called with its two weights.
MODEL = """\
import jax.numpy as jnp

EPS = 1e-5


def norm(x):
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS)


def mlp(h, up, down):
    return jnp.tanh(h @ up) @ down


def scaled(h, by):
    return h * by


def forward(x, up, down, table):
    h = norm(x)
    h = mlp(h, up, down)
    h = scaled(h, 0.5)
    return {"y": h + table[1]}
"""

#: One edit per kind: (old text, new text, the kind, words the detail must hold).
EDITS = {
    "constant": ("EPS = 1e-5", "EPS = 1e-6", "constant", ["1e-06", "1e-05"]),
    "removed step": ("    h = norm(x)\n", "    h = x\n", "edge", ["input 1", "in norm"]),
    "swapped": ("mlp(h, up, down)\n    h = scaled", "mlp(h, down, up)\n    h = scaled", "edge",
                ["input 3", "input 2"]),
    "rewired": ("table[1]", "table[0]", "edge", ["another part of the same operand",
                                                 "base/model.py"]),
    "added step": ("    h = mlp(h, up, down)\n", "    h = jnp.tanh(mlp(h, up, down))\n", "edge",
                   ["a step the base does not take", "no tanh here in forward"]),
    "operation": ("jnp.tanh(h @ up)", "jnp.sin(h @ up)", "operation",
                  ["sin where the base ran tanh", "base/model.py"]),
}  # fmt: skip


def _inputs() -> tuple[jax.Array, ...]:
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    return (
        jax.random.normal(keys[0], (4, 8)),
        jax.random.normal(keys[1], (8, 8)),
        jax.random.normal(keys[2], (8, 8)),
        jax.random.normal(keys[3], (3, 8)),
    )


@pytest.mark.parametrize("edit", list(EDITS))
def test_each_kind_of_edit_is_named_with_what_changed(tmp_path: Path, edit: str) -> None:
    before, after, kind, words = EDITS[edit]
    assert MODEL.count(before) == 1
    old = model_module(tmp_path / "base", MODEL)
    # Three lines more at the top: every line below moves, and the pairing holds.
    new = model_module(
        tmp_path / "tree", "# edited\n# copy\n# here\n" + MODEL.replace(before, after)
    )
    loc = parity.localise(new.forward, old.forward, *_inputs(), root=tmp_path)
    assert loc.named, loc.line
    origin = loc.origin
    assert origin is not None
    assert origin.change == kind, loc.line
    assert all(w in origin.change_detail for w in words), origin.change_detail
    assert f"{CHANGES[kind]}: {origin.change_detail}" in loc.line


def test_a_changed_constant_is_named_at_the_line_that_uses_it(tmp_path: Path) -> None:
    """A module-level constant is not in the program: its value is, at the line using it."""
    old = model_module(tmp_path / "base", MODEL)
    new = model_module(tmp_path / "tree", MODEL.replace("EPS = 1e-5", "EPS = 1e-6"))
    origin = parity.localise(new.forward, old.forward, *_inputs(), root=tmp_path).origin
    assert origin is not None
    uses = next(n for n, t in enumerate(MODEL.splitlines(), 1) if "+ EPS)" in t)
    assert (origin.file, origin.line, origin.function) == ("tree/model.py", uses, "norm")


def test_an_edge_names_the_place_of_the_value_the_base_read(tmp_path: Path) -> None:
    """A step removed: the MLP reads the input where the base read the norm's output, made
    at the base's own line in `norm` (before the three lines the edit added above it)."""
    old = model_module(tmp_path / "base", MODEL)
    new = model_module(
        tmp_path / "tree", "#\n#\n#\n" + MODEL.replace("    h = norm(x)\n", "    h = x\n")
    )
    origin = parity.localise(new.forward, old.forward, *_inputs(), root=tmp_path).origin
    assert origin is not None and origin.change == "edge"
    norm_line = next(n for n, t in enumerate(MODEL.splitlines(), 1) if "return x / jnp" in t)
    assert f"made at base/model.py:{norm_line} in norm" in origin.change_detail


def test_a_constant_changed_where_the_pairing_by_rank_fails_is_said(tmp_path: Path) -> None:
    """A refactor that runs the norm on each half of the batch (two operations of other
    shapes where the base ran one) with its epsilon changed: nothing pairs by rank, and the
    base's constant at that place is said beside the new one."""
    old = model_module(tmp_path / "base", MODEL)
    split = "    h = jnp.concatenate([norm(x[:2]), norm(x[2:])])\n"
    new_text = MODEL.replace("EPS = 1e-5", "EPS = 1e-6").replace("    h = norm(x)\n", split)
    new = model_module(tmp_path / "tree", new_text)
    loc = parity.localise(new.forward, old.forward, *_inputs(), root=tmp_path)
    origin = loc.origin
    assert origin is not None and origin.change == "constant", loc.line
    assert origin.function == "norm", loc.line
    assert "its constant 1e-06 where the base's add here had 1e-05" in origin.change_detail


#: A callee whose last step is removed (`return h` for `return norm(h)`): what it gives out
#: is a value the base computed too, and the caller's operation that reads it is the first
#: to compute what the base never did. The edit is in the callee.
CALLEE = """\
import jax.numpy as jnp


def norm(x):
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-5)


def block(x, w):
    h = x @ w
    return norm(h)


def forward(x, w):
    return {"y": jnp.tanh(block(x, w)) * 2.0}
"""


def test_a_step_removed_at_a_callees_end_is_named_in_the_callee(tmp_path: Path) -> None:
    old = model_module(tmp_path / "base", CALLEE)
    new = model_module(tmp_path / "tree", CALLEE.replace("return norm(h)", "return h"))
    x, w = _inputs()[:2]
    loc = parity.localise(new.forward, old.forward, x, w, root=tmp_path)
    origin = loc.origin
    assert origin is not None and origin.change == "edge", loc.line
    lines = CALLEE.splitlines()
    made = next(n for n, t in enumerate(lines, 1) if "h = x @ w" in t)
    call = next(n for n, t in enumerate(lines, 1) if "return norm(h)" in t)
    uses = next(n for n, t in enumerate(lines, 1) if "jnp.tanh(block" in t)
    assert (origin.file, origin.line, origin.function) == ("tree/model.py", made, "block")
    assert origin.primitive == "dot_general" and origin.chain[0] == f"tree/model.py:{made} in block"
    assert origin.read_by == f"tanh at tree/model.py:{uses} in forward"
    assert f"called from base/model.py:{call} in block" in origin.change_detail, loc.line
    assert "block gives out the dot_general" in origin.change_detail, loc.line


def test_the_kind_travels_in_the_origins_json(tmp_path: Path) -> None:
    old = model_module(tmp_path / "base", MODEL)
    new = model_module(tmp_path / "tree", MODEL.replace("jnp.tanh(h", "jnp.sin(h"))
    loc = parity.localise(new.forward, old.forward, *_inputs(), root=tmp_path)
    back = parity.Localisation.from_dict(loc.to_dict())
    assert back.origin is not None and loc.origin is not None
    assert (back.origin.change, back.origin.change_detail) == (
        loc.origin.change,
        loc.origin.change_detail,
    )


def test_an_argument_changed_at_a_call_site_reads_in_the_call_chain(tmp_path: Path) -> None:
    """`scaled(h, 0.5)` -> `scaled(h, 0.25)`: the changed constant is the multiplication's in
    `scaled`, and the frame that called it is the edited line of `forward`."""
    old = model_module(tmp_path / "base", MODEL)
    new = model_module(tmp_path / "tree", MODEL.replace("scaled(h, 0.5)", "scaled(h, 0.25)"))
    loc = parity.localise(new.forward, old.forward, *_inputs(), root=tmp_path)
    origin = loc.origin
    assert origin is not None and origin.change == "constant", loc.line
    assert "0.25" in origin.change_detail and "0.5" in origin.change_detail
    call = next(n for n, t in enumerate(MODEL.splitlines(), 1) if "scaled(h, 0.5)" in t)
    own = next(n for n, t in enumerate(MODEL.splitlines(), 1) if "return h * by" in t)
    assert origin.chain[:2] == (
        f"tree/model.py:{own} in scaled",
        f"tree/model.py:{call} in forward",
    )
    assert f"called from tree/model.py:{call} in forward" in loc.line
