"""The golden store: pinned arrays in one HDF5 file, written atomically, read with checks.

`format` (where each array sits in the file, its attributes, the checksums), `keys` (golden
keys to HDF5 group paths), `dtypes` (dtypes as stored), `errors` (every refusal, one
printable line each), `writer` (atomic, byte-reproducible writes), `header` (the root
attributes and the index, read and checked), `reader` (`GoldenFile`: read-only, checked on
open and on every load), `source` (an array read block by block), `staging` (replacing a
folder's golden files all at once), `provenance_record` (`Provenance`: what produced a
golden, as a typed value, and its JSON) and `provenance` (collecting it). It may import
numpy, h5py and the layers below it, `parity.judge` and `parity._xla_env` (the XLA flag
names); never jax or decomp, nor its sibling `parity.report` or a layer above it (the
core, `parity.run`, the faces): `tests/parity/test_import_boundaries.py` holds it to that.
This package re-exports the store's public names, listed once in `__init__.pyi` beside
this file (read by `lazy_loader.attach_stub`, as `parity`'s are): `from parity.store
import open_goldens` is the way in. Each name loads its module on first use, so that a
command that only reads files (`parity diff`, `parity show`) loads neither the writer nor
what collects a provenance (`tests/parity/test_cli.py`).
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
