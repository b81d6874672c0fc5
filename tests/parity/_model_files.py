"""A model's source written to a file and imported, so that the origin sees it at its own
file and lines: the base's copy and the edited tree's copy of one small model file, the same
file name and function names, as a golden check sees the two sides."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from types import ModuleType

_names = itertools.count()


def model_module(folder: Path, text: str) -> ModuleType:
    """`text` as `folder/model.py` (the folder made here), imported under a name of its own."""
    folder.mkdir()
    path = folder / "model.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"_model_file_{next(_names)}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
