"""`parity.localise` on this repository's own refactor and on bugs injected into it.

The scanned GLU forward against `decomp.legacy`'s unrolled one matches at every value under
the matching tolerance `fp32_reassoc` implies (the class the live differential judges them
by, tests/equivalence/test_live.py). Each injected bug is a copy of one function of
`decomp` with one line changed, written to a file of its own and swapped in for the scanned
forward only; with only the logits compared, the origin must lie in that copy, in the
function holding the changed line.
"""

from __future__ import annotations

import inspect
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

from decomp import legacy, nn
from decomp.targets import GLUConfig, glu_transformer as gt
from parity.judge._classes import REGISTRY
from parity.origin import align, locate, matching_tolerance, record

CONFIG = GLUConfig(
    family="llama", n_layer=2, d_model=16, n_head=4, n_kv_head=2, head_dim=4, d_mlp=24,
    vocab_size=32, rope_original_max_position=64,
)  # fmt: skip
CLASS = "fp32_reassoc"


@pytest.fixture(scope="module")
def model(random_glu):
    return random_glu(CONFIG, 0)


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(1).integers(0, CONFIG.vocab_size, (2, 6), dtype=np.int32)


@pytest.fixture(scope="module")
def legacy_logits(model, tokens):
    """The unrolled forward's logits, recorded once for every bug."""
    return record(legacy.clean_output, model, tokens)


def test_the_scanned_forward_matches_the_unrolled_one_at_every_value(model, tokens):
    wanted = ("resid.1", "layers.0.self_attn.o_proj", "layers.1.mlp.down_proj")
    new = record(lambda m, x: m.clean_output_and_activations(x, wanted), model, tokens)
    old = record(lambda m, x: legacy.clean_output_and_activations(m, x, wanted), model, tokens)
    assert set(new.outputs) == set(old.outputs)  # the legacy form runs logits first
    # Every value of the scanned program, each iteration of the scan included, matched one
    # of the unrolled program's, under the tolerance the logits' class implies.
    rho = matching_tolerance(REGISTRY[CLASS], old.output_arrays["0"])
    alignment = align(new, old, rho)
    assert alignment.unmatched() == []
    assert alignment.matched_fraction == 1.0
    assert any(v.primitive == "scan" for v in new.values)  # the scan was unrolled
    assert locate(new, old, class_map=CLASS).origin is None
    # Against a program that is not the same, the alignment does not hold (it is not vacuous).
    other = record(
        lambda m, x: legacy.clean_output_and_activations(m, x, wanted), model, tokens + 1
    )
    assert align(new, other, rho).matched_fraction < 0.5


def _inject(owner, name: str, old: str, new: str, folder: Path):
    """A copy of `owner.name` (a function of a module, or a method) with the text `old`
    replaced by `new`, compiled from a file of its own in `folder` (so the source info points
    at it), with the globals of the module that defines it.

    **Returns:** `(function, file, first line, changed line)`.
    """
    original = getattr(owner, name)
    source = "from __future__ import annotations\n" + textwrap.dedent(inspect.getsource(original))
    assert source.count(old) == 1, (name, old)
    buggy = source.replace(old, new)
    changed = 1 + buggy[: buggy.index(new)].count("\n")
    path = folder / f"bug_{name}.py"
    path.write_text(buggy)
    namespace = dict(vars(inspect.getmodule(original)))
    exec(compile(buggy, str(path), "exec"), namespace)
    return namespace[name], str(path), 2, changed


#: name: (owner, function, old text, new text, whether the origin is on the changed line)
BUGS = {
    "epsilon": (nn, "rms_norm", "keepdims=True) + eps)", "keepdims=True) + 1e4 * eps)", True),
    "rotary_base": (nn, "rope_inv_freq", "(theta**exponents)", "((2 * theta) ** exponents)", True),
    "causal_mask": (nn, "attention", "dtype=bool))", "dtype=bool), k=1)", True),
    "attention_scale": (nn, "attention", "/ math.sqrt(head_dim)", "/ head_dim", True),
    # the repeated keys are data movement: the first value they change is the scores
    "gqa_tiling": (nn, "attention", "k = jnp.repeat(k, group, axis=2)",
                   "k = jnp.tile(k, (1, 1, group, 1))", False),
    "activation": (gt, "_block", "jax.nn.silu(", "jax.nn.gelu(", True),
    # the skipped norm computes nothing new: the first new value is the head's matmul
    "final_norm_skipped": (gt.GLUTransformer, "_logits",
                           "nn.rms_norm(x, self.norm, self.config.rms_norm_eps) @", "x @", True),
}  # fmt: skip


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_an_injected_bug_is_localised_to_the_function_holding_the_changed_line(
    bug, model, tokens, legacy_logits, tmp_path, monkeypatch
):
    owner, name, old, new, on_the_line = BUGS[bug]
    fn, path, first, changed = _inject(owner, name, old, new, tmp_path)
    if owner is nn:  # the scanned forward's `nn` only: the legacy forward keeps the real one
        monkeypatch.setattr(gt, "nn", types.SimpleNamespace(**{**vars(nn), name: fn}))
    else:
        monkeypatch.setattr(owner, name, fn)
    buggy = record(lambda m, x: m.clean_output(x), model, tokens)
    # only the logits are compared, and they fail their class
    assert not np.allclose(buggy.output_arrays["array"], legacy_logits.output_arrays["array"],
                           rtol=0, atol=REGISTRY[CLASS].rule.atol)  # type: ignore[attr-defined]  # fmt: skip
    origin = locate(buggy, legacy_logits, class_map=CLASS).origin
    assert origin is not None
    n_lines = len(inspect.getsourcelines(fn)[0])
    assert (origin.file, origin.function) == (path, name), origin.describe()
    assert first <= origin.line < first + n_lines
    if on_the_line:
        assert origin.line == changed, origin.describe()
    else:
        assert origin.line > changed, origin.describe()
    assert 0 < origin.matched_fraction < 1
    assert origin.max_diff is not None and origin.max_diff > 0
