"""Proved up to rounding on this repository's own goldens (issue 59): `parity check` holds
every key of `forward_llama` (logits and taps) to `up_to_rounding`, replaying the tree's
programs on the base's values in the producer run that made its arrays.

A copy of the working tree with rms_norm's mean of squares summed over the even and the odd
features (a reordered sum: no operation of it is the base's bit for bit) passes, each key
proved; the same copy with the norm's epsilon 10% larger fails, named at `rms_norm`'s
epsilon with both constants. `tools/bench_rounding_check.py` does the same for the train
groups (minutes each, so not here).
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
EPSILON = (NN, "keepdims=True) + eps)", "keepdims=True) + 1.1 * eps)")
HELD = ("--override", "*=up_to_rounding")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache of baselines, whichever worker runs each test: the base is re-produced
    with every value once."""
    return shared_folder(tmp_path_factory, "forward_llama-rounding")


@pytest.mark.slow
def test_a_reordered_norm_is_proved_up_to_rounding_on_every_key(cache: Path) -> None:
    with changed_tree(*HALVES) as tree:
        proc, doc = _check(tree, "forward_llama", cache, *HELD, report="halves.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    findings = doc["findings"]
    assert findings and all(f["class"] == "up_to_rounding" for f in findings), findings
    assert all(f["verdict"] == "pass" for f in findings), [f["reason"] for f in findings]
    # The premise: the reorder moved bits, and those keys passed by the replay
    rounded = [f for f in findings if f["basis"] == "rounding"]
    assert rounded, "no key's bits moved: nothing was proved"
    assert all(f["bitwise_equal"] or f["basis"] == "rounding" for f in findings), findings
    assert all("proved up to rounding:" in f["note"] for f in rounded), rounded[0]["note"]


@pytest.mark.slow
def test_an_epsilon_beside_the_reorder_fails_at_rms_norm(cache: Path) -> None:
    with changed_tree(*EPSILON, more=[HALVES]) as tree:
        proc, doc = _check(tree, "forward_llama", cache, *HELD, report="epsilon.json")
        line = _line_of(tree, NN, "1.1 * eps")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    origin = doc["checks"][0]["origin"]
    assert origin is not None, doc["checks"][0]["origin_line"]
    assert (origin["file"], origin["function"], origin["line"]) == (NN, "rms_norm", line)
    assert origin["change"] == "constant", origin
    failed = [f for f in doc["findings"] if f["verdict"] == "fail"]
    assert failed and all("not proved up to rounding:" in f["reason"] for f in failed), failed
