"""The golden file's format: where each array sits, its attributes, the checksums.

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
attributes, serialised canonically (`meta_digest`). With the per-array sha256 of the data
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


**Determinism.** The same inputs give the same bytes: no object timestamps, keys written
in sorted order, a fixed HDF5 format range (`libver=("v110", "v110")`), contiguous storage
without filters.

"""

from __future__ import annotations

import hashlib
import json

__all__ = [
    "INDEX_ATTR",
    "JOURNAL_NAME",
    "LIBVER",
    "META_ATTR",
    "PARITY_ATTRS",
    "REPIN_HINT",
    "RESTORE_HINT",
    "ROOT_ATTRS",
    "SCHEMA_VERSION",
    "VALUE_NAME",
    "meta_digest",
]

#: Version of the layout above. Readers refuse files with a newer version. 2 added
#: `meta_sha256`; files of version 1 (no metadata checksum) are still read.
SCHEMA_VERSION = 2

#: Name of the dataset at the end of each key's group path.
VALUE_NAME = "%value"

#: Name of the root attribute holding the index of every array (see the module docstring).
INDEX_ATTR = "index"

#: A file of this name beside a golden file means its folder is mid-replace (see
#: `parity.store._staging`): reading is refused until the replace is finished.
JOURNAL_NAME = ".parity-repin.journal"

#: Name of the root attribute holding the checksum of every other root attribute.
META_ATTR = "meta_sha256"

# The root attributes of each schema version, exactly: anything missing or added means the
# file was damaged (a flipped byte in an attribute's name) or edited by hand.
ROOT_ATTRS = {
    1: frozenset({"schema_version", "class_map", "provenance", "n_arrays", INDEX_ATTR}),
    2: frozenset({"schema_version", "class_map", "provenance", "n_arrays", INDEX_ATTR, META_ATTR}),
}
# Any one of these at the root makes a file a parity file (index-less version-1 files lack
# some), so that a damaged name cannot turn a parity file into an unchecked plain one.
PARITY_ATTRS = frozenset().union(*ROOT_ATTRS.values())

# Fixed so the file format (and hence its bytes) does not move with the HDF5 release;
# v110 also allows dense attribute storage, so a large provenance or class map still fits.
LIBVER = ("v110", "v110")

REPIN_HINT = "repin with `parity repin --base SHA`"
RESTORE_HINT = f"Restore the file from version control or {REPIN_HINT}"


def meta_digest(
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
