# ruff: noqa: I001
"""`parity.store`'s public names, written once: type checkers read this stub in place of
`__init__.py`, which hands it to `lazy_loader.attach_stub` (as `parity`'s own
`__init__.pyi`), so each name loads its module on first use."""

# reading and writing golden files
from ._reader import GoldenFile as GoldenFile, open_goldens as open_goldens
from ._writer import write_goldens as write_goldens
from ._header import ArrayInfo as ArrayInfo
from ._provenance_record import Provenance as Provenance
from ._keys import decode_path as decode_path, encode_key as encode_key

# the file's layout
from ._format import (
    INDEX_ATTR as INDEX_ATTR,
    JOURNAL_NAME as JOURNAL_NAME,
    META_ATTR as META_ATTR,
    SCHEMA_VERSION as SCHEMA_VERSION,
    VALUE_NAME as VALUE_NAME,
)

# every refusal, one printable line each
from ._errors import (
    GoldenBusyError as GoldenBusyError,
    GoldenCorruptError as GoldenCorruptError,
    GoldenFormatError as GoldenFormatError,
    GoldenKeyError as GoldenKeyError,
    GoldenMissingError as GoldenMissingError,
    GoldenReadError as GoldenReadError,
    GoldenSchemaError as GoldenSchemaError,
    GoldenStoreError as GoldenStoreError,
    GoldenUnsafeError as GoldenUnsafeError,
    UnsupportedDtypeError as UnsupportedDtypeError,
)

__all__: list[str]
