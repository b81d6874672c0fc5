"""The golden folder a check reads (`GoldenDir`): `<group>.h5` files opened lazily,
read-only, once each; a missing group names the repin command (`REPIN_HINT`)."""

from __future__ import annotations

import os
from pathlib import Path

from parity._results import CheckError
from parity.store import GoldenFile, GoldenMissingError, GoldenStoreError, open_goldens

__all__ = ["REPIN_HINT", "GoldenDir", "as_dir"]

#: How to pin a golden group; named in every "missing golden" message.
REPIN_HINT = "parity repin --base <SHA>"


class GoldenDir:
    """A folder of golden files, `<group>.h5`, opened lazily, read-only, once each.

    Safe under pytest-xdist: every process opens its own read-only handles.

    **Arguments:**

    - `path`: the folder.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._open: dict[str, GoldenFile] = {}

    def path_of(self, group: str) -> Path:
        """The file of `group`."""
        return self.path / f"{group}.h5"

    def groups(self) -> list[str]:
        """Every golden group in the folder, sorted."""
        return sorted(p.stem for p in self.path.glob("*.h5")) if self.path.is_dir() else []

    def open(self, group: str) -> GoldenFile:
        """The `GoldenFile` of `group`; raises `CheckError` naming the repin command if it
        is missing, or what is wrong if it cannot be used."""
        if group not in self._open:
            try:
                self._open[group] = open_goldens(self.path_of(group))
            except GoldenMissingError:
                raise CheckError(
                    f"no golden file for group {group!r} at {self.path_of(group)}: pin it with "
                    f"{REPIN_HINT}"
                ) from None
            except GoldenStoreError as e:
                raise CheckError(f"golden group {group!r} is unusable: {e}") from None
        return self._open[group]

    def close(self) -> None:
        """Close every file opened so far."""
        for f in self._open.values():
            f.close()
        self._open.clear()

    def __enter__(self) -> GoldenDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def as_dir(goldens: GoldenDir | str | os.PathLike[str]) -> GoldenDir:
    """`goldens` as a `GoldenDir` (a path opens one)."""
    return goldens if isinstance(goldens, GoldenDir) else GoldenDir(goldens)
