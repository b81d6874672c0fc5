"""Persistent sources: the two-stage init against the legacy one-jit init, bit for bit."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from decomp import legacy
from decomp.sources import init_sources
from parity import assert_equivalent

# Two C groups: C=4 (three sites, on both sides of the other) and C=2 (one site; a one-site
# stack is the case where jax does take the slicing jit's donation).
SITE_CS = {"l0.q": 4, "l0.k": 2, "l0.v": 4, "l1.q": 4}
T = 5


def _replicated() -> NamedSharding:
    mesh = Mesh(np.array(jax.devices()), ("dp",))
    return NamedSharding(mesh, PartitionSpec())


def _per_device(x: jax.Array) -> dict[str, np.ndarray]:
    return {f"device{s.device.id}": np.asarray(s.data) for s in x.addressable_shards}


def _assert_same_on_every_shard(new: jax.Array, old: jax.Array, site: str) -> None:
    # Bitwise on every addressable shard, bf16 included; dtypes and shapes strict.
    assert_equivalent({site: _per_device(new)}, {site: _per_device(old)})


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("sharded", [False, True], ids=["default", "replicated_dp"])
def test_two_stage_init_is_bit_identical_to_legacy(dtype, sharded):
    sharding = _replicated() if sharded else None
    key = jax.random.key(7)
    new = init_sources(SITE_CS, T, key=key, dtype=dtype, sharding=sharding)
    old = legacy.init_sources(SITE_CS, T, key=key, dtype=dtype, sharding=sharding)
    assert list(new) == list(SITE_CS) == list(old)
    for site, c in SITE_CS.items():
        assert new[site].shape == (1, T, c + 1)
        assert new[site].dtype == jnp.dtype(dtype)
        if sharding is not None:
            assert new[site].sharding.is_equivalent_to(sharding, 3), new[site].sharding
            assert len(new[site].addressable_shards) == jax.device_count()
        _assert_same_on_every_shard(new[site], old[site], site)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
def test_values_in_unit_interval_and_keyed_per_site_from_one_split(dtype):
    key = jax.random.key(3)
    out = init_sources(SITE_CS, T, key=key, dtype=dtype)
    keys = jax.random.split(key, len(SITE_CS))
    for i, (site, c) in enumerate(SITE_CS.items()):
        x = np.asarray(out[site], np.float32)
        assert x.min() >= 0.0 and x.max() < 1.0, (site, x.min(), x.max())
        # The contract, by an independent path: site i draws from key i of one split.
        want = jax.random.uniform(keys[i], (1, T, c + 1), dtype)
        assert_equivalent({site: out[site]}, {site: want})


def test_raw_uint32_keys_work_and_match_legacy():
    key = jax.random.PRNGKey(11)
    new = init_sources(SITE_CS, T, key=key)
    old = legacy.init_sources(SITE_CS, T, key=key)
    assert_equivalent(new, old)


def test_second_call_reuses_the_compiled_jits(caplog):
    key = jax.random.key(0)
    init_sources(SITE_CS, T, key=key)
    caplog.clear()
    with jax.log_compiles(True), caplog.at_level(logging.WARNING):
        init_sources(SITE_CS, T, key=key)
    compiles = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
    assert not compiles, compiles


@pytest.mark.parametrize(
    ("site_cs", "seq_len", "dtype", "match"),
    [
        ({}, T, jnp.float32, "at least one site"),
        ({"a": 0}, T, jnp.float32, "positive int"),
        ({"a": 2}, 0, jnp.float32, "seq_len"),
        ({"a": 2}, T, jnp.int32, "floating dtype"),
    ],
)
def test_bad_arguments_raise_clear_errors(site_cs, seq_len, dtype, match):
    for init in (init_sources, legacy.init_sources):
        with pytest.raises(ValueError, match=match):
            init(site_cs, seq_len, key=jax.random.key(0), dtype=dtype)
