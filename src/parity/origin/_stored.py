"""A recording's arrays on disk (issue 76): written one value at a time as a recording
makes them, read back one value at a time as a replay reaches them, so that neither the
process that records the base nor the one that replays on it holds every value the base
computed.

The file is numpy's own `.npz` layout (a zip of `.npy` members, stored, not compressed):
`ArraysWriter` writes it member by member under a temporary name and puts it in place
whole (`commit`), so that a reader never sees half a recording; `np.load` reads it as
any `np.savez` file. `StoredArrays` is the sequence of a recording's value arrays read
from such a file on demand, the most recently read kept up to `KEEP_BYTES`.

This module imports numpy only.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from parity.judge import _mldtypes as mldtypes

__all__ = ["KEEP_BYTES", "Appended", "ArraysWriter", "StoredArrays"]

#: How many bytes of recently read values a `StoredArrays` keeps at most (a value larger
#: than this is kept alone until the next read): an operation's operands are read again
#: by the operations beside it, not by the whole program.
KEEP_BYTES = 256 << 20


class ArraysWriter:
    """An `.npz` file written a member at a time, at `path` once `commit` has written its
    last member (until then under `path` + `.partial`, removed by `abandon`)."""

    def __init__(self, path: str | Path) -> None:
        import zipfile  # not at import: it loads shutil, which a `parity diff` never needs

        self.path = Path(path)
        self._partial = self.path.with_name(self.path.name + ".partial")
        self._zip = zipfile.ZipFile(self._partial, "w", zipfile.ZIP_STORED, allowZip64=True)
        #: Each value's dtype by the golden store's codec, in the order `value` was told.
        self.dtypes: list[str] = []

    def add(self, name: str, array: np.ndarray) -> None:
        """Member `name` (read back as `np.load(path)[name]`)."""
        with self._zip.open(f"{name}.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array(f, np.asanyarray(array), allow_pickle=False)

    def value(self, i: int, numbers: np.ndarray) -> None:
        """Value `i`'s numbers, as `Recording.to_arrays` names them (`array.<i>`, an
        ml_dtypes array as its bits); values come in order, from 0."""
        if i != len(self.dtypes):
            raise ValueError(f"value {i} written after {len(self.dtypes)} values")
        raw, name = mldtypes.to_raw(numbers)
        self.add(f"array.{i}", raw)
        self.dtypes.append(name)

    def commit(self, rest: Mapping[str, np.ndarray]) -> Path:
        """Write `rest` (a recording's summary, `Recording.to_arrays`) and the values'
        dtypes, close the file and put it at `path`."""
        for name, array in rest.items():
            self.add(name, array)
        self.add("meta.array_dtypes", np.array(self.dtypes, dtype=str))
        self._zip.close()
        os.replace(self._partial, self.path)
        return self.path

    def abandon(self) -> None:
        """Close the file and remove what was written."""
        self._zip.close()
        self._partial.unlink(missing_ok=True)


class _Arrays(Sequence[np.ndarray]):
    """A sequence of value arrays each made when asked for (`_get`): a slice is a list of
    them, a negative index counts from the end."""

    def _get(self, i: int) -> np.ndarray:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> np.ndarray: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[np.ndarray]: ...
    def __getitem__(self, i: int | slice) -> np.ndarray | Sequence[np.ndarray]:
        if isinstance(i, slice):
            return [self._get(k) for k in range(*i.indices(len(self)))]
        return self._get(range(len(self))[i])  # an IndexError past the end

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self._get(i) for i in range(len(self)))


class StoredArrays(_Arrays):
    """The value arrays of a recording in an open `.npz` file (`np.load`'s `NpzFile`, or
    any mapping of its members), value `i` read from member `array.<i>` when asked for."""

    def __init__(
        self, npz: Mapping[str, Any], dtypes: Sequence[str], *, keep: int = KEEP_BYTES
    ) -> None:
        self._npz = npz
        self._dtypes = [str(d) for d in dtypes]
        self._keep = keep
        self._recent: OrderedDict[int, np.ndarray] = OrderedDict()
        self._held = 0

    def __len__(self) -> int:
        return len(self._dtypes)

    def _get(self, i: int) -> np.ndarray:
        if i in self._recent:
            self._recent.move_to_end(i)
            return self._recent[i]
        array = mldtypes.from_raw(np.asarray(self._npz[f"array.{i}"]), self._dtypes[i])
        self._recent[i] = array
        self._held += array.nbytes
        while self._held > self._keep and len(self._recent) > 1:
            _, old = self._recent.popitem(last=False)
            self._held -= old.nbytes
        return array

    @property
    def nbytes(self) -> int:
        """The bytes of every value's numbers (as stored), without reading them."""
        zf = getattr(self._npz, "zip", None)
        if zf is None:
            return sum(np.asarray(self._npz[f"array.{i}"]).nbytes for i in range(len(self)))
        sizes = {info.filename: info.file_size for info in zf.infolist()}
        return sum(sizes.get(f"array.{i}.npy", 0) for i in range(len(self)))


class Appended(_Arrays):
    """A recording's value arrays with more after them, none of the first read to make it
    (a `StoredArrays` stays on disk)."""

    def __init__(self, first: Sequence[np.ndarray], more: Sequence[np.ndarray]) -> None:
        self._first, self._more = first, more

    def __len__(self) -> int:
        return len(self._first) + len(self._more)

    def _get(self, i: int) -> np.ndarray:
        n = len(self._first)
        return self._first[i] if i < n else self._more[i - n]
