"""Proved up to rounding on this repository's own goldens (issues 59 and 71): `parity check`
holds every key of a forward group (logits and taps) to `up_to_rounding`, replaying the
tree's programs on the base's values in the producer run that made its arrays.

- `forward_llama` (float32): rms_norm's mean of squares summed over the even and the odd
  features (a reordered sum: no operation of it is the base's bit for bit) passes, each key
  proved.
- `forward_bf16` (the same model, every weight bfloat16): every site's product split in
  two half contractions summed (a reorder in bfloat16, each half accumulated in float32
  and rounded, as this CPU does: `parity.origin._primitives`) passes, each moved key proved
  in bfloat16, the base's recording read back from its cache with its bfloat16 values; the
  same split with rms_norm's epsilon 1,000 times larger fails, named at `rms_norm`'s
  epsilon with both constants. (An epsilon 10% larger, 1.1e-6 for 1e-6, moves none of the
  group's 47 arrays by a bit, measured: no check of these outputs can see it.)

`tools/bench_rounding_check.py` does the same for the train groups (minutes each, so not
here).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_origin_goldens import NN, _check, _line_of, shared_folder

from _changed_tree import changed_tree

#: rms_norm's mean of squares as the sum of its even and its odd features' squares.
HALVES = (
    NN,
    "jnp.mean(x32 * x32, axis=-1, keepdims=True)",
    "(jnp.sum(x32[..., ::2] * x32[..., ::2], axis=-1, keepdims=True) + "
    "jnp.sum(x32[..., 1::2] * x32[..., 1::2], axis=-1, keepdims=True)) / x32.shape[-1]",
)
GLU = "src/decomp/targets/glu_transformer.py"
#: Every site's `x @ W.T` as two half contractions summed.
SPLIT = (
    GLU,
    "    return x @ w.T\n",
    "    h = x.shape[-1] // 2\n    return x[..., :h] @ w[:, :h].T + x[..., h:] @ w[:, h:].T\n",
)
EPSILON = (NN, "keepdims=True) + eps)", "keepdims=True) + 1000 * eps)")
REORDERS = {"forward_llama": HALVES, "forward_bf16": SPLIT}
HELD = ("--override", "*=up_to_rounding")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache of baselines, whichever worker runs each test: the base is re-produced
    with every value once."""
    return shared_folder(tmp_path_factory, "forward-rounding")


@pytest.mark.slow
@pytest.mark.parametrize("group", list(REORDERS))
def test_a_reorder_is_proved_up_to_rounding_on_every_key(cache: Path, group: str) -> None:
    with changed_tree(*REORDERS[group]) as tree:
        proc, doc = _check(tree, group, cache, *HELD, report=f"{group}.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    findings = doc["findings"]
    assert findings and all(f["class"] == "up_to_rounding" for f in findings), findings
    assert all(f["verdict"] == "pass" for f in findings), [f["reason"] for f in findings]
    # The premise: the reorder moved bits, and those keys passed by the replay
    rounded = [f for f in findings if f["basis"] == "rounding"]
    assert rounded, "no key's bits moved: nothing was proved"
    assert all(f["bitwise_equal"] or f["basis"] == "rounding" for f in findings), findings
    assert all("proved up to rounding:" in f["note"] for f in rounded), rounded[0]["note"]
    if group == "forward_bf16":  # and says in which precision
        assert all("in bfloat16 (u = 2^-8" in f["note"] for f in rounded), rounded[0]["note"]


@pytest.mark.slow
def test_an_epsilon_beside_the_bfloat16_reorder_fails_at_rms_norm(cache: Path) -> None:
    with changed_tree(*EPSILON, more=[SPLIT]) as tree:
        proc, doc = _check(tree, "forward_bf16", cache, *HELD, report="epsilon.json")
        line = _line_of(tree, NN, "1000 * eps")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    origin = doc["checks"][0]["origin"]
    assert origin is not None, doc["checks"][0]["origin_line"]
    assert (origin["file"], origin["function"], origin["line"]) == (NN, "rms_norm", line)
    assert origin["change"] == "constant", origin
    failed = [f for f in doc["findings"] if f["verdict"] == "fail"]
    assert failed and all("not proved up to rounding:" in f["reason"] for f in failed), failed
