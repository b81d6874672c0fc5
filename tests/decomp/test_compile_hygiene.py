"""Compile hygiene: the scanned forward's and the stacked train step's programs do not grow
with depth; the legacy unrolled forward and the per-site train step do.

Measured (lowered StableHLO text of `clean_output`, d_model 32, batch 2 x seq 8):

| forward | 2 layers | 16 layers | ratio |
|---------|----------|-----------|-------|
| scan    | 25058    | 25105     | 1.00  |
| legacy  | 32874    | 199953    | 6.08  |
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

import jax
import numpy as np
import pytest

from decomp import legacy, train
from decomp.config import CIConfig, SPDConfig
from decomp.legacy import train as legacy_train
from decomp.mesh import make_dp_mesh
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


# --- the SPD train step ----------------------------------------------------------------------

#: Measured (lowered StableHLO text of the train step, remat "nothing", the widths above, C 4,
#: one CI chunk per layer, batch 2 x seq 8; jax 0.10.2): stacked 865,828 bytes at 2 layers and
#: 868,108 at 8 (x1.00); the per-site legacy step 1,110,462 and 2,463,937 (x2.22).
TRAIN_DEPTHS = (2, 8)


def train_step_hlo_bytes(impl: ModuleType, n_layer: int) -> int:
    """Size of the lowered train step of `impl` (`decomp.train` or `decomp.legacy.train`)
    at `n_layer`; the state is abstract (`eval_shape`), so nothing is initialised. On a
    mesh of one device, so that the program measured is the same whatever the process's
    device count (`--parity-devices 4`: batch 2 would not split over 4)."""
    cfg = dataclasses.replace(BASE, n_layer=n_layer)
    spd = SPDConfig(
        n_components=4,
        ci=CIConfig(d_hidden=16, n_blocks=1, n_head=2, d_mlp=32, sites_per_chunk=7),
        recon_sites_per_chunk=7,
        remat="nothing",
    )
    # Zeros of the model's shapes: the step places the model on its mesh, so it needs
    # arrays, but lowering reads only their shapes (no init program compiled per depth).
    shapes = jax.eval_shape(lambda: GLUTransformer.init(cfg, key=jax.random.key(0)))
    model = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
    mesh = make_dp_mesh(jax.devices()[:1])
    state = jax.eval_shape(
        lambda k: impl.init_train_state(model, spd, key=k, seq_len=8, mesh=mesh),
        jax.random.key(1),
    )
    step = impl.make_train_step(model, spd, mesh=mesh, donate=False)
    tokens = jax.ShapeDtypeStruct((2, 8), jax.numpy.int32)
    return len(step.lower(state, tokens, jax.random.key(2)).as_text().encode())


@pytest.mark.slow
def test_stacked_train_step_is_flat_in_depth_where_the_per_site_step_grows():
    lo, hi = (train_step_hlo_bytes(train, n) for n in TRAIN_DEPTHS)
    old_lo, old_hi = (train_step_hlo_bytes(legacy_train, n) for n in TRAIN_DEPTHS)
    print(f"train step HLO bytes at {TRAIN_DEPTHS} layers: stacked {lo} -> {hi}, "
          f"per-site {old_lo} -> {old_hi}")  # fmt: skip
    assert hi <= 1.05 * lo, f"the stacked train step grew from {lo} to {hi} bytes"
    assert old_hi >= 1.8 * old_lo, f"the per-site step no longer grows: {old_lo} -> {old_hi}"
