"""Where XLA's `gather` and `scatter` take and put each element, in numpy: the placement
their rounding rules (`parity.origin._rounding_rules`: `gathered`, `scatter_sum`) move a
value's parts by, following XLA's operation semantics (an index vector, the last axis of
the indices, placed on the operand's dimensions; a batching dimension's start its batch
coordinate; a window's start clamped, or its update dropped, where it lies out of bounds).

This module imports numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["gather_sources", "scatter_targets"]


def gather_sources(
    p: Mapping[str, Any], indices: np.ndarray, shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Where XLA's gather reads each result element (its semantics: a batch index per
    result element picks an index vector, the last axis of `indices`, placed on the
    operand's dimensions by `start_index_map`, a batching dimension's start its batch
    coordinate; the start clamped so the window fits; plus the element's place in its
    window): whether a `fill` mode keeps it (every start in bounds), its flat operand
    index, and the result's shape."""
    dn = p["dimension_numbers"]
    offset_dims, collapsed = tuple(dn.offset_dims), tuple(dn.collapsed_slice_dims)
    start_map = tuple(dn.start_index_map)
    batching = tuple(getattr(dn, "operand_batching_dims", ()))
    index_batching = tuple(getattr(dn, "start_indices_batching_dims", ()))
    sizes = np.asarray(p["slice_sizes"], dtype=np.int64)
    rank = len(shape)
    window = [d for d in range(rank) if d not in collapsed and d not in batching]
    batch_shape = indices.shape[:-1]
    out_rank = len(batch_shape) + len(offset_dims)
    out_shape, b, w = [], iter(batch_shape), iter(window)
    for d in range(out_rank):
        out_shape.append(int(sizes[next(w)]) if d in offset_dims else next(b))
    each = np.indices(out_shape).reshape(out_rank, -1)
    batch_dims = [d for d in range(out_rank) if d not in offset_dims]
    coords = each[batch_dims]  # the batch index of each result element
    rows = (
        np.ravel_multi_index(tuple(coords), batch_shape)
        if batch_shape
        else np.zeros(each.shape[1], dtype=np.int64)
    )
    vectors = indices.reshape(-1, indices.shape[-1])[rows]
    start = np.zeros((rank, each.shape[1]), dtype=np.int64)
    for k, d in enumerate(start_map):
        start[d] = vectors[:, k]
    for d, i in zip(batching, index_batching, strict=True):
        start[d] = coords[i]
    top = (np.asarray(shape) - sizes)[:, None]
    valid = np.all(
        (start[list(start_map)] >= 0) & (start[list(start_map)] <= top[list(start_map)]), axis=0
    )
    if "fill" not in str(p.get("mode", "")).lower():
        valid = np.ones_like(valid)
    start = np.clip(start, 0, top)
    for j, d in enumerate(window):
        start[d] += each[offset_dims[j]]
    flat = np.asarray(np.ravel_multi_index(tuple(start), shape))
    return valid, flat, tuple(out_shape)


def scatter_targets(
    p: Mapping[str, Any], indices: np.ndarray, shape: tuple[int, ...], updates: tuple[int, ...]
) -> tuple[np.ndarray, tuple[np.ndarray, ...]] | None:
    """Where XLA's scatter puts each update element (its semantics: a scatter index per
    update element, from `indices` with the index vector last, placed on the operand's
    dimensions by `scatter_dims_to_operand_dims`, plus the element's place in its window):
    which update elements land (an update whose window starts out of bounds is dropped;
    with `clip` its start is clamped) and their operand indices. None for batching
    dimensions."""
    dn = p["dimension_numbers"]
    window_dims = tuple(dn.update_window_dims)
    inserted = tuple(dn.inserted_window_dims)
    to_operand = tuple(dn.scatter_dims_to_operand_dims)
    if tuple(getattr(dn, "operand_batching_dims", ())) or tuple(
        getattr(dn, "scatter_indices_batching_dims", ())
    ):
        return None
    rank = len(shape)
    each = np.indices(updates).reshape(len(updates), -1)
    scatter_dims = [d for d in range(len(updates)) if d not in window_dims]
    n = each.shape[1]
    if scatter_dims:
        vectors = indices[tuple(each[scatter_dims])].reshape(n, -1)
    else:  # one index vector for every update element
        vectors = np.broadcast_to(indices.reshape(1, -1), (n, indices.size))
    start = np.zeros((rank, n), dtype=np.int64)
    for k, d in enumerate(to_operand):
        start[d] = vectors[:, k]
    size = np.ones(rank, dtype=np.int64)
    offset = np.zeros_like(start)
    for j, d in enumerate(d for d in range(rank) if d not in inserted):
        size[d] = updates[window_dims[j]]
        offset[d] = each[window_dims[j]]
    top = (np.asarray(shape) - size)[:, None]
    if "clip" in str(p.get("mode", "")).lower():
        start = np.clip(start, 0, top)
    keep = np.all((start >= 0) & (start <= top), axis=0)
    full = start + offset
    return keep, tuple(full[:, keep])
