"""A stored byte of a golden file damaged on purpose, for the tests of tests/parity that
show a damaged file is caught (the store, the chunked reader, the CLI, the plugin)."""

from __future__ import annotations

from pathlib import Path

import h5py


def flip_stored_byte(path: Path, dataset: str, at: int, bits: int) -> None:
    """XOR `bits` into byte `at` of `dataset`'s stored data (a contiguous HDF5 dataset, such
    as `"taps/x/%value"`) in the file `path`, in place."""
    with h5py.File(path, "r") as f:
        dset = f[dataset]
        assert isinstance(dset, h5py.Dataset), (path, dataset)
        offset = dset.id.get_offset()
    assert offset is not None, (path, dataset, "not contiguous")
    raw = bytearray(path.read_bytes())
    raw[offset + at] ^= bits
    path.write_bytes(bytes(raw))
