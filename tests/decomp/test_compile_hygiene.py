"""Compile hygiene: the scanned forward's program does not grow with depth; the legacy
unrolled one does.

Measured (lowered StableHLO text of `clean_output`, d_model 32, batch 2 x seq 8):

| forward | 2 layers | 16 layers | ratio |
|---------|----------|-----------|-------|
| scan    | 25058    | 25105     | 1.00  |
| legacy  | 32874    | 199953    | 6.08  |
"""

from __future__ import annotations

import dataclasses

import jax
import pytest

from decomp import legacy
from decomp.targets import GLUConfig, GLUTransformer

BASE = GLUConfig(
    family="llama", n_layer=2, d_model=32, n_head=4, n_kv_head=2, head_dim=8, d_mlp=48,
    vocab_size=64,
)  # fmt: skip
DEPTHS = (2, 16)

FORWARDS = {
    "scan": lambda model, tokens: model.clean_output(tokens),
    "legacy": legacy.clean_output,
}


def hlo_bytes(forward: str, n_layer: int) -> int:
    """Size of the lowered (not compiled) program text of `clean_output` at `n_layer`."""
    cfg = dataclasses.replace(BASE, n_layer=n_layer)
    model = jax.eval_shape(lambda: GLUTransformer.init(cfg, key=jax.random.key(0)))
    tokens = jax.ShapeDtypeStruct((2, 8), jax.numpy.int32)
    return len(jax.jit(FORWARDS[forward]).lower(model, tokens).as_text().encode())


@pytest.fixture(scope="module")
def sizes() -> dict[tuple[str, int], int]:
    out = {(f, n): hlo_bytes(f, n) for f in FORWARDS for n in DEPTHS}
    for f in FORWARDS:
        lo, hi = out[f, DEPTHS[0]], out[f, DEPTHS[-1]]
        print(f"HLO text bytes, {f}: {lo} at {DEPTHS[0]} layers, {hi} at {DEPTHS[-1]}", end="")
        print(f" (x{hi / lo:.2f})")
    return out


def test_scanned_clean_output_hlo_is_flat_in_depth(sizes):
    lo, hi = sizes["scan", DEPTHS[0]], sizes["scan", DEPTHS[-1]]
    assert hi <= 1.05 * lo, f"scan HLO grew from {lo} to {hi} bytes ({DEPTHS} layers)"


def test_legacy_clean_output_hlo_grows_with_depth(sizes):
    """The contrast that makes the flat figure meaningful: unrolled, the same structure
    grows at least 4x from 2 to 16 layers."""
    lo, hi = sizes["legacy", DEPTHS[0]], sizes["legacy", DEPTHS[-1]]
    assert hi >= 4 * lo, f"legacy HLO only grew from {lo} to {hi} bytes ({DEPTHS} layers)"
