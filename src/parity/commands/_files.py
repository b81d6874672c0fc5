"""HDF5 files as `parity diff` and `parity show` open them: every refusal of the store, and
every read error, becomes a `CLIError` naming the file's role (ACTUAL or GOLDEN)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from parity._results import CheckError
from parity.calibrated._bounds import golden_classes
from parity.commands._common import CLIError
from parity.store import GoldenFile, GoldenStoreError, open_goldens

__all__ = ["key_classes", "opened", "read_errors"]


@contextlib.contextmanager
def opened(path: str | Path, role: str) -> Iterator[GoldenFile]:
    """Open `path` read-only, turning every refusal into a `CLIError` that names `role`."""
    if role == "ACTUAL" and not Path(path).exists():
        # The store's own message suggests pinning, which is right for goldens only.
        raise CLIError(
            f"ACTUAL: {path} does not exist; expected the HDF5 file the changed code wrote "
            "(check the path, or run the producer first)"
        )
    try:
        gf = open_goldens(path)
    except GoldenStoreError as e:
        raise CLIError(f"{role}: {e}") from None
    except OSError as e:  # a directory, no permission, ...
        raise CLIError(f"{role}: {path} cannot be opened as HDF5: {e}") from None
    try:
        yield gf
    finally:
        gf.close()


@contextlib.contextmanager
def read_errors(gf: GoldenFile, key: str | None, role: str) -> Iterator[None]:
    """Store and HDF5 read errors of `gf[key]` (of any array of `gf` where `key` is None)
    become a `CLIError` naming `role`."""
    try:
        yield
    except GoldenStoreError as e:
        raise CLIError(f"{role}: {e}") from None
    except OSError as e:
        # A file truncated after its metadata opens fine and fails only when data is read.
        which = "an array" if key is None else f"array {key!r}"
        raise CLIError(
            f"{role}: {gf.path}: {which} cannot be read (truncated or damaged file: {e}); "
            "restore the file or produce it again"
        ) from None


def key_classes(
    gf: GoldenFile, *, class_name: str | None = None, overrides: Sequence[tuple[str, str]] = ()
) -> Callable[[str], str]:
    """key -> class name in `gf`, by `parity.calibrated._bounds.golden_classes` (the one
    precedence: `overrides`, then `class_name` for every key, then `gf`'s pinned map, then
    the class recorded with each array, then bitwise). A key a check would refuse (under
    `calibrated` with no spread recorded in `gf`) is a `CLIError` naming the calibrate
    command."""
    try:
        classes = golden_classes(gf, overrides=overrides, class_map=class_name)
    except CheckError as e:
        raise CLIError(f"GOLDEN: {e}") from None

    def resolve(key: str) -> str:
        try:
            classes.bound(key)  # as a check binds it: a calibrated key needs its recorded spread
        except CheckError as e:
            raise CLIError(f"GOLDEN: {e}") from None
        return classes.names(key)

    return resolve
