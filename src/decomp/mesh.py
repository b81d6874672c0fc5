"""Data parallelism: a one-axis mesh `dp` over the visible devices, the batch sharded on it.

Everything else (model, components, CI function, optimiser states, sources) is replicated;
gradients of replicated parameters under a batch-sharded loss are all-reduced by XLA.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import jax
import numpy as np
from jax import Array
from jax.sharding import Mesh, NamedSharding, PartitionSpec

#: The mesh axis the batch is sharded over.
DP_AXIS = "dp"

T = TypeVar("T")


def make_dp_mesh(devices: Sequence[Any] | None = None) -> Mesh:
    """A mesh with one axis, `dp`, over `devices` (`jax.Device`s; default: every visible
    device)."""
    devs = list(jax.devices() if devices is None else devices)
    if not devs:
        raise ValueError("make_dp_mesh needs at least one device")
    return Mesh(np.asarray(devs), (DP_AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis on `dp`, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(DP_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array."""
    return NamedSharding(mesh, PartitionSpec())


def check_batch(batch: int, mesh: Mesh) -> None:
    """A `ValueError` unless `batch` splits evenly over the `dp` axis."""
    n = mesh.shape[DP_AXIS]
    if batch % n:
        raise ValueError(
            f"batch size {batch} does not split over {n} devices on mesh axis {DP_AXIS!r}; "
            f"use a multiple of {n}"
        )


def shard_batch(x: Any, mesh: Mesh) -> Array:
    """Place `x` (`[batch, ...]`) with its batch axis sharded on `dp`.

    Raises a `ValueError` when `batch` is not a multiple of the number of devices.
    """
    shape = np.shape(x)
    if not shape:
        raise ValueError("shard_batch needs an array with a leading batch axis, got a scalar")
    check_batch(shape[0], mesh)
    return jax.device_put(x, batch_sharding(mesh))


def replicate(tree: T, mesh: Mesh) -> T:
    """Place every array leaf of `tree` on every device of `mesh`."""
    return jax.device_put(tree, replicated(mesh))


def process_rows(batch: int, mesh: Mesh) -> slice:
    """The rows of a `[batch, ...]` array that this process's devices hold under
    `batch_sharding(mesh)`: one contiguous block, the whole batch on one process.

    Raises a `ValueError` when `batch` does not split over `dp`, or when this process's
    devices do not hold one contiguous block of rows (a mesh whose `dp` axis interleaves
    processes).
    """
    check_batch(batch, mesh)
    per_device = batch // mesh.shape[DP_AXIS]
    me = jax.process_index()
    mine = [i for i, d in enumerate(mesh.devices.flat) if d.process_index == me]
    if not mine or mine != list(range(mine[0], mine[0] + len(mine))):
        raise ValueError(
            f"process {me} holds the devices at positions {mine} of mesh axis {DP_AXIS!r}, "
            "not one contiguous block; order the mesh's devices by process (make_dp_mesh "
            "does)"
        )
    return slice(mine[0] * per_device, (mine[-1] + 1) * per_device)


def global_batch(local_rows: Any, mesh: Mesh, batch: int | None = None) -> Array:
    """A batch sharded on `dp` over every process of `mesh`, each process supplying only its
    own rows (`jax.make_array_from_process_local_data`): the multi-process form of
    `shard_batch`, and the same array as `shard_batch` on one process.

    **Arguments:**

    - `local_rows`: `[rows, ...]`, this process's rows (`process_rows(batch, mesh)` of the
      global batch), in order.
    - `mesh`: the data-parallel mesh, over the devices of every process.
    - `batch`: the global batch size (default: `rows` times the number of processes).

    **Returns:** a `[batch, ...]` array, batch axis on `dp`. Raises a `ValueError` when
    `batch` does not split over `dp` or `local_rows` is not this process's share of it.
    """
    shape = np.shape(local_rows)
    if not shape:
        raise ValueError("global_batch needs an array with a leading batch axis, got a scalar")
    total = shape[0] * jax.process_count() if batch is None else batch
    share = process_rows(total, mesh)
    if share.stop - share.start != shape[0]:
        raise ValueError(
            f"process {jax.process_index()} supplies {shape[0]} rows, but its devices hold "
            f"rows {share.start}:{share.stop} of a batch of {total}; pass exactly those rows"
        )
    return jax.make_array_from_process_local_data(
        batch_sharding(mesh), np.asarray(local_rows), (total, *shape[1:])
    )
