"""Reading a golden file: read-only, checked on open and on every load.

`open_goldens` opens read-only without HDF5 file locking (safe for many
readers, pytest-xdist and read-only filesystems), refuses files that could pull data from
elsewhere (external links, external storage, virtual datasets, dangling soft links) and
verifies each array's checksum when it is loaded. Opening checks every link and every
dataset's storage with HDF5's low-level API (one visit over the links, one open per
dataset), and loading reads each dataset straight into a preallocated array, skipping
h5py's high-level objects, whose construction cost more than the reads themselves.

Plain HDF5 files without parity's attributes are readable too: every dataset is a key (its
path with "/" -> "."), with class "" and no checksum; `GoldenFile.source` reads a numeric
one by hyperslab, as it reads a golden array, so a diff of plain files is bounded in memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Callable, Iterator, Mapping as _MappingABC
from pathlib import Path
from typing import Any

import h5py
import h5py.h5d as h5d
import h5py.h5s as h5s
import numpy as np

from parity.judge import _mldtypes as mldtypes
from parity.judge._chunks import ArraySource, Block, Source, elements_per_chunk, plan
from parity.judge._floats import count
from parity.store._dtypes import c_order, digest, logical_dtype, storage_type
from parity.store._errors import (
    GoldenBusyError,
    GoldenCorruptError,
    GoldenFormatError,
    GoldenKeyError,
    GoldenMissingError,
    GoldenReadError,
    GoldenStoreError,
)
from parity.store._format import INDEX_ATTR, JOURNAL_NAME, REPIN_HINT, RESTORE_HINT
from parity.store._header import ArrayInfo, read_header, read_index
from parity.store._provenance_record import Provenance
from parity.store._scan import attr_str, one_line, scan
from parity.store._source import GoldenSource, PlainSource

__all__ = ["ArrayInfo", "GoldenFile", "open_goldens"]


class GoldenFile(_MappingABC[str, np.ndarray]):
    """A golden file opened read-only; arrays are loaded lazily and checked on load.

    A read-only `Mapping` from key to array (so `parity.assert_equivalent(actual, gf)` and
    `dict(gf)` work), ordered by key. Use as a context manager, or call `close()`. See
    `open_goldens`.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        journal = self.path.parent / JOURNAL_NAME
        if journal.exists():
            raise GoldenBusyError(
                f"{self.path}: its folder is mid-replace ({journal} lists files a repin was "
                "moving when it was interrupted); finish it with `python "
                "tools/repin_goldens.py --recover` (or any repin of that folder) and retry"
            )
        if not self.path.exists():
            raise GoldenMissingError(
                f"golden file {self.path} does not exist; pin it first ({REPIN_HINT})"
            )
        try:
            self._f = h5py.File(self.path, "r", locking=False)
        except Exception as e:  # OSError mostly; whatever HDF5 or h5py raise, it is input
            raise GoldenFormatError(
                f"{self.path} is not a readable HDF5 file (not HDF5, or truncated: "
                f"{type(e).__name__}: {e}); restore it from version control or {REPIN_HINT}"
            ) from None
        try:
            with self._reading("reading the file's root attributes"):
                header = read_header(self._f, self.path)
            self.is_parity_file: bool = header.is_parity_file
            self.schema_version: int | None = header.schema_version
            self.class_map_json: str = header.class_map_json
            self.provenance: Provenance = header.provenance
            # key -> dataset path, as text (undecodable bytes escaped), and key -> the
            # dataset handle the scan opened, handed over to the first load of the key:
            # re-opening by path costs ~20 us a key (a lookup per path segment, then the
            # object header), and holding the handles adds little memory (measured: ~13 kB a
            # dataset after the first open, nearly all of it kept after closing too).
            with self._reading("listing the file's groups and datasets"):
                self._paths, self._dsids = scan(
                    self._f, self.path, is_parity_file=self.is_parity_file
                )
            self._keys = sorted(self._paths)
            with self._reading(f"reading the {INDEX_ATTR} attribute"):
                self._index: dict[str, ArrayInfo] | None = read_index(
                    header.index_text, f=self._f, file_path=self.path, paths=self._paths
                )
            # What `info` read from the per-dataset attributes of a file without an index,
            # so a load after `info` does not read them again.
            self._attr_infos: dict[str, ArrayInfo] = {}
        except BaseException:
            with contextlib.suppress(Exception):
                self._f.close()
            raise

    @contextlib.contextmanager
    def _reading(self, doing: str, key: str | None = None) -> Iterator[None]:
        """Turn any failure of HDF5 or h5py while `doing` into a `GoldenReadError` naming the
        file and `key`: a damaged file makes h5py raise OSError ("incorrect metadata
        checksum", "truncated file", "bad object header"), KeyError, ValueError, TypeError,
        UnicodeDecodeError, RuntimeError, or SystemError (from an exception inside a C-level
        callback), and every one of them is an input error, not a bug of the caller."""
        try:
            yield
        except GoldenStoreError:
            raise
        except Exception as e:  # see above: any exception type, and all of them mean damage
            what = f"golden {key!r}: " if key is not None else ""
            raise GoldenReadError(
                f"{self.path}: {what}{doing} failed ({type(e).__name__}: {one_line(str(e))}); "
                f"the file is damaged. {RESTORE_HINT}"
            ) from None

    # -- opening

    # -- mapping interface

    def keys(self) -> list[str]:  # pyright: ignore[reportIncompatibleMethodOverride]
        """The keys in the file, sorted (a list, unlike `Mapping.keys`)."""
        return list(self._keys)

    def ordered_keys(self) -> list[str]:
        """The keys pinned with a place in the forward order (`order >= 0`), in that order.

        Keys pinned without one (order -1) are left out: a comparison puts them after the
        ordered keys, by name, so they are never named as a first divergence ahead of them.
        """
        places = {k: self.info(k).order for k in self._keys}
        return sorted((k for k, i in places.items() if i >= 0), key=places.__getitem__)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._paths)

    def __contains__(self, key: object) -> bool:
        return key in self._paths

    def _missing(self, key: str) -> GoldenKeyError:
        key = str(key)
        near = [k for k in self._keys if k.split(".")[0] == key.split(".")[0]][:5]
        return GoldenKeyError(
            f"{self.path} has no golden {key!r}"
            + (f" (keys with the same prefix: {near})" if near else "")
            + f"; if the key is new, {REPIN_HINT}"
        )

    def _open_dataset(self, key: str) -> h5d.DatasetID:
        # Popped, not kept: a load after the first re-opens by path, so handles do not pile
        # up for the life of the file.
        dsid = self._dsids.pop(key, None)
        if dsid is not None:
            return dsid
        try:
            name = self._paths[key]
        except KeyError:
            raise self._missing(key) from None
        return h5d.open(self._f.id, name.encode("utf-8", "surrogateescape"))

    def _attr_info(self, key: str, dsid: h5d.DatasetID) -> ArrayInfo:
        """`key`'s ArrayInfo from its dataset's own attributes (and shape)."""
        shape = tuple(dsid.shape)
        if not self.is_parity_file:
            return ArrayInfo(key, shape, dsid.dtype, "", None, -1)
        attrs = h5py.Dataset(dsid).attrs
        if "dtype" not in attrs or "sha256" not in attrs:
            raise GoldenFormatError(
                f"{self.path}: golden {key!r} lacks its dtype or sha256 attribute; {REPIN_HINT}"
            )
        return ArrayInfo(
            key=key,
            shape=shape,
            dtype=logical_dtype(attr_str(attrs["dtype"]), path=self.path, key=key),
            class_name=attr_str(attrs.get("class", "")),
            sha256=attr_str(attrs["sha256"]),
            order=int(attrs.get("order", -1)),  # pyright: ignore[reportArgumentType]
        )

    def info(self, key: str) -> ArrayInfo:
        """Shape, dtype, class, checksum and order of `key`, without reading its data.

        **Arguments:**

        - `key`: a key in the file.

        **Returns:** an `ArrayInfo`.
        """
        if self._index is not None:
            try:
                return self._index[key]
            except KeyError:
                raise self._missing(key) from None
        info = self._attr_infos.get(key)
        if info is None:
            with self._reading("reading its attributes", key):
                info = self._attr_infos[key] = self._attr_info(key, self._open_dataset(key))
        return info

    def __getitem__(self, key: str) -> np.ndarray:
        """Load `key`, verify its checksum, and return it with its logical dtype.

        Raises `GoldenCorruptError` if the bytes differ from those pinned, or the dataset
        from what the file's index says of it, and `GoldenReadError` if HDF5 cannot read it.
        """
        if key not in self._paths:
            raise self._missing(key)
        with self._reading("reading its data", key):
            return self._load(key)

    def _load(self, key: str) -> np.ndarray:
        dsid = self._open_dataset(key)
        if self._index is not None:
            info = self._index[key]
            stored = self._read_indexed(info, dsid)
        else:
            # Plain files may hold anything h5py reads (strings, empty dataspaces), so they
            # take h5py's general path; so do parity files without an index.
            stored = np.asarray(h5py.Dataset(dsid)[()])
            if not self.is_parity_file:
                return stored
            info = self.info(key)
            if stored.dtype.itemsize != info.dtype.itemsize:
                raise GoldenFormatError(
                    f"{self.path}: golden {key!r} is stored as {stored.dtype} but declared "
                    f"{info.dtype}; the widths differ. {REPIN_HINT}"
                )
        found = digest(stored)
        if found != info.sha256:
            raise GoldenCorruptError(
                f"{self.path}: golden {key!r} is corrupt: expected sha256 {info.sha256}, found "
                f"{found}. {RESTORE_HINT}"
            )
        if mldtypes.is_ml_dtype(info.dtype):
            return c_order(stored).view(info.dtype)
        return stored.astype(info.dtype, copy=False)

    def _read_indexed(self, info: ArrayInfo, dsid: h5d.DatasetID) -> np.ndarray:
        """Read `info`'s dataset into a fresh array of the stored dtype the index implies."""
        want = self._check_indexed(info, dsid)
        stored = np.empty(info.shape, want)
        if stored.size:  # HDF5 refuses to read an empty selection
            dsid.read(h5s.ALL, h5s.ALL, stored)
        return stored

    def _check_indexed(self, info: ArrayInfo, dsid: h5d.DatasetID) -> np.dtype:
        """Check that `info`'s dataset is stored as the index says; **returns** the stored
        dtype."""
        want, want_type = storage_type(info.dtype)
        # Checked before reading: HDF5 converts types on read (float64 data read as float32
        # would lose bits) and a read into a buffer of the wrong shape would overrun it; a
        # mismatch means the index or the dataset was altered.
        if not dsid.get_type().equal(want_type) or dsid.shape != info.shape:
            try:
                found = str(dsid.dtype)
            except TypeError:  # an HDF5 type numpy has no dtype for
                found = "a type numpy cannot hold"
            raise GoldenCorruptError(
                f"{self.path}: golden {info.key!r} is stored as {found} of shape "
                f"{dsid.shape}, but the {INDEX_ATTR} says {want} of shape {info.shape}. "
                + RESTORE_HINT
            )
        return want

    def _dataset(self, info: ArrayInfo, *, check: bool) -> _Dataset:
        """`info`'s dataset for a `Source`; with `check`, checked against the index when it
        is opened (a dataset that differs is a `GoldenCorruptError`)."""

        def open_it() -> h5d.DatasetID:
            dsid = self._open_dataset(info.key)
            if check:
                self._check_indexed(info, dsid)
            return dsid

        def reading() -> contextlib.AbstractContextManager[None]:
            return self._reading("reading its data", info.key)

        return _Dataset(open_it, reading, math.prod(info.shape))

    def source(self, key: str) -> Source:
        """`key` as a `parity.judge._chunks.Source`: read block by block (one HDF5 hyperslab each),
        so that a comparison holds a chunk at a time, not the array.

        A full pass over one plan's blocks, in order, is checked against the pinned sha256
        when it ends (`finish` raises `GoldenCorruptError`); a pass that does not reach the
        end (a pre-pass that only measures the golden's scale) is not. A numeric dataset of
        a plain HDF5 file is read by hyperslab too (it has no checksum to verify), so a diff
        of plain files is as bounded in memory as one of golden files. Datasets h5py reads
        only whole (strings, objects, compound or empty dataspaces) and schema-1 parity
        files (no index, the checksum over the whole array) are loaded whole, as by
        `self[key]`.

        **Arguments:**

        - `key`: a key in the file.

        **Returns:** a `Source` with the logical shape and dtype. Raises `GoldenKeyError`
        for a missing key and `GoldenCorruptError`/`GoldenReadError` as loading does.
        """
        if key not in self._paths:
            raise self._missing(key)
        if self._index is not None:
            info = self._index[key]
            return GoldenSource(self._dataset(info, check=True), info, self.path)
        if not self.is_parity_file:
            info = self._attr_infos.get(key)
            if info is None:
                with self._reading("reading its attributes", key):
                    held = key in self._dsids
                    dsid = self._open_dataset(key)
                    if held:  # back for the first read, as the opening scan left it
                        self._dsids[key] = dsid
                    if dsid.shape is not None:  # a null dataspace (h5py.Empty) has none
                        info = self._attr_infos[key] = self._attr_info(key, dsid)
            # Strings, objects and compound types have no hyperslab reads into numpy; they
            # (and empty dataspaces) are loaded whole, as before, for compare to refuse.
            if info is not None and info.dtype.kind in "biufc" and not info.dtype.fields:
                return PlainSource(self._dataset(info, check=False), info, self.path)
        return ArraySource(self[key])

    def get(self, key: str, default: Any = None) -> Any:
        """`self[key]` if the key is present, else `default`."""
        return self[key] if key in self._paths else default

    def load_all(self) -> dict[str, np.ndarray]:
        """Load and verify every array. **Returns:** key -> array, in sorted key order."""
        return {key: self[key] for key in self._keys}

    def verify(self) -> int:
        """Load every array and verify its checksum; where the file has an index, also check
        that it agrees with each dataset's own attributes (loading alone trusts the index
        for class and order, which are not covered by the checksum).

        **Returns:** the number of arrays verified. Raises `GoldenCorruptError` on the first
        disagreement.
        """
        for key in self._keys:
            if self._index is None and self.is_parity_file:
                self[key]
                continue
            # In chunks, so that verifying a file of any size holds one chunk at a time.
            src = self.source(key)
            for block in plan(src.shape, elements_per_chunk(src.dtype.itemsize)):
                src.read(block)
            src.finish()
            if self._index is None:  # a plain file: no index to check the attributes against
                continue
            with self._reading("reading its attributes", key):
                own = self._attr_info(key, self._open_dataset(key))
            listed = self._index[key]
            differ = [
                f.name
                for f in dataclasses.fields(ArrayInfo)
                if getattr(own, f.name) != getattr(listed, f.name)
            ]
            if differ:
                raise GoldenCorruptError(
                    f"{self.path}: the {INDEX_ATTR} and the attributes of golden {key!r} "
                    f"disagree on {', '.join(differ)} (index: {listed}; dataset: {own}). "
                    + RESTORE_HINT
                )
        return len(self._keys)

    # -- lifetime

    def close(self) -> None:
        """Close the underlying HDF5 file (idempotent)."""
        self._dsids.clear()
        self._f.close()

    def __enter__(self) -> GoldenFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = f"schema {self.schema_version}" if self.is_parity_file else "plain HDF5"
        return f"GoldenFile({str(self.path)!r}, {count(len(self), 'array')}, {kind})"


class _Dataset:
    """One array's dataset, read block by block for a `Source` (`parity.store._source`'s
    `BlockReader`): opened by `open` at the first block of a pass and let go when the pass
    ends, so that many sources (one per key of a group) hold no HDF5 handle until they are
    read; every read runs inside `reading` (the file's `_reading`, which names the file and
    key in a `GoldenReadError`)."""

    def __init__(
        self,
        open: Callable[[], h5d.DatasetID],
        reading: Callable[[], contextlib.AbstractContextManager[None]],
        size: int,
    ):
        self._open, self._reading, self._size = open, reading, size
        self._dsid: h5d.DatasetID | None = None

    def read_into(self, block: Block, out: np.ndarray) -> None:
        with self._reading():
            if self._dsid is None:
                self._dsid = self._open()
            _read_block(self._dsid, block, self._size, out)

    def release(self) -> None:
        self._dsid = None


def _read_block(dsid: h5d.DatasetID, block: Block, size: int, out: np.ndarray) -> None:
    """Read `block` of the dataset `dsid` (`size` elements in all) into `out` (shaped as the
    block's counts): one hyperslab, or the whole dataspace where the block is all of it."""
    if out.size == 0:
        return  # HDF5 refuses to read an empty selection
    if block.size == size:  # the whole array (a 0-d one has no hyperslabs)
        dsid.read(h5s.ALL, h5s.ALL, out)
        return
    space = dsid.get_space()
    space.select_hyperslab(block.offsets, block.counts)
    dsid.read(h5s.create_simple(block.counts), space, out)


def open_goldens(path: str | os.PathLike[str]) -> GoldenFile:
    """Open a golden file read-only.

    **Arguments:**

    - `path`: the HDF5 file (parity-written or plain).

    **Returns:** a `GoldenFile`; use it as a context manager.

    Raises `GoldenMissingError`, `GoldenFormatError` (not HDF5, truncated, malformed),
    `GoldenSchemaError` (written by a newer parity) or `GoldenUnsafeError` (external links,
    external storage, virtual datasets, dangling soft links).

    **Example:**

    ```python
    with parity.open_goldens("goldens/forward_llama.h5") as gf:
        logits = gf["logits.llama.clean"]  # checksum verified as it is read
    ```
    """
    return GoldenFile(path)
