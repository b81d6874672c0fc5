"""A golden file's array as a `parity.judge.chunks.Source`: read block by block through the
reader's `GoldenFile.read_block`, so that a comparison holds one chunk at a time."""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from parity.judge import mldtypes
from parity.judge.chunks import Block
from parity.store.dtypes import storage_type
from parity.store.errors import GoldenCorruptError
from parity.store.format import RESTORE_HINT

if TYPE_CHECKING:
    import h5py.h5d as h5d

    from parity.store.header import ArrayInfo
    from parity.store.reader import GoldenFile

__all__ = ["GoldenSource", "PlainSource"]


class PlainSource:
    """A numeric dataset of a plain HDF5 file read block by block, in the dataset's own
    dtype (as `GoldenFile[key]` loads it: no checksum, no logical dtype). The dataset is
    opened at the first read and closed when a pass ends, so that many sources (one per
    key of a group) hold no HDF5 handles until they are read."""

    #: Whether the dataset is checked against the file's index when it is opened.
    _check = False

    def __init__(self, gf: GoldenFile, info: ArrayInfo):
        self._gf, self._info = gf, info
        self._dsid: h5d.DatasetID | None = None
        self._size = math.prod(info.shape)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._info.shape

    @property
    def dtype(self) -> np.dtype:
        return self._info.dtype

    def _read_into(self, block: Block, out: np.ndarray) -> None:
        self._dsid = self._gf.read_block(self._info, self._dsid, block, out, check=self._check)

    def read(self, block: Block) -> np.ndarray:
        out = np.empty(block.counts, self._info.dtype)
        self._read_into(block, out)
        return out.reshape(-1)

    def finish(self) -> None:
        self._dsid = None


class GoldenSource(PlainSource):
    """One golden array read block by block (as `PlainSource`), in its logical dtype, its
    sha256 computed over a full pass and checked by `finish`."""

    _check = True

    def __init__(self, gf: GoldenFile, info: ArrayInfo):
        super().__init__(gf, info)
        self._stored = storage_type(info.dtype)[0]
        self._hash: Any = None
        self._next = 0  # flat index the next in-order block must start at; -1: out of order

    def read(self, block: Block) -> np.ndarray:
        if block.start == 0:
            self._hash, self._next = hashlib.sha256(), 0
        stored = np.empty(block.counts, self._stored)
        self._read_into(block, stored)
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
                f"block in order (read up to {self._next} of {self._size} elements)"
            )
        digest = (self._hash or hashlib.sha256()).hexdigest()
        self._hash, self._next, self._dsid = None, 0, None
        if digest != self._info.sha256:
            raise GoldenCorruptError(
                f"{self._gf.path}: golden {self._info.key!r} is corrupt: expected sha256 "
                f"{self._info.sha256}, found {digest}. {RESTORE_HINT}"
            )
