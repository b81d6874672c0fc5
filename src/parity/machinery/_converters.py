"""The producers' `CONVERT` (issue 73) across the producer process's edge: a producers file
may map a group to the function that turns its goldens into the tree's layout (the
project's own checkpoint converter, `CONVERT = {"train": lambda g: {**g, "params":
fuse_qkv(g["params"])}}`). The function lives in the producer process; what crosses is its
`parity.judge._converting.Conversion`, probed there on the goldens' layout the harness
sends (`write_layouts`: each group's golden keys and shapes), never on their values.

In the producer process, `write_conversions` probes each group's converter and saves
`OUT/convert/<group>.npz`, or why it cannot be used in `OUT/convert/<group>.txt`; in the
harness, `read_conversions` reads them back. Nothing here imports jax.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from parity.judge._converting import Conversion, ConvertError, probe

__all__ = [
    "CONVERT_DIR",
    "LAYOUT_FILE",
    "read_conversions",
    "write_conversions",
    "write_layouts",
]

#: The folder of a run's output that holds what each group's converter does.
CONVERT_DIR = "convert"
#: What the harness writes for the run: group -> `[[golden key, shape], ...]`.
LAYOUT_FILE = "goldens-layout.json"


def write_layouts(folder: Path, layouts: Mapping[str, Mapping[str, Sequence[int]]]) -> Path:
    """`layouts` (group -> golden key -> shape, in the goldens' order) written for a run,
    in `folder`: the file its `--goldens-layout` names."""
    path = folder / LAYOUT_FILE
    doc = {g: [[k, list(s)] for k, s in keys.items()] for g, keys in layouts.items()}
    path.write_text(json.dumps(doc))
    return path


def _converters(module: Any) -> dict[str, Any]:
    """The module's `CONVERT` (none where it defines none); `ConvertError` where it is not
    a mapping of group names to functions."""
    declared = getattr(module, "CONVERT", None)
    if declared is None:
        return {}
    if not isinstance(declared, Mapping) or not all(
        isinstance(g, str) and callable(f) for g, f in declared.items()
    ):
        raise ConvertError(
            "CONVERT must map group names to functions (group -> a function of the group's "
            f"goldens, as nested dicts of arrays), not {type(declared).__name__}"
        )
    return dict(declared)


def write_conversions(module: Any, layout: Path | None, out: Path, groups: Sequence[str]) -> None:
    """In the producer process: each group of `groups` that the module's `CONVERT` names and
    `layout` lays out, its converter probed (`parity.judge._converting.probe`), saved in
    `out/convert/`. Raises `ConvertError` where `CONVERT` is malformed or names a group
    `groups`' producers lack (a typo is refused, not ignored)."""
    converters = _converters(module)
    unknown = sorted(set(converters) - set(getattr(module, "GROUPS", {})))
    if unknown:
        raise ConvertError(f"CONVERT names {unknown} that GROUPS does not define")
    if not converters or layout is None:
        return
    doc = json.loads(layout.read_text())
    folder = out / CONVERT_DIR
    folder.mkdir(exist_ok=True)
    for group in groups:
        if group not in converters or group not in doc:
            continue
        shapes = {str(k): tuple(int(d) for d in s) for k, s in doc[group]}
        try:
            conversion = probe(converters[group], shapes)
        except ConvertError as e:
            (folder / f"{group}.txt").write_text(str(e))
            continue
        np.savez(folder / f"{group}.npz", **conversion.to_arrays())  # pyright: ignore[reportArgumentType]


def read_conversions(out: Path) -> dict[str, Conversion | ConvertError]:
    """In the harness: what a run saved in `out/convert/`: group -> its `Conversion`, or
    the `ConvertError` saying why its converter cannot be used."""
    folder = out / CONVERT_DIR
    found: dict[str, Conversion | ConvertError] = {}
    if not folder.is_dir():
        return found
    for path in sorted(folder.glob("*.npz")):
        with np.load(path) as data:
            found[path.stem] = Conversion.from_arrays(dict(data))
    for path in sorted(folder.glob("*.txt")):
        found[path.stem] = ConvertError(path.read_text())
    return found
