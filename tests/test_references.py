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
    assert _dangling("see `parity.store._staging` and `parity.check.check_group`") == []
    assert _dangling("see `decomp.spd` and `parity.check.no_such_name`") == [
        "decomp.spd",
        "parity.check.no_such_name",
    ]
    assert _dangling("see tests/parity/test_nowhere.py") == ["tests/parity/test_nowhere.py"]
    assert _dangling('producers = "tests/producers.py"') == []


def test_every_module_and_file_the_source_cites_exists() -> None:
    cited = [*SRC.rglob("*.py"), *SRC.rglob("README.md")]
    dangling = [
        f"{path.relative_to(ROOT)}: {ref}"
        for path in sorted(cited)
        for ref in _dangling(path.read_text())
    ]
    assert dangling == []


def test_every_subpackage_of_parity_says_what_it_owns_and_names_only_its_own_files() -> None:
    """Each folder of `parity` has a README (what it owns, where to start reading); a file
    it names in backquotes (`flow.py`) is one of that folder's."""
    for folder in sorted(p.parent for p in (SRC / "parity").glob("*/__init__.py")):
        readme = folder / "README.md"
        assert readme.is_file(), f"{folder.relative_to(ROOT)} has no README.md"
        text = readme.read_text()
        assert "**Owns**" in text, readme
        named = set(re.findall(r"`(\w+\.py)`", text))
        missing = [n for n in sorted(named) if not (folder / n).is_file()]
        assert not missing, f"{readme.relative_to(ROOT)} names files it does not hold: {missing}"
