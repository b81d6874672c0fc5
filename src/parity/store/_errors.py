"""What the golden store refuses, as exceptions with one printable line each.

**Errors.** Every failure to read is a `GoldenStoreError` whose message is one printable
line naming the file, the key where there is one, and what is wrong: HDF5 and h5py errors
from a damaged file (a failed checksum of HDF5's metadata, a truncated file, a structure
pointing nowhere, undecodable text) become `GoldenReadError`; names that are not UTF-8 are
shown escaped. A folder with a pending repin journal (`JOURNAL_NAME`, see
`parity.store._staging`) is refused with `GoldenBusyError`. `tests/parity/store/test_store_fuzz.py`
checks all this against random damage to the committed goldens.

"""

from __future__ import annotations

from parity._errors import ParityError

#: The refusals, every one re-exported by `parity.store`; `printable`, the helper that keeps
#: their text on one line, is the store's own and is imported by name.
__all__ = [
    "GoldenBusyError",
    "GoldenCorruptError",
    "GoldenFormatError",
    "GoldenKeyError",
    "GoldenMissingError",
    "GoldenReadError",
    "GoldenSchemaError",
    "GoldenStoreError",
    "GoldenUnsafeError",
    "UnsupportedDtypeError",
]


class GoldenStoreError(ParityError):
    """Base class of every refusal of the golden store.

    Its text is one printable line: names read from a damaged file may hold bytes that are
    not UTF-8 (kept as lone surrogates) or control characters, which are escaped
    (`\\udcff`, `\\n`), so the message prints to any UTF-8 stream.
    """

    def __str__(self) -> str:
        return printable(super().__str__())


class GoldenBusyError(GoldenStoreError):
    """The file's folder is mid-replace: a repin was interrupted between its first and last
    rename (see `parity.store._staging`)."""


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
        return printable(str(self.args[0])) if self.args else ""


class UnsupportedDtypeError(GoldenStoreError, TypeError):
    """An array's dtype cannot be stored exactly (object, string, datetime, ...)."""


def printable(text: str) -> str:
    """`text` with every character that is not printable (control characters, lone
    surrogates from undecodable names) written as its Python escape: one line, valid UTF-8."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
