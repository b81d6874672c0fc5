"""A golden file's array as a `parity.judge._chunks.Source`, read block by block so that a
comparison holds one chunk at a time.

The sources know nothing of HDF5: each reads through a `BlockReader` that the reader
(`parity.store._reader.GoldenFile.source`) gives it, which owns the dataset handle of one
pass. What a source adds is the logical dtype and, for a golden array, the checksum over a
full pass.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from parity.judge import _mldtypes as mldtypes
from parity.judge._chunks import Block
from parity.judge._floats import count
from parity.store._dtypes import storage_type
from parity.store._errors import GoldenCorruptError
from parity.store._format import RESTORE_HINT

if TYPE_CHECKING:
    from parity.store._header import ArrayInfo

__all__ = ["BlockReader", "GoldenSource", "PlainSource"]


class BlockReader(Protocol):
    """Reads blocks of one stored array, for one pass at a time."""

    def read_into(self, block: Block, out: np.ndarray) -> None:
        """Read `block` into `out` (shaped as `block.counts`, of the dtype to read into: the
        stored dtype of a golden array, the dataset's own for a plain file), opening what it
        reads from at the first block of a pass."""
        ...

    def release(self) -> None:
        """The pass has ended: let go of what the first block opened."""
        ...


class PlainSource:
    """A numeric dataset of a plain HDF5 file read block by block, in the dataset's own
    dtype (as `GoldenFile[key]` loads it: no checksum, no logical dtype). The dataset is
    opened at the first read and closed when a pass ends, so that many sources (one per
    key of a group) hold no HDF5 handles until they are read."""

    def __init__(self, reader: BlockReader, info: ArrayInfo, path: Path):
        self._reader, self._info, self._path = reader, info, path
        self._size = math.prod(info.shape)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._info.shape

    @property
    def dtype(self) -> np.dtype:
        return self._info.dtype

    def read(self, block: Block) -> np.ndarray:
        out = np.empty(block.counts, self._info.dtype)
        self._reader.read_into(block, out)
        return out.reshape(-1)

    def finish(self) -> None:
        self._reader.release()


class GoldenSource(PlainSource):
    """One golden array read block by block (as `PlainSource`), in its logical dtype, its
    sha256 computed over a full pass and checked by `finish`."""

    def __init__(self, reader: BlockReader, info: ArrayInfo, path: Path):
        super().__init__(reader, info, path)
        self._stored = storage_type(info.dtype)[0]
        self._hash: Any = None
        self._next = 0  # flat index the next in-order block must start at; -1: out of order

    def read(self, block: Block) -> np.ndarray:
        if block.start == 0:
            self._hash, self._next = hashlib.sha256(), 0
        stored = np.empty(block.counts, self._stored)
        self._reader.read_into(block, stored)
        if self._next == block.start:
            self._hash.update(stored.reshape(-1).view(np.uint8).data)
            self._next += block.size
        else:
            self._next = -1
        flat = stored.reshape(-1)
        return flat.view(self._info.dtype) if mldtypes.is_ml_dtype(self._info.dtype) else flat

    def finish(self) -> None:
        """Check the pass that just ended against the pinned sha256."""
        if self._next != self._size and self._size:
            raise RuntimeError(
                f"golden {self._info.key!r}: finish() after a pass that did not read every "
                f"block in order (read up to {self._next} of {count(self._size, 'element')})"
            )
        digest = (self._hash or hashlib.sha256()).hexdigest()
        self._hash, self._next = None, 0
        self._reader.release()
        if digest != self._info.sha256:
            raise GoldenCorruptError(
                f"{self._path}: golden {self._info.key!r} is corrupt: expected sha256 "
                f"{self._info.sha256}, found {digest}. {RESTORE_HINT}"
            )
