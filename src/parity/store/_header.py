"""The root of a golden file read and checked: its attributes, and the index of arrays
checked against the datasets the file holds (see `parity.store._format`)."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from parity.judge._floats import count
from parity.store._dtypes import logical_dtype
from parity.store._errors import GoldenCorruptError, GoldenFormatError, GoldenSchemaError, printable
from parity.store._format import (
    INDEX_ATTR,
    META_ATTR,
    PARITY_ATTRS,
    REPIN_HINT,
    RESTORE_HINT,
    ROOT_ATTRS,
    SCHEMA_VERSION,
    meta_digest,
)
from parity.store._provenance_record import Provenance

__all__ = ["ArrayInfo", "Header", "read_header", "read_index"]


@dataclasses.dataclass(frozen=True)
class ArrayInfo:
    """What the golden file says about one array, without loading it.

    - `key`: the dotted key.
    - `shape`: the array's shape.
    - `dtype`: the logical dtype (for example bfloat16, not the stored uint16).
    - `class_name`: its tolerance class, "" if none was recorded.
    - `sha256`: hex digest of the stored bytes, or None for plain HDF5 files.
    - `order`: index in the declared forward order, -1 if none.
    """

    key: str
    shape: tuple[int, ...]
    dtype: np.dtype
    class_name: str
    sha256: str | None
    order: int


_IndexRow = tuple[str, str, str, tuple[int, ...], str, str, int]


def _index_row(row: Any) -> _IndexRow | None:
    """(key, path, dtype, shape, class, sha256, order) of one index entry; None if any field
    is missing or of the wrong type."""
    if not isinstance(row, dict):
        return None
    fields = ("key", "path", "dtype", "class", "sha256")
    texts = [row.get(name) for name in fields]
    shape, order = row.get("shape"), row.get("order")
    if not all(isinstance(t, str) for t in texts):
        return None
    # bool is an int to Python but never a valid order or extent.
    if not isinstance(order, int) or isinstance(order, bool) or not isinstance(shape, list):
        return None
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        return None
    key, path, dtype, class_name, sha256 = (str(t) for t in texts)
    return key, path, dtype, tuple(shape), class_name, sha256, order


@dataclasses.dataclass(frozen=True)
class Header:
    """What a golden file's root attributes say.

    - `is_parity_file`: whether the file has any of parity's root attributes.
    - `schema_version`: its schema version, None for a plain HDF5 file.
    - `class_map_json`: the pinned class map as JSON text, "" if none.
    - `provenance`: the pinned provenance, an empty one (`Provenance.is_empty`) if none.
    - `index_text`: the index of arrays as JSON text, None if the file has none.
    """

    is_parity_file: bool
    schema_version: int | None = None
    class_map_json: str = ""
    provenance: Provenance = dataclasses.field(default_factory=Provenance)
    index_text: str | None = None


def read_header(f: h5py.File, file_path: Path) -> Header:
    """Read and check the root attributes of the open file `f` (at `file_path`).

    In a version-2 file every root attribute must be present, of its type, and match
    `meta_sha256`, so the class map, provenance and index are exactly as written.

    **Returns:** the `Header`. Raises `GoldenFormatError`, `GoldenSchemaError` or
    `GoldenCorruptError`.
    """
    attrs = f.attrs
    names = set(attrs.keys())
    if not names & PARITY_ATTRS:
        return Header(is_parity_file=False)
    if "schema_version" not in names:
        raise GoldenFormatError(
            f"{file_path} has parity's root attributes ({', '.join(sorted(names)[:6])}) "
            f"but no schema_version: the file is damaged. {RESTORE_HINT}"
        )
    version = attrs["schema_version"]
    if type(version) is not np.int64:
        raise GoldenFormatError(
            f"{file_path}: schema_version is {printable(repr(version))} of type "
            f"{type(version).__name__}, expected an int64. {RESTORE_HINT}"
        )
    version = int(version)
    if version > SCHEMA_VERSION:
        raise GoldenSchemaError(
            f"{file_path} has schema_version {version}, but this parity reads up to "
            f"{SCHEMA_VERSION}: it was written by a newer parity; upgrade parity"
        )
    if version < 1:
        raise GoldenFormatError(f"{file_path}: schema_version {version} is not valid (>= 1)")
    allowed = ROOT_ATTRS[version]
    if not names <= allowed or (version >= 2 and names != allowed):
        raise GoldenFormatError(
            f"{file_path}: a schema {version} file has the root attributes "
            f"{', '.join(sorted(allowed))}; this one lacks "
            f"{sorted(allowed - names) if version >= 2 else []} and has unknown "
            f"{sorted(names - allowed)}: the file is damaged or was edited. {RESTORE_HINT}"
        )
    class_map = _root_text(f, file_path, version, "class_map", "")
    prov_text = _root_text(f, file_path, version, "provenance", "{}")
    index_text = _root_text(f, file_path, version, INDEX_ATTR, None)
    if version >= 2:
        n_arrays = attrs["n_arrays"]
        if type(n_arrays) is not np.int64:
            raise GoldenFormatError(
                f"{file_path}: n_arrays is of type {type(n_arrays).__name__}, expected "
                f"an int64. {RESTORE_HINT}"
            )
        recorded = _root_text(f, file_path, version, META_ATTR, None)
        assert index_text is not None and recorded is not None  # by the name check
        found = meta_digest(version, class_map, prov_text, int(n_arrays), index_text)
        if found != recorded:
            raise GoldenCorruptError(
                f"{file_path}: the metadata (class map, provenance, index of arrays) does "
                f"not match its checksum {META_ATTR} (expected {printable(recorded)[:64]}, "
                f"found {found}): the file is damaged. {RESTORE_HINT}"
            )
    try:
        prov = json.loads(prov_text or "{}")
    except json.JSONDecodeError as e:
        raise GoldenFormatError(
            f"{file_path}: the provenance attribute is not JSON ({e}); {REPIN_HINT}"
        ) from None
    return Header(
        is_parity_file=True,
        schema_version=version,
        class_map_json=class_map,
        provenance=Provenance.from_json_dict(prov if isinstance(prov, dict) else {}),
        index_text=index_text,
    )


@typing.overload
def _root_text(f: h5py.File, file_path: Path, version: int, name: str, default: str) -> str: ...
@typing.overload
def _root_text(
    f: h5py.File, file_path: Path, version: int, name: str, default: None
) -> str | None: ...
def _root_text(
    f: h5py.File, file_path: Path, version: int, name: str, default: str | None
) -> str | None:
    """The root attribute `name` as text, checked to be valid UTF-8 and of the kind of
    string a file of schema `version` writes; `default` if absent."""
    value = f.attrs.get(name)
    if value is None:
        return default
    # Version 2 writes fixed-length strings (h5py reads them as bytes), version 1
    # variable-length ones (str).
    want = bytes if version >= 2 else str
    if isinstance(value, bytes) and want is str:
        want = bytes  # version 1 was lenient about the kind of string
    if not isinstance(value, want):
        raise GoldenFormatError(
            f"{file_path}: the root attribute {name} is of type {type(value).__name__}, "
            f"expected {'fixed-length' if want is bytes else 'variable-length'} text. "
            + RESTORE_HINT
        )
    try:
        text = value.decode("utf-8") if isinstance(value, bytes) else value
        text.encode("utf-8")  # a str from h5py may hold undecodable bytes as surrogates
    except UnicodeError:
        raise GoldenFormatError(
            f"{file_path}: the root attribute {name} is not valid UTF-8. {RESTORE_HINT}"
        ) from None
    return text


def read_index(
    text: str | None, *, f: h5py.File, file_path: Path, paths: dict[str, str]
) -> dict[str, ArrayInfo] | None:
    """The root index (its JSON `text`) of the open file `f` (at `file_path`) as key ->
    ArrayInfo, checked against `paths` (key -> dataset path, every dataset the file holds);
    None for plain files and parity files written before the index existed."""
    if text is None:
        return None
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise GoldenFormatError(
            f"{file_path}: the {INDEX_ATTR} attribute is not JSON ({e}); {REPIN_HINT}"
        ) from None
    if not isinstance(rows, list):
        raise GoldenFormatError(
            f"{file_path}: the {INDEX_ATTR} attribute is not a JSON list; {REPIN_HINT}"
        )
    index: dict[str, ArrayInfo] = {}
    dtypes: dict[str, np.dtype] = {}
    for row in rows:
        entry = _index_row(row)
        if entry is None:
            raise GoldenFormatError(
                f"{file_path}: malformed {INDEX_ATTR} entry {str(row)[:200]}; expected "
                "key, path, dtype, shape, class, sha256 and order. " + REPIN_HINT
            )
        key, path, dtype_name, shape, class_name, sha256, order = entry
        if key in index:
            raise GoldenFormatError(
                f"{file_path}: the {INDEX_ATTR} lists {key!r} twice; {REPIN_HINT}"
            )
        if paths.get(key, path) != path:
            raise GoldenCorruptError(
                f"{file_path}: the {INDEX_ATTR} puts golden {key!r} at {path!r}, but the "
                f"file holds it at {paths[key]!r}. {RESTORE_HINT}"
            )
        dtype = dtypes.get(dtype_name)
        if dtype is None:
            dtype = dtypes[dtype_name] = logical_dtype(dtype_name, path=file_path, key=key)
        index[key] = ArrayInfo(key, shape, dtype, class_name, sha256, order)
    if len(index) != len(paths) or index.keys() != paths.keys():
        unlisted = sorted(paths.keys() - index.keys())
        absent = sorted(index.keys() - paths.keys())
        raise GoldenCorruptError(
            f"{file_path}: the {INDEX_ATTR} disagrees with the datasets in the file "
            f"(not in the index: {unlisted[:5]}; in the index, no dataset: {absent[:5]}). "
            + RESTORE_HINT
        )
    n_arrays = f.attrs.get("n_arrays")
    if n_arrays is not None and int(n_arrays) != len(index):  # pyright: ignore[reportArgumentType]
        raise GoldenCorruptError(
            f"{file_path}: n_arrays says {count(int(n_arrays), 'array')}, the {INDEX_ATTR} lists "  # pyright: ignore[reportArgumentType]
            f"{len(index)}. {RESTORE_HINT}"
        )
    return index
