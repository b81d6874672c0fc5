"""`decomp.mesh.global_batch` on one process is `shard_batch`: the multi-process form
(each process supplying its own rows) adds nothing when one process holds every row. The
runs over several processes are tests/equivalence/test_across_processes.py's."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from decomp.mesh import global_batch, make_dp_mesh, process_rows, shard_batch


def test_one_process_holds_every_row():
    mesh = make_dp_mesh()
    n = jax.device_count()
    assert process_rows(2 * n, mesh) == slice(0, 2 * n)


def test_global_batch_on_one_process_is_shard_batch():
    mesh = make_dp_mesh()
    x = np.arange(2 * jax.device_count() * 3, dtype=np.int32).reshape(-1, 3)
    a, b = global_batch(x, mesh), shard_batch(x, mesh)
    assert a.sharding == b.sharding
    assert a.shape == b.shape == x.shape
    np.testing.assert_array_equal(np.asarray(a), x)
    for sa, sb in zip(a.addressable_shards, b.addressable_shards, strict=True):
        assert sa.index == sb.index
        np.testing.assert_array_equal(np.asarray(sa.data), np.asarray(sb.data))


def test_global_batch_names_rows_that_are_not_this_process_share():
    mesh = make_dp_mesh()
    with pytest.raises(ValueError, match=r"supplies 2 rows, but its devices hold rows 0:4"):
        global_batch(np.zeros((2, 3), np.float32), mesh, 4)
    with pytest.raises(ValueError, match="scalar"):
        global_batch(np.float32(1), mesh)
