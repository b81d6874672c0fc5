"""Arrays read in pieces: the chunk plan and the sources `parity.judge._compare` reads from.

A comparison of two arrays far larger than memory (logits `[8, 4096, 128256]` in bf16 are
8 GiB) reads both in **chunks**: consecutive ranges of the C-order flattened array, each a
rectangular block of the array, so that HDF5 can read it as one hyperslab of a contiguous
dataset and an in-memory array can hand it out as a view. `plan` cuts a shape into such
blocks: whole rows of the last axis wherever a row fits the chunk size (so a rule that
reads along the last axis never sees a row cut in two), otherwise pieces of one row.

Every figure of a comparison (counts, maxima, the first or worst element) is a reduction
that combines across chunks exactly, so a chunked comparison gives the same finding as a
whole one (`tests/parity/judge/test_compare.py` checks it on arrays straddling chunk
boundaries).

A **source** is anything with `shape`, `dtype`, `read(block) -> np.ndarray` (the block's
elements, C order, flattened) and `finish()` (called after the last block of a full pass;
a file source verifies its checksum there). `ArraySource` wraps an in-memory array;
`parity.store.GoldenFile.source` gives one over an array of a golden file or a numeric
dataset of a plain HDF5 file (one hyperslab a block).

This module imports numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

__all__ = [
    "BYTES_PER_ELEMENT",
    "DEFAULT_BUDGET",
    "ArraySource",
    "Block",
    "Source",
    "elements_per_chunk",
    "is_source",
    "plan",
]

#: The default memory budget of one array comparison, in bytes: both chunks and every
#: temporary the comparison makes of them (see `elements_per_chunk`).
DEFAULT_BUDGET = 512 * 2**20

#: What one element of a chunk pair costs a comparison besides the two chunks themselves,
#: at most: float64 copies of both values, the difference, |expected|, the ulp distance, the
#: rule's allowance and score, indices and masks. Measured with tracemalloc's peak on 2M
#: elements that all differ: 99 bytes an element for bfloat16, 103 for float32, 111 for
#: float64, under every registry class; rounded up.
BYTES_PER_ELEMENT = 128


def elements_per_chunk(itemsize: int, budget: int = DEFAULT_BUDGET) -> int:
    """How many elements of a pair of arrays of `itemsize` bytes fit `budget` bytes.

    **Arguments:**

    - `itemsize`: bytes per element of one array.
    - `budget`: bytes the comparison may hold at once (`DEFAULT_BUDGET`).

    **Returns:** an int >= 1.
    """
    if budget < 1:
        raise ValueError(f"the memory budget must be a positive number of bytes, got {budget}")
    return max(1, budget // (2 * itemsize + BYTES_PER_ELEMENT))


@dataclass(frozen=True)
class Block:
    """One chunk: a rectangular block that is also a consecutive C-order range.

    **Fields:**

    - `start`: flat index of its first element.
    - `size`: its number of elements.
    - `index`: the block as a tuple of slices, one per axis (`()` for a 0-d array).
    """

    start: int
    size: int
    index: tuple[slice, ...]

    @property
    def offsets(self) -> tuple[int, ...]:
        """The block's first element, per axis (HDF5's hyperslab start)."""
        return tuple(s.start for s in self.index)

    @property
    def counts(self) -> tuple[int, ...]:
        """The block's extent per axis (HDF5's hyperslab count)."""
        return tuple(s.stop - s.start for s in self.index)


def plan(shape: tuple[int, ...], max_elements: int) -> Iterator[Block]:
    """Cut `shape` into consecutive blocks of at most `max_elements` elements.

    The blocks cover the array once, in C order. Each is full along every axis after some
    axis `k`, a range along `k` and a single index along the axes before it; `k` is the
    outermost axis whose trailing rows fit `max_elements`. An array that fits is one block.

    **Arguments:**

    - `shape`: the array's shape.
    - `max_elements`: the largest block, >= 1.

    **Returns:** an iterator of `Block`. An empty array gives no block.
    """
    if max_elements < 1:
        raise ValueError(f"max_elements must be >= 1, got {max_elements}")
    size = math.prod(shape)
    if size == 0:
        return
    if size <= max_elements:
        yield Block(0, size, tuple(slice(0, n) for n in shape))
        return
    # k: the outermost axis one index of which (all of the axes after it) fits.
    k = 0
    while math.prod(shape[k + 1 :]) > max_elements:
        k += 1
    k_row = math.prod(shape[k + 1 :])
    step = max(1, max_elements // k_row)
    outer = shape[:k]
    start = 0
    for prefix in np.ndindex(*outer):
        head = tuple(slice(int(i), int(i) + 1) for i in prefix)
        tail = tuple(slice(0, n) for n in shape[k + 1 :])
        for j in range(0, shape[k], step):
            stop = min(shape[k], j + step)
            n = (stop - j) * k_row
            yield Block(start, n, (*head, slice(j, stop), *tail))
            start += n


class Source(Protocol):
    """An array that can be read block by block (see the module docstring)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype[Any]: ...

    def read(self, block: Block) -> np.ndarray:
        """The block's elements, flattened, in C order."""
        ...

    def finish(self) -> None:
        """Called after a full pass over the blocks of one plan, in order."""
        ...


def is_source(x: Any) -> bool:
    """Whether `x` is a `Source` (read block by block) rather than an array."""
    return all(hasattr(x, name) for name in ("read", "finish", "shape", "dtype"))


def read_whole(value: Any) -> np.ndarray:
    """`value` as a numpy array: a `Source` read in one block (its checksum verified by
    `finish`), any other value as `np.asarray` gives it."""
    if is_source(value):
        shape = tuple(value.shape)
        block = Block(0, math.prod(shape), tuple(slice(0, n) for n in shape))
        array = value.read(block).reshape(shape) if math.prod(shape) else np.empty(shape)
        value.finish()
        return np.asarray(array, dtype=value.dtype)
    return np.asarray(value)


class ArraySource:
    """A `Source` over an in-memory array; blocks are views where the array allows."""

    def __init__(self, array: np.ndarray):
        self.array = np.ascontiguousarray(array) if array.ndim else array

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self.array.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.array.dtype

    def read(self, block: Block) -> np.ndarray:
        return self.array[block.index].reshape(-1)

    def finish(self) -> None:
        pass
