"""Live differentials: the refactored code against the implementations it replaced, on the
same inputs, under the same tolerance classes the goldens use. Recorded in the report."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from producers import (
    SEQ,
    _init_glu,
    _leaves,
    _spd_setup,
    dp_mesh,
    eval_group,
    glu_config,
    tokens,
    train_group,
    wanted_sets,
)

from decomp import legacy
from decomp.ci_function import init_ci_function
from decomp.config import CIConfig
from decomp.legacy import train as legacy_train
from decomp.sources import init_sources
from decomp.train import init_train_state


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_scanned_forward_matches_the_legacy_unrolled_forward(family, parity_check):
    cfg = glu_config(family)
    model = _init_glu(cfg, 0)
    x = tokens(cfg.vocab_size)
    wanted = tuple(wanted_sets(cfg.n_layer)["full_depth"])
    logits, taps = jax.jit(lambda m, x: m.clean_output_and_activations(x, wanted))(model, x)
    old_logits, old_taps = jax.jit(lambda m, x: legacy.clean_output_and_activations(m, x, wanted))(
        model, x
    )
    actual = {f"taps.{k}": v for k, v in taps.items()} | {"logits": logits}
    reference = {f"taps.{k}": v for k, v in old_taps.items()} | {"logits": old_logits}
    order = [f"taps.{k}" for k in wanted] + ["logits"]
    parity_check(actual, reference, name=f"live.scan_vs_unrolled.{family}",
                 class_map="fp32_reassoc", order=order)  # fmt: skip


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_fused_accessor_equals_the_separate_methods(family, parity_check):
    cfg = glu_config(family)
    model = _init_glu(cfg, 0)
    x = tokens(cfg.vocab_size)
    for set_name, wanted in wanted_sets(cfg.n_layer).items():
        w = tuple(wanted)
        logits, taps = jax.jit(lambda m, x, w=w: m.clean_output_and_activations(x, w))(model, x)
        sep_taps = jax.jit(lambda m, x, w=w: m.read_activations(x, w))(model, x)
        sep_logits = jax.jit(lambda m, x: m.clean_output(x))(model, x)
        parity_check(
            {f"taps.{k}": v for k, v in taps.items()} | {"logits": logits},
            {f"taps.{k}": v for k, v in sep_taps.items()} | {"logits": sep_logits},
            name=f"live.fused_vs_separate.{family}.{set_name}",
            class_map="bitwise",
        )


def _ci_structure():
    """The 4-layer forward goldens' GLU with a CI function of two blocks (the trajectories'
    has one, `spd_configs`): the vmapped init must stack the block axis as the loop does."""
    model = _init_glu(glu_config("llama"), 0)
    shapes = model.site_shapes()
    names = tuple(model.site_names)
    dims = {n: (shapes[n][0], 4) for n in names}
    return CIConfig(d_hidden=16, n_blocks=2, n_head=2, d_mlp=32, sites_per_chunk=7), names, dims


# `one_layout`: both inits run on one device whatever the layout (no mesh), so another layout
# runs the same programs again.
@pytest.mark.one_layout
def test_vmapped_ci_init_is_bit_identical_to_the_legacy_loop(parity_check):
    cfg, names, dims = _ci_structure()
    key = jax.random.key(5)
    new = jax.jit(lambda k: init_ci_function(cfg, names, dims, key=k))(key)
    old = jax.jit(lambda k: legacy.init_ci_function(cfg, names, dims, key=k))(key)
    parity_check(_leaves("ci", new), _leaves("ci", old), name="live.ci_init", class_map="bitwise")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_two_stage_sources_init_is_bit_identical_to_the_legacy_per_site_init(dtype, parity_check):
    _, names, _ = _ci_structure()
    # Two C groups, so that the two-stage form stacks more than one group.
    cs = {n: 4 if i % 2 else 6 for i, n in enumerate(names)}
    sharding = NamedSharding(dp_mesh(), PartitionSpec())
    key = jax.random.key(6)
    new = init_sources(cs, 12, key=key, dtype=jnp.dtype(dtype), sharding=sharding)
    old = legacy.init_sources(cs, 12, key=key, dtype=jnp.dtype(dtype), sharding=sharding)
    # Every addressable shard, not just the assembled array.
    actual = {f"sources.{s}.shard{i}": np.asarray(sh.data)
              for s in names for i, sh in enumerate(new[s].addressable_shards)}  # fmt: skip
    reference = {f"sources.{s}.shard{i}": np.asarray(sh.data)
                 for s in names for i, sh in enumerate(old[s].addressable_shards)}  # fmt: skip
    parity_check(actual, reference, name=f"live.sources_init.{dtype}", class_map="bitwise")


# --- the train and eval steps, stacked per site kind, against the per-site steps ------------
#
# `one_layout`: each compiles a per-site step, as long as a stacked one at 2 layers. tox -e
# equivalence compares the two where the goldens were pinned, and judges the stacked steps
# against the goldens at 4 devices and at 2x2.


@pytest.mark.parametrize(
    "remat",
    # On the xdist worker of the golden checks of the same trajectories (`test_goldens.py`).
    [pytest.param(r, marks=[pytest.mark.xdist_group(f"trajectory.train_remat_{r}"),
                            pytest.mark.slow, pytest.mark.one_layout])
     for r in ("nothing", "dots")],
)  # fmt: skip
def test_stacked_train_step_matches_the_legacy_per_site_step(remat, parity_check):
    """Three steps of the train step stacked per site kind against the per-site step it
    replaced (`decomp.legacy.train`), from the same init, on the pinned trajectory's inputs:
    the initial state bitwise (every random stream keeps its per-site derivation), then every
    component, CI leaf, source and metric under the class the trajectories' components are
    pinned with."""
    model, spd = _spd_setup(remat)
    new = init_train_state(model, spd, key=jax.random.key(1), seq_len=SEQ)
    old = legacy_train.init_train_state(model, spd, key=jax.random.key(1), seq_len=SEQ)

    def initial(state):
        out = {f"init.components.{s}.{f}": getattr(c, f)
               for s, c in state.site_components().items() for f in ("V", "U")}  # fmt: skip
        out |= {f"init.sources.{s}": v for s, v in state.site_sources().items()}
        return out | _leaves("init.ci", state.ci)

    parity_check(initial(new), initial(old), name=f"live.train_init.{remat}", class_map="bitwise")
    parity_check(
        train_group(remat),
        train_group(remat, legacy=True),
        name=f"live.train_stacked_vs_per_site.{remat}",
        class_map="trajectory",
    )


# On the xdist worker of the eval group's golden check (`test_goldens.py`), which runs the
# same stacked eval step: one compile of it for the two.
@pytest.mark.slow
@pytest.mark.one_layout
@pytest.mark.xdist_group("eval")
def test_stacked_eval_step_matches_the_legacy_per_site_step(parity_check):
    parity_check(
        eval_group(),
        eval_group(legacy=True),
        name="live.eval_stacked_vs_per_site",
        class_map="eval_metric",
    )
