"""Dtypes as stored: the native ones, ml_dtypes as unsigned ints of their width.

**Dtypes.** bool, int8..64, uint8..64, float16/32/64 and complex64/128 are stored natively.
ml_dtypes (bfloat16, the float8 kinds, int4, ...) are stored as unsigned ints of the same
width and viewed back on read, so every bit (NaN payloads included) survives. Object,
string, datetime and other dtypes are refused.

The sha256 of an array is over its stored C-order bytes, little-endian.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

import h5py.h5t as h5t
import numpy as np

from parity.judge import _mldtypes as mldtypes
from parity.store._errors import GoldenFormatError, UnsupportedDtypeError

__all__ = [
    "NATIVE_DTYPES",
    "c_order",
    "digest",
    "logical_dtype",
    "storage_type",
    "to_storage",
    "uint_of_width",
]

# Standard numpy dtypes h5py stores natively and every HDF5 reader understands.
NATIVE_DTYPES = frozenset(
    np.dtype(name).name
    for name in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    )
)


def uint_of_width(itemsize: int) -> np.dtype:
    if itemsize not in (1, 2, 4, 8):
        raise UnsupportedDtypeError(f"no unsigned int of {itemsize} bytes to store this dtype")
    return np.dtype(f"<u{itemsize}")


def to_storage(key: str, value: Any) -> tuple[np.ndarray, str]:
    """Convert an array-like to (C-order little-endian storage array, logical dtype name),
    by the codec every file of parity's keeps dtypes by (`parity.judge._mldtypes.to_raw`)."""
    arr = np.asarray(value)
    dt = arr.dtype
    if not mldtypes.is_ml_dtype(dt) and (dt.name not in NATIVE_DTYPES or dt.fields is not None):
        raise UnsupportedDtypeError(
            f"golden {key!r}: dtype {dt} (kind {dt.kind!r}) cannot be stored exactly; expected "
            "bool, (u)int8..64, float16/32/64, complex64/128 or an ml_dtypes type such as "
            "bfloat16. Convert it to a numeric array before pinning."
        )
    # Little-endian on disk whatever the host, so the digest names the same bytes everywhere.
    return mldtypes.to_raw(arr)


def c_order(arr: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns 0-d arrays into shape (1,).
    return np.require(arr, requirements="C")


def digest(stored: np.ndarray) -> str:
    little = c_order(stored.astype(stored.dtype.newbyteorder("<"), copy=False))
    return hashlib.sha256(little.reshape(-1).view(np.uint8).data).hexdigest()


def logical_dtype(name: str, *, path: Path, key: str) -> np.dtype:
    if name in NATIVE_DTYPES:
        return np.dtype(name)
    # Only a name numpy does not know imports ml_dtypes: reading a float32 file never does.
    dt = mldtypes.by_name(name)
    if dt is None:
        raise GoldenFormatError(
            f"{path}: golden {key!r} has dtype {name!r}, which neither numpy nor the installed "
            "ml_dtypes knows; upgrade ml_dtypes (or parity) to read this file"
        )
    return dt


@functools.cache
def storage_type(logical: np.dtype) -> tuple[np.dtype, Any]:
    """The dtype `write_goldens` stores a `logical` array as (little-endian, ml_dtypes as
    unsigned ints of their width) and its HDF5 type. Cached: a file holds few dtypes, and
    comparing HDF5 types (H5Tequal) costs less than half what h5py's `DatasetID.dtype`, which
    builds a numpy dtype from the file's type, costs on a freshly opened dataset."""
    stored = uint_of_width(logical.itemsize) if mldtypes.is_ml_dtype(logical) else logical
    stored = stored.newbyteorder("<")
    return stored, h5t.py_create(stored)


_IndexRow = tuple[str, str, str, tuple[int, ...], str, str, int]
