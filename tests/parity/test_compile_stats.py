"""Compile statistics: loop counts, HLO size in depth, XLA's memory figures."""

from __future__ import annotations

import json
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from parity._compile_stats import (
    CompileStats,
    compile_stats,
    count_instructions,
    count_while_loops,
)

_X = jax.ShapeDtypeStruct((4, 16), jnp.float32)
_W = jax.ShapeDtypeStruct((16, 16), jnp.float32)


def _scanned(steps: int):
    def f(x, w):
        def body(h, _):
            return jnp.tanh(h @ w), None

        return lax.scan(body, x, None, length=steps)[0]

    return f


def _unrolled(steps: int):
    def f(x, w):
        for _ in range(steps):
            x = jnp.tanh(x @ w)
        return x

    return f


def test_a_scan_compiles_to_one_while_loop_and_a_python_loop_to_none():
    scan = compile_stats(_scanned(8), _X, _W, name="scan8")
    unroll = compile_stats(_unrolled(8), _X, _W, name="unroll8")
    assert (scan.while_loops, unroll.while_loops) == (1, 0)
    assert scan.name == "scan8"


def test_hlo_size_is_flat_in_depth_for_scan_and_grows_for_unroll():
    scan = [compile_stats(_scanned(n), _X, _W).hlo_bytes for n in (2, 16)]
    unroll = [compile_stats(_unrolled(n), _X, _W).hlo_bytes for n in (2, 16)]
    assert abs(scan[1] - scan[0]) <= 0.05 * scan[0], scan
    assert unroll[1] > 3 * unroll[0], unroll


def test_memory_figures_are_ints_on_cpu_and_the_record_is_json():
    stats = compile_stats(jax.jit(_scanned(2)), _X, _W)
    for field in ("argument_bytes", "output_bytes", "temp_bytes", "alias_bytes"):
        value = getattr(stats, field)
        assert isinstance(value, int) and value >= 0, (field, value)
    assert stats.argument_bytes == (4 * 16 + 16 * 16) * 4
    assert stats.output_bytes == 4 * 16 * 4
    assert stats.lower_s >= 0 and stats.compile_s >= 0
    assert stats.instructions is not None and stats.instructions > 0
    d = stats.to_dict()
    assert CompileStats(**json.loads(json.dumps(d))) == stats


def test_plain_callables_kwargs_and_default_names_work():
    def scaled(x, *, k):
        return x * k

    stats = compile_stats(scaled, jnp.ones(3), k=2.0)
    assert stats.name == "scaled" and stats.while_loops == 0


@pytest.mark.parametrize("initial", [True, False])
def test_fresh_restores_the_persistent_cache_setting(initial):
    config: Any = jax.config  # the flag is a dynamic attribute, unknown to type checkers
    old = config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", initial)
    try:
        compile_stats(_unrolled(1), _X, _W, fresh=True)
        assert config.jax_enable_compilation_cache is initial
    finally:
        jax.config.update("jax_enable_compilation_cache", old)


_HLO = """\
HloModule jit_f, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]{0}) parameter(0)
  ROOT %t = (s32[], f32[4]{0}) tuple(%a, %b), metadata={op_name="jit(f)/while/body"}
}

ENTRY main.3 {
  x = f32[4]{0} parameter(0)
  w.1 = (s32[], f32[4]{0}) while(%init), condition=%cond, body=%body
  ROOT r = f32[4]{0} get-tuple-element(w.1), index=1
}
"""


def test_counting_rule_on_handwritten_hlo():
    # Instructions with and without "%", ROOT included; headers and the module line not.
    assert count_instructions(_HLO) == 5
    # "while" inside metadata or a computation name is not a loop.
    assert count_while_loops(_HLO) == 1
