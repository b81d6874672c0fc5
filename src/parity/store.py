"""The golden store: pinned arrays in one HDF5 file, written atomically, read with checks.

**Layout.** Each key is split on "." into segments and stored as a group path with a
fixed dataset name at its end:

    "taps.llama.layers.3.mlp"   ->   /taps/llama/layers/3/mlp/%value

A fixed leaf name is what makes the mapping safe when one key is a prefix of another:
`a.b` and `a.b.c` become `/a/b/%value` and `/a/b/c/%value`, so the group `/a/b` holds both
the dataset of `a.b` and the subgroup of `a.b.c`. Inside a segment, "%" and "/" are written
as "%25" and "%2F" (upper-case hex); no escaped segment can equal `%value` (the "%" of an
escape is always followed by two hex digits, and "v" is not one), so keys round-trip
exactly. Keys that are empty, contain NUL, or have an empty segment (`a..b`, `.a`, `a.`)
are refused: HDF5 names cannot hold them.

**Per dataset** attributes: `class` (tolerance class name, may be ""), `dtype` (the
array's dtype name, e.g. "bfloat16"), `sha256` (hex digest of the stored C-order bytes,
little-endian; for ml_dtypes the bytes of the unsigned-int view) and `order` (index in the
declared forward order, or -1). **At the root:** `schema_version`, `class_map` (JSON text),
`provenance` (JSON text, sorted keys), `n_arrays`, `index` and `meta_sha256`. Text is
stored as fixed-length UTF-8 strings (h5py reads them as bytes): variable-length strings
live in HDF5's global heap, whose damage can make HDF5 loop forever on read.

**The metadata checksum** (`meta_sha256`, schema 2) is the sha256 of the other root
attributes, serialised canonically (`_meta_digest`). With the per-array sha256 of the data
it covers every byte a check relies on: the index repeats every per-dataset attribute, and
a reader checks the datasets against the index. HDF5's own checksums (object headers,
B-trees, the superblock, in the `v110` format) catch damage to the file's structure;
large root attributes live in a fractal heap HDF5 does not checksum, which is why this one
exists. A schema-2 file must hold exactly its six root attributes, of their types; a file
with any of parity's root attributes, or with datasets named `%value`, is a parity file
(so a damaged attribute name cannot make it read as an unchecked plain file). Schema-1
files (no `meta_sha256`) are still read as before.

**The index** (root attribute `index`, JSON text) lists every array once, in sorted key
order: `[{"class", "dtype", "key", "order", "path", "sha256", "shape"}, ...]`, where `path`
is the dataset's path and the other fields repeat its attributes. It exists for speed: a
reader learns every key, class, order, shape and checksum from one attribute read instead
of four per dataset (h5py attribute reads cost ~55 us each, far more than reading a small
array). It is checked, not trusted: `meta_sha256` covers its text, opening refuses an index
whose keys or paths differ from the datasets in the file, loading refuses data whose
shape, stored dtype or sha256 differ from the index, and `GoldenFile.verify` also compares
the index with every dataset's own attributes (which a plain load does not read: they sit
in each dataset's object header, which HDF5 checksums when the dataset is opened). Files
without it (written before it existed) are read through the per-dataset attributes, as are
the attributes themselves by any plain HDF5 reader.

**Dtypes.** bool, int8..64, uint8..64, float16/32/64 and complex64/128 are stored natively.
ml_dtypes (bfloat16, the float8 kinds, int4, ...) are stored as unsigned ints of the same
width and viewed back on read, so every bit (NaN payloads included) survives. Object,
string, datetime and other dtypes are refused.

**Determinism.** The same inputs give the same bytes: no object timestamps, keys written
in sorted order, a fixed HDF5 format range (`libver=("v110", "v110")`), contiguous storage
without filters.

**Errors.** Every failure to read is a `GoldenStoreError` whose message is one printable
line naming the file, the key where there is one, and what is wrong: HDF5 and h5py errors
from a damaged file (a failed checksum of HDF5's metadata, a truncated file, a structure
pointing nowhere, undecodable text) become `GoldenReadError`; names that are not UTF-8 are
shown escaped. A folder with a pending repin journal (`JOURNAL_NAME`, see
`parity.staging`) is refused with `GoldenBusyError`. `tests/parity/test_store_fuzz.py`
checks all this against random damage to the committed goldens.

**Reading.** `open_goldens` opens read-only without HDF5 file locking (safe for many
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
import functools
import hashlib
import json
import math
import os
import re
import tempfile
import typing
from collections.abc import Iterator, Mapping, Sequence
from collections.abc import Mapping as _MappingABC
from pathlib import Path
from typing import Any

import h5py
import h5py.h5d as h5d
import h5py.h5l as h5l
import h5py.h5o as h5o
import h5py.h5s as h5s
import h5py.h5t as h5t
import numpy as np

from parity.judge import mldtypes
from parity.judge.chunks import ArraySource, Block, Source, elements_per_chunk, plan

__all__ = [
    "INDEX_ATTR",
    "JOURNAL_NAME",
    "META_ATTR",
    "SCHEMA_VERSION",
    "ArrayInfo",
    "GoldenBusyError",
    "GoldenCorruptError",
    "GoldenFile",
    "GoldenFormatError",
    "GoldenKeyError",
    "GoldenMissingError",
    "GoldenReadError",
    "GoldenSchemaError",
    "GoldenStoreError",
    "GoldenUnsafeError",
    "UnsupportedDtypeError",
    "decode_path",
    "encode_key",
    "open_goldens",
    "write_goldens",
]

#: Version of the layout above. Readers refuse files with a newer version. 2 added
#: `meta_sha256`; files of version 1 (no metadata checksum) are still read.
SCHEMA_VERSION = 2

#: Name of the dataset at the end of each key's group path.
VALUE_NAME = "%value"

#: Name of the root attribute holding the index of every array (see the module docstring).
INDEX_ATTR = "index"

#: A file of this name beside a golden file means its folder is mid-replace (see
#: `parity.staging`): reading is refused until the replace is finished.
JOURNAL_NAME = ".parity-repin.journal"

#: Name of the root attribute holding the checksum of every other root attribute.
META_ATTR = "meta_sha256"

# The root attributes of each schema version, exactly: anything missing or added means the
# file was damaged (a flipped byte in an attribute's name) or edited by hand.
_ROOT_ATTRS = {
    1: frozenset({"schema_version", "class_map", "provenance", "n_arrays", INDEX_ATTR}),
    2: frozenset({"schema_version", "class_map", "provenance", "n_arrays", INDEX_ATTR, META_ATTR}),
}
# Any one of these at the root makes a file a parity file (index-less version-1 files lack
# some), so that a damaged name cannot turn a parity file into an unchecked plain one.
_PARITY_ATTRS = frozenset().union(*_ROOT_ATTRS.values())

# Fixed so the file format (and hence its bytes) does not move with the HDF5 release;
# v110 also allows dense attribute storage, so a large provenance or class map still fits.
_LIBVER = ("v110", "v110")

_REPIN_HINT = "repin with `python tools/repin_goldens.py --base SHA`"
_RESTORE_HINT = f"Restore the file from version control or {_REPIN_HINT}"

# Dataset handles the opening scan keeps for the first load of their key (saving a second
# open): at most this many, since an open dataset holds ~16 kB (measured), which for a file of
# 100,000 arrays would be 1.6 GB where the rest of reading it needs tens of MB.
_HELD_HANDLES = 512

# Standard numpy dtypes h5py stores natively and every HDF5 reader understands.
_NATIVE_DTYPES = frozenset(
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


# --------------------------------------------------------------------------- errors


class GoldenStoreError(Exception):
    """Base class of every refusal of the golden store.

    Its text is one printable line: names read from a damaged file may hold bytes that are
    not UTF-8 (kept as lone surrogates) or control characters, which are escaped
    (`\\udcff`, `\\n`), so the message prints to any UTF-8 stream.
    """

    def __str__(self) -> str:
        return _printable(super().__str__())


class GoldenBusyError(GoldenStoreError):
    """The file's folder is mid-replace: a repin was interrupted between its first and last
    rename (see `parity.staging`)."""


class GoldenMissingError(GoldenStoreError, FileNotFoundError):
    """The golden file does not exist."""


class GoldenFormatError(GoldenStoreError):
    """The file is not a readable HDF5 file (not HDF5, truncated) or its layout is malformed."""


class GoldenSchemaError(GoldenStoreError):
    """The file was written with a newer schema than this parity reads."""


class GoldenUnsafeError(GoldenStoreError):
    """The file can pull data from outside itself (external links or storage, virtual data)."""


class GoldenCorruptError(GoldenStoreError):
    """An array's bytes do not match the checksum recorded when it was written."""


class GoldenReadError(GoldenFormatError):
    """HDF5 failed to read part of the file (a checksum of HDF5's own metadata failed, the
    file ends early, a structure points nowhere): the file is damaged."""


class GoldenKeyError(GoldenStoreError, KeyError):
    """A key is not in the golden file, or cannot be stored as one."""

    def __str__(self) -> str:
        # KeyError's str() repr-quotes its message; these messages are sentences.
        return _printable(str(self.args[0])) if self.args else ""


class UnsupportedDtypeError(GoldenStoreError, TypeError):
    """An array's dtype cannot be stored exactly (object, string, datetime, ...)."""


def _printable(text: str) -> str:
    """`text` with every character that is not printable (control characters, lone
    surrogates from undecodable names) written as its Python escape: one line, valid UTF-8."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


# --------------------------------------------------------------------------- key mapping


_ESCAPE_RE = re.compile(r"%(25|2F)")


def _escape_segment(segment: str) -> str:
    return segment.replace("%", "%25").replace("/", "%2F")


def _unescape_segment(segment: str) -> str:
    return _ESCAPE_RE.sub(lambda m: "%" if m.group(1) == "25" else "/", segment)


def encode_key(key: str) -> str:
    """Return the HDF5 group path (without the leaf dataset) that stores `key`.

    **Arguments:**

    - `key`: a dotted key such as `"taps.llama.layers.3.mlp"`.

    **Returns:** the path, such as `"taps/llama/layers/3/mlp"`; the dataset itself is
    `path + "/" + VALUE_NAME`.

    Raises `GoldenKeyError` for an empty key, a key with NUL, or an empty segment.
    """
    if not isinstance(key, str):
        raise GoldenKeyError(f"golden keys must be str, got {type(key).__name__} {key!r}")
    if "\x00" in key:
        raise GoldenKeyError(f"golden key {key!r} contains NUL, which HDF5 names cannot hold")
    segments = key.split(".")
    if any(s == "" for s in segments):
        raise GoldenKeyError(
            f"golden key {key!r} has an empty segment (leading, trailing or doubled '.'); "
            "use non-empty dot-separated names such as 'taps.llama.layers.3'"
        )
    return "/".join(_escape_segment(s) for s in segments)


def decode_path(path: str) -> str:
    """Invert `encode_key`: the key stored at the group path `path`.

    **Arguments:**

    - `path`: a group path as written by `encode_key` (leading "/" allowed).

    **Returns:** the dotted key.
    """
    return ".".join(_unescape_segment(s) for s in path.strip("/").split("/"))


# --------------------------------------------------------------------------- dtypes


def _uint_of_width(itemsize: int) -> np.dtype:
    if itemsize not in (1, 2, 4, 8):
        raise UnsupportedDtypeError(f"no unsigned int of {itemsize} bytes to store this dtype")
    return np.dtype(f"<u{itemsize}")


def _to_storage(key: str, value: Any) -> tuple[np.ndarray, str]:
    """Convert an array-like to (C-order little-endian storage array, logical dtype name)."""
    arr = np.asarray(value)
    dt = arr.dtype
    if mldtypes.is_ml_dtype(dt):
        stored = _c_order(arr).view(_uint_of_width(dt.itemsize))
        return stored, dt.name
    if dt.name not in _NATIVE_DTYPES or dt.fields is not None:
        raise UnsupportedDtypeError(
            f"golden {key!r}: dtype {dt} (kind {dt.kind!r}) cannot be stored exactly; expected "
            "bool, (u)int8..64, float16/32/64, complex64/128 or an ml_dtypes type such as "
            "bfloat16. Convert it to a numeric array before pinning."
        )
    # Little-endian on disk whatever the host, so the digest names the same bytes everywhere.
    stored = _c_order(arr.astype(dt.newbyteorder("<"), copy=False))
    return stored, dt.name


def _c_order(arr: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns 0-d arrays into shape (1,).
    return np.require(arr, requirements="C")


def _digest(stored: np.ndarray) -> str:
    little = _c_order(stored.astype(stored.dtype.newbyteorder("<"), copy=False))
    return hashlib.sha256(little.reshape(-1).view(np.uint8).data).hexdigest()


def _logical_dtype(name: str, *, path: Path, key: str) -> np.dtype:
    if name in _NATIVE_DTYPES:
        return np.dtype(name)
    # Only a name numpy does not know imports ml_dtypes: reading a float32 file never does.
    dt = mldtypes.by_name(name)
    if dt is None:
        raise GoldenFormatError(
            f"{path}: golden {key!r} has dtype {name!r}, which neither numpy nor the installed "
            "ml_dtypes knows; upgrade ml_dtypes (or parity) to read this file"
        )
    return dt


# --------------------------------------------------------------------------- writing


def write_goldens(
    path: str | os.PathLike[str],
    arrays: Mapping[str, Any],
    *,
    classes: Mapping[str, str] | None = None,
    class_map_json: str = "",
    provenance: Mapping[str, Any] | None = None,
    order: Sequence[str] | None = None,
) -> Path:
    """Write `arrays` to a golden file at `path`, atomically and byte-reproducibly.

    The file is written to a temporary file in the same directory, flushed, fsynced and
    moved over `path` with `os.replace`; if anything fails, the temporary file is removed
    and an existing `path` is left as it was.

    **Arguments:**

    - `path`: destination file; its directory must exist.
    - `arrays`: key -> array-like (numpy or jax arrays, any shape including 0-d and empty).
    - `classes`: key -> tolerance class name; keys not named get "". Every key named here
      must be in `arrays`.
    - `class_map_json`: the pattern -> class map as JSON text, stored at the root.
    - `provenance`: JSON-serialisable mapping, stored at the root with sorted keys.
    - `order`: the declared forward order (taps by layer, trajectory leaves by step); each
      key's index is stored as `order`, -1 for keys not in it. Every key must be in `arrays`.

    **Returns:** `path` as a `Path`.
    """
    dest = Path(path)
    classes = dict(classes or {})
    order_list = list(order or [])
    keys = sorted(arrays)
    # Validate everything cheap before touching the disk, so typos fail fast.
    groups = {k: encode_key(k) for k in keys}
    unknown = sorted(set(classes) - set(arrays))
    if unknown:
        raise GoldenKeyError(f"classes names keys that are not in arrays: {unknown[:10]}")
    unknown = sorted(set(order_list) - set(arrays))
    if unknown:
        raise GoldenKeyError(f"order names keys that are not in arrays: {unknown[:10]}")
    if len(set(order_list)) != len(order_list):
        dup = sorted({k for k in order_list if order_list.count(k) > 1})
        raise GoldenKeyError(f"order lists keys more than once: {dup[:10]}")
    order_index = {k: i for i, k in enumerate(order_list)}
    prov_json = json.dumps(dict(provenance or {}), sort_keys=True, allow_nan=False)

    dest_dir = dest.parent if str(dest.parent) else Path(".")
    # Built in memory (HDF5's core driver, same bytes as a file on disk) and written with
    # plain file I/O: a full disk or a file size limit then fails one `write` with a clean
    # OSError, where HDF5 writing to disk itself leaves its library state broken and can
    # crash the process at exit (found by tests/parity/test_repin.py's RLIMIT_FSIZE test).
    with h5py.File(
        f"parity-{dest.name}",
        "w",
        driver="core",
        backing_store=False,
        libver=_LIBVER,
        track_order=False,
        track_times=False,
        locking=False,
    ) as f:
        f.attrs["schema_version"] = np.int64(SCHEMA_VERSION)
        _set_text(f.attrs, "class_map", class_map_json)
        _set_text(f.attrs, "provenance", prov_json)
        f.attrs["n_arrays"] = np.int64(len(keys))
        index: list[dict[str, Any]] = []
        for key in keys:
            # Converted one at a time so device arrays are fetched one at a time.
            stored, dtype_name = _to_storage(key, arrays[key])
            group = _require_group(f, groups[key])
            dset = group.create_dataset(VALUE_NAME, data=stored, track_times=False)
            entry = {
                "class": str(classes.get(key, "")),
                "dtype": dtype_name,
                "key": key,
                "order": order_index.get(key, -1),
                "path": f"{groups[key]}/{VALUE_NAME}",
                "sha256": _digest(stored),
                "shape": list(stored.shape),
            }
            _set_text(dset.attrs, "class", entry["class"])
            _set_text(dset.attrs, "dtype", dtype_name)
            _set_text(dset.attrs, "sha256", entry["sha256"])
            dset.attrs["order"] = np.int64(entry["order"])
            index.append(entry)
        # Written last because the digests are known only now; keys are sorted, so
        # the text (and hence the file) is the same for the same inputs.
        index_json = json.dumps(index, sort_keys=True, separators=(",", ":"))
        _set_text(f.attrs, INDEX_ATTR, index_json)
        meta = _meta_digest(SCHEMA_VERSION, class_map_json, prov_json, len(keys), index_json)
        _set_text(f.attrs, META_ATTR, meta)
        f.flush()
        image = f.id.get_file_image()
    fd, tmp_name = tempfile.mkstemp(dir=dest_dir, prefix=f".{dest.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(image)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _mode_for(dest))
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_dir(dest_dir)
    return dest


def _meta_digest(
    schema_version: int, class_map: str, provenance: str, n_arrays: int, index: str
) -> str:
    """sha256 of the root attributes other than itself, serialised canonically (a JSON list
    of the values in this order, ASCII only, no spaces). The index repeats every per-array
    attribute (class, dtype, order, sha256, shape, path), so this covers all metadata.
    Raises UnicodeEncodeError for text that is not valid Unicode (lone surrogates)."""
    blob = json.dumps(
        [schema_version, class_map, provenance, n_arrays, index],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _set_text(attrs: h5py.AttributeManager, name: str, text: str) -> None:
    """Store `text` as a fixed-length UTF-8 string attribute (NUL-padded; an empty text
    takes one byte). Not h5py's default variable-length string: those live in HDF5's global
    heap, and a damaged global heap can make HDF5 loop forever on read (found by the
    corruption fuzzer, `tests/parity/test_store_fuzz.py`); fixed-length text sits in the
    attribute itself."""
    raw = text.encode("utf-8")
    attrs.create(name, np.bytes_(raw), dtype=h5py.string_dtype("utf-8", max(1, len(raw))))


def _require_group(f: h5py.File, group_path: str) -> h5py.Group:
    group: h5py.Group = f
    for segment in group_path.split("/"):
        sub = group.get(segment)
        if sub is None:
            sub = group.create_group(segment, track_order=False, track_times=False)
        group = sub  # pyright: ignore[reportAssignmentType]
    return group


def _mode_for(dest: Path) -> int:
    # mkstemp creates 0600; goldens are shared data, so keep an existing file's mode or 0644.
    try:
        return dest.stat().st_mode & 0o777
    except FileNotFoundError:
        return 0o644


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; not every platform can open a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- reading


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


def _attr_str(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _escape_undecodable(text: str) -> str:
    """`text` from `_text` with each byte that was not UTF-8 written as `\\xNN`."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _text(name: bytes | str) -> str:
    """An HDF5 name as text; bytes that are not UTF-8 are escaped, so the text encodes
    back to the same name (`encode("utf-8", "surrogateescape")`)."""
    return name.decode("utf-8", "surrogateescape") if isinstance(name, bytes) else name


@functools.cache
def _storage_type(logical: np.dtype) -> tuple[np.dtype, Any]:
    """The dtype `write_goldens` stores a `logical` array as (little-endian, ml_dtypes as
    unsigned ints of their width) and its HDF5 type. Cached: a file holds few dtypes, and
    comparing HDF5 types (H5Tequal) costs less than half what h5py's `DatasetID.dtype`, which
    builds a numpy dtype from the file's type, costs on a freshly opened dataset."""
    stored = _uint_of_width(logical.itemsize) if mldtypes.is_ml_dtype(logical) else logical
    stored = stored.newbyteorder("<")
    return stored, h5t.py_create(stored)


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
                f"golden file {self.path} does not exist; pin it first ({_REPIN_HINT})"
            )
        try:
            self._f = h5py.File(self.path, "r", locking=False)
        except Exception as e:  # OSError mostly; whatever HDF5 or h5py raise, it is input
            raise GoldenFormatError(
                f"{self.path} is not a readable HDF5 file (not HDF5, or truncated: "
                f"{type(e).__name__}: {e}); restore it from version control or {_REPIN_HINT}"
            ) from None
        try:
            with self._reading("reading the file's root attributes"):
                index_text = self._load_header()
            # key -> dataset path, as text (undecodable bytes escaped), and key -> the
            # dataset handle the scan opened, handed over to the first load of the key:
            # re-opening by path costs ~20 us a key (a lookup per path segment, then the
            # object header), and holding the handles adds little memory (measured: ~13 kB a
            # dataset after the first open, nearly all of it kept after closing too).
            self._dsids: dict[str, Any] = {}
            with self._reading("listing the file's groups and datasets"):
                self._paths: dict[str, str] = self._scan()
            self._keys = sorted(self._paths)
            with self._reading(f"reading the {INDEX_ATTR} attribute"):
                self._index: dict[str, ArrayInfo] | None = self._read_index(index_text)
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
                f"{self.path}: {what}{doing} failed ({type(e).__name__}: {_one_line(str(e))}); "
                f"the file is damaged. {_RESTORE_HINT}"
            ) from None

    # -- opening

    def _load_header(self) -> str | None:
        """Read and check the root attributes; **returns** the index text (None if absent).

        In a version-2 file every root attribute must be present, of its type, and match
        `meta_sha256`, so the class map, provenance and index are exactly as written."""
        attrs = self._f.attrs
        names = set(attrs.keys())
        self.is_parity_file: bool = bool(names & _PARITY_ATTRS)
        self.schema_version: int | None = None
        self.class_map_json: str = ""
        self.provenance: dict[str, Any] = {}
        if not self.is_parity_file:
            return None
        if "schema_version" not in names:
            raise GoldenFormatError(
                f"{self.path} has parity's root attributes ({', '.join(sorted(names)[:6])}) "
                f"but no schema_version: the file is damaged. {_RESTORE_HINT}"
            )
        version = attrs["schema_version"]
        if type(version) is not np.int64:
            raise GoldenFormatError(
                f"{self.path}: schema_version is {_printable(repr(version))} of type "
                f"{type(version).__name__}, expected an int64. {_RESTORE_HINT}"
            )
        version = int(version)
        if version > SCHEMA_VERSION:
            raise GoldenSchemaError(
                f"{self.path} has schema_version {version}, but this parity reads up to "
                f"{SCHEMA_VERSION}: it was written by a newer parity; upgrade parity"
            )
        if version < 1:
            raise GoldenFormatError(f"{self.path}: schema_version {version} is not valid (>= 1)")
        allowed = _ROOT_ATTRS[version]
        if not names <= allowed or (version >= 2 and names != allowed):
            raise GoldenFormatError(
                f"{self.path}: a schema {version} file has the root attributes "
                f"{', '.join(sorted(allowed))}; this one lacks "
                f"{sorted(allowed - names) if version >= 2 else []} and has unknown "
                f"{sorted(names - allowed)}: the file is damaged or was edited. {_RESTORE_HINT}"
            )
        self.schema_version = version
        class_map = self._root_text("class_map", "")
        prov_text = self._root_text("provenance", "{}")
        index_text = self._root_text(INDEX_ATTR, None)
        if version >= 2:
            n_arrays = attrs["n_arrays"]
            if type(n_arrays) is not np.int64:
                raise GoldenFormatError(
                    f"{self.path}: n_arrays is of type {type(n_arrays).__name__}, expected "
                    f"an int64. {_RESTORE_HINT}"
                )
            recorded = self._root_text(META_ATTR, None)
            assert index_text is not None and recorded is not None  # by the name check
            found = _meta_digest(version, class_map, prov_text, int(n_arrays), index_text)
            if found != recorded:
                raise GoldenCorruptError(
                    f"{self.path}: the metadata (class map, provenance, index of arrays) does "
                    f"not match its checksum {META_ATTR} (expected {_printable(recorded)[:64]}, "
                    f"found {found}): the file is damaged. {_RESTORE_HINT}"
                )
        self.class_map_json = class_map
        try:
            prov = json.loads(prov_text or "{}")
        except json.JSONDecodeError as e:
            raise GoldenFormatError(
                f"{self.path}: the provenance attribute is not JSON ({e}); {_REPIN_HINT}"
            ) from None
        self.provenance = prov if isinstance(prov, dict) else {}
        return index_text

    @typing.overload
    def _root_text(self, name: str, default: str) -> str: ...
    @typing.overload
    def _root_text(self, name: str, default: None) -> str | None: ...
    def _root_text(self, name: str, default: str | None) -> str | None:
        """The root attribute `name` as text, checked to be valid UTF-8 and of the kind of
        string its schema writes; `default` if absent."""
        value = self._f.attrs.get(name)
        if value is None:
            return default
        # Version 2 writes fixed-length strings (h5py reads them as bytes), version 1
        # variable-length ones (str).
        want = bytes if self.schema_version and self.schema_version >= 2 else str
        if isinstance(value, bytes) and want is str:
            want = bytes  # version 1 was lenient about the kind of string
        if not isinstance(value, want):
            raise GoldenFormatError(
                f"{self.path}: the root attribute {name} is of type {type(value).__name__}, "
                f"expected {'fixed-length' if want is bytes else 'variable-length'} text. "
                + _RESTORE_HINT
            )
        try:
            text = value.decode("utf-8") if isinstance(value, bytes) else value
            text.encode("utf-8")  # a str from h5py may hold undecodable bytes as surrogates
        except UnicodeError:
            raise GoldenFormatError(
                f"{self.path}: the root attribute {name} is not valid UTF-8. {_RESTORE_HINT}"
            ) from None
        return text

    def _scan(self) -> dict[str, str]:
        """Check every link for outside references and map key -> dataset path.

        Low-level on purpose: h5py's `visititems_links` builds a link object per link and
        `file[name]` a high-level object per dataset, ~100 us each, where the C-level visit
        and `h5o.open` below cost a few us. The visit only follows hard links, so it never
        opens another file.
        """
        fid = self._f.id
        links: list[tuple[bytes, int]] = []
        fid.links.visit(lambda name, info: links.append((name, info.type)), info=True)
        # A hard link that other links sit under is a group; only the rest (datasets, empty
        # groups, named types, second links to a group) need opening to learn their type.
        # Saves reading every group's object header a second time (an `h5o.visit`).
        parents = {raw.rpartition(b"/")[0] for raw, _ in links}
        problems: list[str] = []
        datasets: list[tuple[str, Any]] = []
        soft: list[tuple[bytes, bytes]] = []
        # Collect first and check after: an exception raised inside h5py's C-level visit
        # callback surfaces as a SystemError, not as itself.
        for raw, kind in links:
            name = _text(raw)
            if kind == h5l.TYPE_EXTERNAL:
                filename, target = (_text(v) for v in fid.links.get_val(raw))
                problems.append(f"external link {name!r} -> {filename}:{target}")
            elif kind == h5l.TYPE_SOFT:
                soft.append((raw, fid.links.get_val(raw)))
            elif kind != h5l.TYPE_HARD:
                problems.append(f"link {name!r} of unsupported type {kind}")
            elif raw not in parents:
                dsid = h5o.open(fid, raw)
                if not isinstance(dsid, h5d.DatasetID):
                    continue
                dcpl = dsid.get_create_plist()
                if dcpl.get_layout() == h5d.VIRTUAL:
                    problems.append(f"virtual dataset {name!r}")
                elif dcpl.get_external_count():
                    where = _attr_str(dcpl.get_external(0)[0])
                    problems.append(f"dataset {name!r} with external storage {where!r}")
                else:
                    # Dropped at once beyond the cap: an open dataset costs ~16 kB of memory
                    # that HDF5 keeps in its free lists once released.
                    datasets.append((name, dsid if len(datasets) < _HELD_HANDLES else None))
        if not problems:
            # Resolved only when nothing external is present, since resolving a soft link
            # that leads into an external link would open the other file. A resolvable soft
            # link's target is listed under its own hard path, so it adds no key.
            # Bytes, not text, so names that are not UTF-8 resolve too.
            for raw, target in soft:
                parent = self._f[raw.rpartition(b"/")[0] or b"/"]
                if parent.get(target) is None:  # pyright: ignore[reportAttributeAccessIssue]
                    problems.append(
                        f"soft link {_text(raw)!r} -> {_text(target)!r} resolves to nothing"
                    )
        if problems:
            raise GoldenUnsafeError(
                f"{self.path} refers to data outside itself ({'; '.join(problems[:5])}"
                f"{'; ...' if len(problems) > 5 else ''}); expected self-contained datasets. "
                f"Rewrite it with parity.store.write_goldens or {_REPIN_HINT}"
            )
        paths: dict[str, str] = {}
        for name, dsid in datasets:
            key = self._key_for(name)
            if key in paths:
                raise GoldenFormatError(
                    f"{self.path}: datasets {paths[key]!r} and {name!r} both map to key {key!r}; "
                    "rename one of them"
                )
            paths[key] = name
            if dsid is not None:
                self._dsids[key] = dsid
        return paths

    def _key_for(self, name: str) -> str:
        group, _, leaf = name.rpartition("/")
        if not self.is_parity_file:
            if leaf == VALUE_NAME:
                # Only parity names datasets so; its root attributes must have been damaged.
                raise GoldenFormatError(
                    f"{self.path}: dataset {name!r} is named as parity names arrays, but the "
                    f"file has none of parity's root attributes: the file is damaged. "
                    + _RESTORE_HINT
                )
            # A name that is not UTF-8 gets a printable key (its bytes escaped); the path
            # keeps the raw name, so the dataset still opens.
            return _printable(_escape_undecodable(name)).replace("/", ".")
        if leaf != VALUE_NAME or not group:
            raise GoldenFormatError(
                f"{self.path}: dataset {name!r} is not where parity puts arrays "
                f"('<key path>/{VALUE_NAME}'); the file was edited by hand. {_REPIN_HINT}"
            )
        return decode_path(group)

    def _read_index(self, text: str | None) -> dict[str, ArrayInfo] | None:
        """The root index (its JSON `text`) as key -> ArrayInfo, checked against the
        datasets `_scan` found; None for plain files and parity files written before the
        index existed."""
        if text is None:
            return None
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise GoldenFormatError(
                f"{self.path}: the {INDEX_ATTR} attribute is not JSON ({e}); {_REPIN_HINT}"
            ) from None
        if not isinstance(rows, list):
            raise GoldenFormatError(
                f"{self.path}: the {INDEX_ATTR} attribute is not a JSON list; {_REPIN_HINT}"
            )
        index: dict[str, ArrayInfo] = {}
        dtypes: dict[str, np.dtype] = {}
        for row in rows:
            entry = _index_row(row)
            if entry is None:
                raise GoldenFormatError(
                    f"{self.path}: malformed {INDEX_ATTR} entry {str(row)[:200]}; expected "
                    "key, path, dtype, shape, class, sha256 and order. " + _REPIN_HINT
                )
            key, path, dtype_name, shape, class_name, sha256, order = entry
            if key in index:
                raise GoldenFormatError(
                    f"{self.path}: the {INDEX_ATTR} lists {key!r} twice; {_REPIN_HINT}"
                )
            if self._paths.get(key, path) != path:
                raise GoldenCorruptError(
                    f"{self.path}: the {INDEX_ATTR} puts golden {key!r} at {path!r}, but the "
                    f"file holds it at {self._paths[key]!r}. {_RESTORE_HINT}"
                )
            dtype = dtypes.get(dtype_name)
            if dtype is None:
                dtype = dtypes[dtype_name] = _logical_dtype(dtype_name, path=self.path, key=key)
            index[key] = ArrayInfo(key, shape, dtype, class_name, sha256, order)
        if len(index) != len(self._paths) or index.keys() != self._paths.keys():
            unlisted = sorted(self._paths.keys() - index.keys())
            absent = sorted(index.keys() - self._paths.keys())
            raise GoldenCorruptError(
                f"{self.path}: the {INDEX_ATTR} disagrees with the datasets in the file "
                f"(not in the index: {unlisted[:5]}; in the index, no dataset: {absent[:5]}). "
                + _RESTORE_HINT
            )
        n_arrays = self._f.attrs.get("n_arrays")
        if n_arrays is not None and int(n_arrays) != len(index):  # pyright: ignore[reportArgumentType]
            raise GoldenCorruptError(
                f"{self.path}: n_arrays says {int(n_arrays)} arrays, the {INDEX_ATTR} lists "  # pyright: ignore[reportArgumentType]
                f"{len(index)}. {_RESTORE_HINT}"
            )
        return index

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
            + f"; if the key is new, {_REPIN_HINT}"
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
                f"{self.path}: golden {key!r} lacks its dtype or sha256 attribute; {_REPIN_HINT}"
            )
        return ArrayInfo(
            key=key,
            shape=shape,
            dtype=_logical_dtype(_attr_str(attrs["dtype"]), path=self.path, key=key),
            class_name=_attr_str(attrs.get("class", "")),
            sha256=_attr_str(attrs["sha256"]),
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
                    f"{info.dtype}; the widths differ. {_REPIN_HINT}"
                )
        found = _digest(stored)
        if found != info.sha256:
            raise GoldenCorruptError(
                f"{self.path}: golden {key!r} is corrupt: expected sha256 {info.sha256}, found "
                f"{found}. {_RESTORE_HINT}"
            )
        if mldtypes.is_ml_dtype(info.dtype):
            return _c_order(stored).view(info.dtype)
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
        want, want_type = _storage_type(info.dtype)
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
                + _RESTORE_HINT
            )
        return want

    def source(self, key: str) -> Source:
        """`key` as a `parity.judge.chunks.Source`: read block by block (one HDF5 hyperslab each),
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
            return _GoldenSource(self, self._index[key])
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
                return _PlainSource(self, info)
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
                    + _RESTORE_HINT
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
        return f"GoldenFile({str(self.path)!r}, {len(self)} arrays, {kind})"


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


class _PlainSource:
    """A numeric dataset of a plain HDF5 file read block by block, in the dataset's own
    dtype (as `GoldenFile[key]` loads it: no checksum, no logical dtype). The dataset is
    opened at the first read and closed when a pass ends, so that many sources (one per
    key of a group) hold no HDF5 handles until they are read."""

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

    def _dataset(self) -> h5d.DatasetID:
        """The dataset, opened at the first read of a pass (inside `_reading`)."""
        if self._dsid is None:
            self._dsid = self._gf._open_dataset(self._info.key)
            self._opened(self._dsid)
        return self._dsid

    def _opened(self, dsid: h5d.DatasetID) -> None:
        """Called once when the dataset is opened."""

    def read(self, block: Block) -> np.ndarray:
        out = np.empty(block.counts, self._info.dtype)
        with self._gf._reading("reading its data", self._info.key):
            _read_block(self._dataset(), block, self._size, out)
        return out.reshape(-1)

    def finish(self) -> None:
        self._dsid = None


class _GoldenSource(_PlainSource):
    """One golden array read block by block (as `_PlainSource`), in its logical dtype, its
    sha256 computed over a full pass and checked by `finish`."""

    def __init__(self, gf: GoldenFile, info: ArrayInfo):
        super().__init__(gf, info)
        self._stored = _storage_type(info.dtype)[0]
        self._hash: Any = None
        self._next = 0  # flat index the next in-order block must start at; -1: out of order

    def _opened(self, dsid: h5d.DatasetID) -> None:
        self._gf._check_indexed(self._info, dsid)

    def read(self, block: Block) -> np.ndarray:
        if block.start == 0:
            self._hash, self._next = hashlib.sha256(), 0
        stored = np.empty(block.counts, self._stored)
        with self._gf._reading("reading its data", self._info.key):
            _read_block(self._dataset(), block, self._size, stored)
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
                f"{self._info.sha256}, found {digest}. {_RESTORE_HINT}"
            )


def open_goldens(path: str | os.PathLike[str]) -> GoldenFile:
    """Open a golden file read-only.

    **Arguments:**

    - `path`: the HDF5 file (parity-written or plain).

    **Returns:** a `GoldenFile`; use it as a context manager.

    Raises `GoldenMissingError`, `GoldenFormatError` (not HDF5, truncated, malformed),
    `GoldenSchemaError` (written by a newer parity) or `GoldenUnsafeError` (external links,
    external storage, virtual datasets, dangling soft links).
    """
    return GoldenFile(path)
