"""docs/design.md's module map names every module of src/parity, and none that does not
exist (issue 23)."""

from __future__ import annotations

import re
from pathlib import Path

import parity

ROOT = Path(__file__).resolve().parents[2]
SRC = Path(parity.__file__).resolve().parent


def test_the_design_module_map_is_the_tree() -> None:
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("`parity` module map", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    mapped = {name for row in rows for name in re.findall(r"`([\w/]+\.py)`", row.split(" | ")[0])}
    tree = {p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py")}
    assert sorted(tree - mapped) == [] and sorted(mapped - tree) == []
