"""Helpers shared by the GLU tests, as session fixtures.

Nothing here imports jax at module level: the parity plugin sets the simulated device count
before jax starts. Models are drawn with numpy (no compile) because on a small CPU each
eagerly run random op compiles on its own, which costs more than the tests themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

_SITE_PATHS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
_SITE_PATHS += ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def _tap_keys(n_layer: int) -> tuple[str, ...]:
    resid = tuple(f"resid.{i}" for i in range(n_layer))
    return resid + tuple(f"layers.{i}.{path}" for i in range(n_layer) for path in _SITE_PATHS)


def _random_glu(cfg: Any, seed: int) -> Any:
    import jax

    from decomp.targets import GLUTransformer

    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda: GLUTransformer.init(cfg, key=jax.random.key(0)))

    def draw(path: Any, leaf: jax.ShapeDtypeStruct) -> np.ndarray:
        name = jax.tree_util.keystr(path)
        x = rng.standard_normal(leaf.shape)
        if name == ".embed":
            return x.astype(np.float32)
        if name == ".lm_head" or len(leaf.shape) == 3:  # [..., d_out, d_in]
            return (x / np.sqrt(leaf.shape[-1])).astype(np.float32)
        return (1 + 0.1 * x).astype(np.float32)  # norm scales

    return jax.tree_util.tree_map_with_path(draw, shapes)


@pytest.fixture(scope="session")
def tap_keys() -> Callable[[int], tuple[str, ...]]:
    """`tap_keys(n_layer)`: every tap key, `resid.{i}` then the sites in canonical order,
    written out from docs/design.md (not from `decomp.taps`)."""
    return _tap_keys


@pytest.fixture(scope="session")
def random_glu() -> Callable[[Any, int], Any]:
    """`random_glu(config, seed)`: a `GLUTransformer` with numpy float32 weights at
    `GLUTransformer.init`'s scales (projections `N(0, 1/d_in)`, embeddings `N(0, 1)`, head
    `N(0, 1/d_model)`, norm scales `1 + N(0, 0.1^2)`), drawn without compiling anything."""
    return _random_glu
