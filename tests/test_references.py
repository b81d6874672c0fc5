"""What the code cites exists (issue 29): every module named in backquotes in `src/` (a
`parity.x.y` or `decomp.x.y`, and the first name after the module, where one follows) and
every repository file named by path (`tests/...py`, `docs/...md`, ...). A module renamed or a
test file merged leaves no reference behind that sends a reader nowhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def _module_file(dotted: str) -> Path | None:
    """The file that names `dotted`'s attributes: a package's stub, where it has one (`parity`
    lists its public names in `__init__.pyi`), else its module or `__init__.py`."""
    path = SRC.joinpath(*dotted.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.pyi", path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _dangling(text: str) -> list[str]:
    """The references in `text` that name nothing the repository holds."""
    out = []
    for m in re.finditer(r"`((?:parity|decomp)(?:\.\w+)+)", text):
        parts = m.group(1).split(".")
        found, n = None, len(parts)
        while n and found is None:
            found = _module_file(".".join(parts[:n]))
            n -= 0 if found else 1
        rest = parts[n:]
        if found is None or (
            rest and not re.search(rf"\b{re.escape(rest[0])}\b", found.read_text())
        ):
            out.append(m.group(1))
    # A path given as an example value (`producers = "tests/producers.py"`) is not a citation.
    for m in re.finditer(
        r'(?<!= ")\b((?:tests|docs|tools|goldens)/[\w/.-]*\w\.(?:py|md|h5))', text
    ):
        if not (ROOT / m.group(1)).exists():
            out.append(m.group(1))
    return out


def test_the_checker_finds_a_dangling_module_attribute_and_path() -> None:
    assert _dangling("see `parity.store.staging` and `parity.check.check_group`") == []
    assert _dangling("see `decomp.spd` and `parity.check.no_such_name`") == [
        "decomp.spd",
        "parity.check.no_such_name",
    ]
    assert _dangling("see tests/parity/test_nowhere.py") == ["tests/parity/test_nowhere.py"]
    assert _dangling('producers = "tests/producers.py"') == []


def test_every_module_and_file_the_source_cites_exists() -> None:
    dangling = [
        f"{path.relative_to(ROOT)}: {ref}"
        for path in sorted(SRC.rglob("*.py"))
        for ref in _dangling(path.read_text())
    ]
    assert dangling == []
