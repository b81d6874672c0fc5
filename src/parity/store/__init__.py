"""The golden store: pinned arrays in one HDF5 file, written atomically, read with checks.

`format` (where each array sits in the file, its attributes, the checksums), `keys` (golden
keys to HDF5 group paths), `dtypes` (dtypes as stored), `errors` (every refusal, one
printable line each), `writer` (atomic, byte-reproducible writes), `header` (the root
attributes and the index, read and checked), `reader` (`GoldenFile`: read-only, checked on
open and on every load), `source` (an array read block by block), `staging` (replacing a
folder's golden files all at once) and `provenance` (what produced a golden, and the drift
policy). It may import numpy, h5py and the layers below it, `parity.judge` and
`parity.xla_env` (the XLA flag names); never jax or decomp, nor its sibling `parity.report`
or a layer above it (the core, `parity.run`, the faces):
`tests/parity/test_import_boundaries.py` holds it to that. This package re-exports the
store's public names: `from parity.store import open_goldens` is the way in. The reading
side loads with the package; `write_goldens` loads the writer (and the provenance it
records) on first use, so that a command that only reads files (`parity diff`, `parity
show`) loads neither (`tests/parity/test_cli.py`).
"""

from typing import TYPE_CHECKING, Any

from parity.store import errors
from parity.store.errors import *  # noqa: F403 (every refusal: the names of errors.__all__)
from parity.store.format import INDEX_ATTR, JOURNAL_NAME, META_ATTR, SCHEMA_VERSION, VALUE_NAME
from parity.store.header import ArrayInfo
from parity.store.keys import decode_path, encode_key
from parity.store.reader import GoldenFile, open_goldens

if TYPE_CHECKING:
    from parity.store.writer import write_goldens

__all__ = [
    "INDEX_ATTR",
    "JOURNAL_NAME",
    "META_ATTR",
    "SCHEMA_VERSION",
    "VALUE_NAME",
    "ArrayInfo",
    "GoldenFile",
    "decode_path",
    "encode_key",
    "open_goldens",
    "write_goldens",
]
__all__ += errors.__all__


def __getattr__(name: str) -> Any:
    """`write_goldens`, its module imported on first use (PEP 562)."""
    if name != "write_goldens":
        raise AttributeError(f"module 'parity.store' has no attribute {name!r}")
    from parity.store import writer

    globals()[name] = writer.write_goldens
    return writer.write_goldens
