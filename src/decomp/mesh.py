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
