"""The suite must catch semantic changes and name where they start, and must stay green
under a benign reassociation."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest
from producers import forward_group

from parity.check import check_group


def _against_goldens(parity_goldens, group, actual):
    # The core the plugin uses, without recording a check: these failures are expected.
    return check_group(actual, group, goldens=parity_goldens).comparison


def _with_config(model, **changes):
    return dataclasses.replace(model, config=dataclasses.replace(model.config, **changes))


@pytest.mark.slow
def test_a_different_rms_eps_fails_first_at_layer_0_post_ln1(parity_goldens):
    actual = forward_group("llama", edit=lambda m: _with_config(m, rms_norm_eps=1e-2))
    result = _against_goldens(parity_goldens, "forward_llama", actual)
    assert not result.passed
    # resid.0 is the embedding (no norm); the first norm applied is LN1 of block 0.
    assert result.first_failure is not None
    assert result.first_failure.key == "taps.llama.full_depth.layers.0.self_attn.q_proj"
    assert result.finding("taps.llama.full_depth.resid.0").bitwise_equal


def test_a_dropped_qk_norm_fails_first_at_layer_0_attention_output(parity_goldens):
    # qwen3 weights run as llama without llama3 RoPE scaling: identical except no QK norm.
    actual = forward_group(
        "qwen3", edit=lambda m: _with_config(m, family="llama", rope_scaling_factor=None)
    )
    result = _against_goldens(parity_goldens, "forward_qwen3", actual)
    assert not result.passed
    assert result.first_failure is not None
    assert result.first_failure.key == "taps.qwen3.full_depth.layers.0.self_attn.o_proj"
    # Everything before attention (the post-LN1 taps of block 0) is untouched: bit for bit
    # against the unperturbed forward on this host (goldens pinned on another processor may
    # differ from it in the last bits).
    key = "taps.qwen3.full_depth.layers.0.self_attn.v_proj"
    assert np.array_equal(actual[key], forward_group("qwen3")[key])


@pytest.fixture
def unrolled_scan(monkeypatch):
    """`lax.scan` with `unroll=2`: the same arithmetic per layer, fused differently."""
    scan = jax.lax.scan
    monkeypatch.setattr(jax.lax, "scan", functools.partial(scan, unroll=2))
    jax.clear_caches()
    yield
    monkeypatch.undo()
    jax.clear_caches()


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_scan_unroll_factor_stays_green(parity_goldens, unrolled_scan, family):
    actual = forward_group(family)
    result = _against_goldens(parity_goldens, f"forward_{family}", actual)
    assert result.passed, [f.reason for f in result.failures]
