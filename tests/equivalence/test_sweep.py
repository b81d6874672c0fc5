"""Sensitivity sweep: every field of `SPDConfig` and `CIConfig`, and every knob of
`GLUConfig` that changes numerics, perturbed slightly, must fail the golden check of the
group(s) that pin it (forward knobs: with the first divergence at the right tap class). A
field that can change training without moving any pinned key is a gap in the producers.

Compiles dominate, so fields are grouped by what they need:

- `TRACED`: float fields the train step only does arithmetic with. They enter one jit as
  arguments (a field whose truthiness the code reads is wrapped so that its truthiness is
  the base value's), so one compiled program runs the base row and every perturbed row over
  the three steps of the `train_branches` trajectory.
- `SHAPED`: fields that change the shape or dtype of pinned arrays (a mismatch fails every
  class); shown without compiling (`jax.eval_shape` of init and step).
- `STRUCTURAL`: Python ints that shape the step's program (loop trip counts, chunking). The
  step-1 loss terms and ascended sources are pinned; `spd_losses` at the initial state (the
  same public function the step calls, forward only) gives them for one compile each.
- `EVAL_FIELDS` (the CI fields that change values only, and `l0_threshold`): the eval group
  pins the CI function's output through the CI-masked metrics and the L0 counts; the eval
  producer runs with the perturbed config, one eval-step compile each.
- `GLU_SHAPE_KNOBS`: a knob that sets a weight's shape re-draws every weight at another
  shape; shown on the init's shapes (`jax.eval_shape`).
- `FORWARD`: GLU knobs, applied to the pinned weights, through the fused full-depth forward.

`UNCOVERED` lists the fields that cannot change numerics, with the reason. The sweep runs at
1 device, where the goldens were pinned; on 4 it is skipped (the 4-device run checks the
goldens themselves under `device_count`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from producers import (
    SEQ,
    TRAIN_STEPS,
    _init_glu,
    _jit_fused,
    _spd_setup,
    branches_config,
    branches_setup,
    eval_group,
    glu_config,
    step_inputs,
    tokens,
    wanted_sets,
)

from decomp.config import CIConfig, SPDConfig
from decomp.targets.glu_transformer import GLUConfig, GLUTransformer
from decomp.train import frozen_forward, init_train_state, make_train_step, spd_losses
from parity.check import check_group
from parity.judge._compare import compare_trees

pytestmark = pytest.mark.skipif(
    jax.device_count() != 1, reason="the sweep runs on 1 device, where the goldens were pinned"
)

#: field -> perturbed value, for the fields entering the step as traced arguments.
TRACED: dict[str, float] = {
    "lr_components": 1.1e-3,
    "lr_ci": 1.1e-3,
    "weight_decay": 0.11,
    "grad_clip": 0.13,
    "pgd_lr": 0.011,
    "p_start": 2.1,
    "p_end": 0.9,
    "p_anneal_steps": 5.0,
    "faithfulness_coeff": 1.1,
    "importance_coeff": 1.1e-2,
    "stochastic_recon_coeff": 1.1,
    "pgd_recon_coeff": 1.1,
}
#: Fields the step reads as Python values (`if coeff:`, `if p_anneal_steps == 0`): wrapped.
WRAPPED = {
    "p_anneal_steps",
    "faithfulness_coeff",
    "importance_coeff",
    "stochastic_recon_coeff",
    "pgd_recon_coeff",
}
#: SPDConfig (or `ci.`) field -> perturbed value, for fields that change pinned shapes/dtypes.
SHAPED: dict[str, Any] = {
    "n_components": 5,
    "sources_dtype": "bfloat16",
    "ci.d_hidden": 20,
    "ci.n_blocks": 2,
    "ci.d_mlp": 36,
    "ci.sites_per_chunk": 14,
}
STRUCTURAL: dict[str, int] = {
    "n_mask_samples": 3,
    "recon_sites_per_chunk": 14,
    "pgd_warmup_steps": 4,
}
#: CI fields that change only values, and `l0_threshold`: checked against the eval group.
EVAL_FIELDS: dict[str, Any] = {
    "ci.n_head": 4,
    "ci.rope_theta": 11000.0,
    # eps is added to a mean square near 1: its effect is eps-sized, so the step is 1e-3.
    "ci.eps": 1e-3,
    "l0_threshold": 0.1,
}
#: GLU knob -> (family, perturbed value, tap class where the first divergence must be).
#: rms_norm_eps 1e-6 -> 2e-6 moves the logits 5.6e-6: caught bitwise where the goldens were
#: pinned, but under the calibrated bound off the pin's processor (4 x 2.9e-6, the logits'
#: spread between processors and ISA caps); 1e-5 moves them 4.0e-5, caught everywhere.
FORWARD: dict[str, tuple[str, Any, str]] = {
    "rms_norm_eps": ("llama", 1e-5, "layers.0.self_attn.q_proj"),
    "rms_norm_eps/qwen3": ("qwen3", 1e-5, "layers.0.self_attn.q_proj"),
    "rope_theta": ("llama", 11000.0, "layers.0.self_attn.o_proj"),
    "rope_theta/qwen3": ("qwen3", 11000.0, "layers.0.self_attn.o_proj"),
    "rope_scaling_factor": ("llama", 9.0, "layers.0.self_attn.o_proj"),
    "rope_low_freq_factor": ("llama", 1.1, "layers.0.self_attn.o_proj"),
    "rope_high_freq_factor": ("llama", 4.5, "layers.0.self_attn.o_proj"),
    "rope_original_max_position": ("llama", 9000, "layers.0.self_attn.o_proj"),
    "family": ("qwen3", "llama", "layers.0.self_attn.o_proj"),
    "tie_word_embeddings": ("llama", True, "logits"),
}
#: GLU knobs that set the weights' shapes: a change re-draws every weight at another shape.
GLU_SHAPE_KNOBS: dict[str, int] = {
    "n_layer": 3,
    "d_model": 48,
    "n_head": 2,
    "n_kv_head": 4,
    "head_dim": 4,
    "d_mlp": 96,
    "vocab_size": 96,
}
#: Fields that cannot change any pinned number, with the reason.
UNCOVERED: dict[str, str] = {
    "remat": "checkpointing changes what is saved for the backward, not the arithmetic; the "
    "three modes are each pinned (train_remat_nothing, train_remat_dots, train_branches) and "
    "agree within `trajectory`, so switching between them must stay green",
}
#: Knobs swept on one family only, with the reason.
FAMILY_ONLY: dict[str, str] = {
    "rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor, "
    "rope_original_max_position": "llama3 RoPE scaling applies to the llama family only; "
    "qwen3 ignores these knobs",
}


def _golden(parity_goldens, group: str, keys) -> dict[str, np.ndarray]:
    gf = parity_goldens.open(group)
    return {k: np.asarray(gf[k]) for k in gf if keys(k)}


def _compare(parity_goldens, group: str, actual: Mapping[str, Any], overrides=()):
    """`actual` (part of `group`'s keys) against the goldens, as `parity check` judges it:
    pinned classes, and off the pin's environment their calibrated bounds (the sweep must
    hold on any host, not only the one that pinned)."""
    result = check_group(dict(actual), group, goldens=parity_goldens, overrides=overrides,
                         keys=list(actual))  # fmt: skip
    assert sorted(f.key for f in result.comparison.findings) == sorted(actual)
    return result.comparison


def _set(config: Any, field: str, value: Any) -> Any:
    """A copy of `config` with `field` (or `ci.field`) set, validated by the dataclass."""
    if field.startswith("ci."):
        return dataclasses.replace(config, ci=dataclasses.replace(config.ci, **{field[3:]: value}))
    return dataclasses.replace(config, **{field: value})


# --- traced fields: one compile for every row -----------------------------------------------


class _Traced:
    """A config value whose arithmetic is traced and whose truthiness and equality are the
    base value's (the step tests `if coeff:` and `p_anneal_steps == 0` in Python)."""

    def __init__(self, traced: jax.Array, base: float) -> None:
        self.traced, self.base = traced, base

    def __bool__(self) -> bool:
        return bool(self.base)

    def __eq__(self, other: object) -> bool:
        return self.base == other

    __hash__ = None  # type: ignore[assignment]

    def __mul__(self, other: Any) -> Any:
        return self.traced * other

    __rmul__ = __mul__

    def __rtruediv__(self, other: Any) -> Any:
        return other / self.traced


#: Fields passed as arguments instead of folded constants reassociate a little (measured on
#: the base row: 5.75e-6 on a PGD source at step 2, `trajectory` allows 5e-6), so the rows
#: are held to `device_count` (1e-4 relative). The ascended sources are left out: Adam
#: normalises the ascent gradient, which turns that noise into 1.2e-4 relative by step 2; the
#: step-1 sources are swept by `test_structural_fields_fail_the_step_1_terms`.
TRACED_CLASS = (("traj.*", "device_count"),)


def _traced_config(base: SPDConfig, values: Mapping[str, jax.Array]) -> SPDConfig:
    config = copy.copy(base)
    for name, value in values.items():
        v = _Traced(value, getattr(base, name)) if name in WRAPPED else value
        object.__setattr__(config, name, v)
    return config


def _trajectory_leaves(model, state, metrics, i: int, *, sources: bool = True) -> dict[str, Any]:
    prefix = f"traj.branches.step{i}"
    out = {}
    components, site_sources = state.site_components(), state.site_sources()
    for site in model.site_names:
        out[f"{prefix}.components.{site}.V"] = components[site].V
        out[f"{prefix}.components.{site}.U"] = components[site].U
        if sources:
            out[f"{prefix}.sources.{site}"] = site_sources[site]
    for name in metrics:
        out[f"{prefix}.metrics.{name}"] = metrics[name]
    return out


@pytest.mark.slow
def test_traced_fields_each_fail_the_branches_trajectory(parity_goldens):
    model, spd = branches_setup()
    state0 = init_train_state(model, spd, key=jax.random.key(1), seq_len=SEQ)

    @jax.jit
    def step(values, state, inputs, key):
        return make_train_step(model, _traced_config(spd, values), donate=False)(state, inputs, key)

    def run(values: Mapping[str, float]) -> dict[str, np.ndarray]:
        vals = {k: jnp.float32(v) for k, v in values.items()}
        state, out = state0, {}
        for i in range(1, TRAIN_STEPS + 1):
            state, metrics = step(vals, state, *step_inputs(model, i))
            out |= _trajectory_leaves(model, state, metrics, i, sources=False)
        return {k: np.asarray(v) for k, v in out.items()}

    base = {k: float(getattr(spd, k)) for k in TRACED}
    control = _compare(parity_goldens, "train_branches", run(base), TRACED_CLASS)
    assert control.passed, [f.reason for f in control.failures][:3]
    missed, first = {}, {}
    for field, value in TRACED.items():
        result = _compare(
            parity_goldens, "train_branches", run(base | {field: value}), TRACED_CLASS
        )
        if result.passed:
            missed[field] = value
        first[field] = result.first_failure.key if result.first_failure else None
    assert not missed, f"perturbing {missed} moved no pinned key of train_branches"
    # A step's loss is computed before its update, and the pinned order says so: each
    # step's metrics come before the parameters it produced. The exponent's start moves
    # step 1's loss (p at step 0); the anneal's length first moves step 2's (p at step 1).
    assert str(first["p_start"]).startswith("traj.branches.step1.metrics."), first
    assert str(first["p_anneal_steps"]).startswith("traj.branches.step2.metrics."), first


# --- fields that change shapes or dtypes ----------------------------------------------------


@pytest.mark.parametrize("field", list(SHAPED))
def test_shaped_fields_change_pinned_shapes_or_dtypes(parity_goldens, field):
    model, spd = branches_setup()
    config = _set(spd, field, SHAPED[field])
    x, key = step_inputs(model, 1)

    def first_step(k, x, step_key):
        state = init_train_state(model, config, key=k, seq_len=SEQ)
        return make_train_step(model, config, donate=False)(state, x, step_key)

    state, metrics = jax.eval_shape(first_step, jax.random.key(1), x, key)
    actual = _trajectory_leaves(model, state, metrics, 1)
    actual |= {
        f"traj.branches.step1.ci.{'.'.join(str(getattr(p, 'name', p)) for p in path)}": leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(state.ci)[0]
    }
    golden = _golden(parity_goldens, "train_branches", lambda k: ".step1." in k)
    changed = [
        k
        for k, g in golden.items()
        if k not in actual or (tuple(actual[k].shape), actual[k].dtype) != (g.shape, g.dtype)
    ]
    assert changed, f"{field}={SHAPED[field]!r} left every pinned shape and dtype alone"


# --- structural ints: the step-1 loss terms and sources --------------------------------------


def _step1_losses(model, config) -> dict[str, np.ndarray]:
    base = branches_config()
    state = init_train_state(model, base, key=jax.random.key(1), seq_len=SEQ)
    x, key = step_inputs(model, 1)

    @jax.jit
    def losses(state, x, key):
        clean, taps = frozen_forward(model, x)
        params = (state.components, state.ci)
        p = config.p_at(state.step)
        return spd_losses(
            model, config, params, state.sources, clean, taps, x, p, state.layout, key=key
        )

    total, (terms, sources) = losses(state, x, key)
    sources = state.layout.to_sites(sources)
    out = {"traj.branches.step1.metrics.total": np.asarray(total)}
    out |= {f"traj.branches.step1.metrics.{k}": np.asarray(v) for k, v in terms.items()}
    out |= {f"traj.branches.step1.sources.{s}": np.asarray(v) for s, v in sources.items()}
    return out


@pytest.mark.slow
@pytest.mark.parametrize("field", [None, *STRUCTURAL])
def test_structural_fields_fail_the_step_1_terms(parity_goldens, field):
    model, spd = branches_setup()
    config = spd if field is None else _set(spd, field, STRUCTURAL[field])
    result = _compare(parity_goldens, "train_branches", _step1_losses(model, config))
    if field is None:  # the control: the loss terms alone reproduce the pinned step 1
        assert result.passed, [f.reason for f in result.failures][:3]
    else:
        assert not result.passed, f"{field}={STRUCTURAL[field]} moved no step-1 term or source"


# --- CI values and the L0 threshold: the eval group --------------------------------------------


@pytest.mark.parametrize("field", list(EVAL_FIELDS))
def test_ci_value_fields_and_l0_threshold_fail_the_eval_group(parity_goldens, field):
    # The unperturbed producer is checked by test_goldens; here only the perturbed one runs.
    config = _set(_spd_setup("nothing")[1], field, EVAL_FIELDS[field])
    result = _compare(parity_goldens, "eval", eval_group(config))
    assert not result.passed, f"{field}={EVAL_FIELDS[field]!r} moved no eval metric"


# --- GLU knobs ---------------------------------------------------------------------------------


def _fused_full_depth(family: str, model) -> dict[str, np.ndarray]:
    wanted = tuple(wanted_sets(model.config.n_layer)["full_depth"])
    logits, taps = _jit_fused(model, tokens(model.config.vocab_size), wanted)
    out = {f"taps.{family}.full_depth.{k}": np.asarray(taps[k]) for k in wanted}
    return out | {f"logits.{family}.fused_full_depth": np.asarray(logits)}


@pytest.mark.parametrize("knob", list(FORWARD))
def test_forward_knobs_diverge_first_at_their_tap_class(parity_goldens, knob):
    family, value, where = FORWARD[knob]
    field = knob.split("/")[0]
    model = _init_glu(glu_config(family), 0)
    changes: dict[str, Any] = {field: value}
    if field == "family":  # qwen3 weights as llama without llama3 scaling: only QK norm goes
        changes["rope_scaling_factor"] = None
    if field == "tie_word_embeddings":
        model = dataclasses.replace(model, lm_head=None)
    control = _fused_full_depth(family, model)
    model = dataclasses.replace(model, config=dataclasses.replace(model.config, **changes))
    actual = _fused_full_depth(family, model)
    result = _compare(parity_goldens, f"forward_{family}", actual)
    assert not result.passed, f"{knob}={value!r} passed the forward_{family} goldens"
    if where == "logits":
        # Only the head changes: every tap stays within its class (a program without
        # `lm_head` may fuse the blocks differently, so taps need not stay bitwise).
        first = result.first_failure
        expected = f"logits.{family}.fused_full_depth"
    else:
        # Where it starts is read against the unperturbed forward on this host: against
        # goldens pinned on another processor, earlier taps may differ in their last bits.
        order = [k for k in parity_goldens.open(f"forward_{family}").ordered_keys() if k in actual]
        first = compare_trees(actual, control, "bitwise", order=order).first_not_bitwise
        expected = f"taps.{family}.full_depth.{where}"
    assert first is not None
    assert first.key == expected, f"{knob}: first divergence at {first.key}, expected {expected}"


@pytest.mark.parametrize("knob", list(GLU_SHAPE_KNOBS))
def test_glu_shape_knobs_move_the_pinned_forward(parity_goldens, knob):
    cfg = dataclasses.replace(glu_config("llama"), **{knob: GLU_SHAPE_KNOBS[knob]})
    base = glu_config("llama")

    def shapes(c: GLUConfig) -> list[tuple[int, ...]]:
        model = jax.eval_shape(lambda k: GLUTransformer.init(c, key=k), jax.random.key(0))
        return [tuple(a.shape) for a in jax.tree.leaves(model)]

    # A knob that sets a weight's shape re-draws every weight from the same keys at other
    # shapes: the pinned forward (weights drawn from key 0) cannot stay.
    assert shapes(cfg) != shapes(base), f"{knob} left every weight shape alone"


def test_every_config_field_is_swept_or_listed():
    swept = set(TRACED) | set(SHAPED) | set(STRUCTURAL) | set(EVAL_FIELDS) | set(UNCOVERED)
    spd_fields = {f.name for f in dataclasses.fields(SPDConfig)} - {"ci"}
    ci_fields = {f"ci.{f.name}" for f in dataclasses.fields(CIConfig)}
    missing = (spd_fields | ci_fields) - swept
    assert not missing, f"fields neither swept nor listed in UNCOVERED: {sorted(missing)}"
    assert not swept - spd_fields - ci_fields, "the sweep names fields the configs lack"
    glu = {f.name for f in dataclasses.fields(GLUConfig)}
    glu_swept = {k.split("/")[0] for k in FORWARD} | set(GLU_SHAPE_KNOBS)
    assert glu == glu_swept, f"GLUConfig knobs not swept: {sorted(glu ^ glu_swept)}"
