"""The guide's install section, held to pyproject.toml and README.md (`install_problems`).

Install is not run: a fresh virtual environment would download jax, jaxlib and the rest
(hundreds of MB), which is not cheap enough for the test suite; the walk uses the
environment running the tool instead. The install block and the sentences about it are
checked instead: the same pip commands as README's, the distribution's name, its
requirements, the jax floor, the extras, and the `[tool.parity]` keys of the guide's
pyproject against `parity.machinery._config.KEYS`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from guide.parse import parse
from parity.machinery._config import KEYS

__all__ = ["install_problems"]


def _names(listing: str) -> set[str]:
    """'jax, jaxlib, numpy and ml_dtypes' -> {'jax', 'jaxlib', 'numpy', 'ml-dtypes'}."""
    parts = re.split(r",\s*|\s+and\s+", listing.strip())
    return {p.strip("` ").lower().replace("_", "-") for p in parts if p.strip()}


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ @]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _pip_commands(block: str) -> set[str]:
    """Each `pip install ...` of a bash block (comments included), `<placeholders>` as
    `<…>` and spacing collapsed."""
    found = re.findall(r"pip install [^#\n]*", block)
    return {re.sub(r"<[^>]*>", "<…>", " ".join(c.split())) for c in found}


def _bash_block_after(text: str, heading: str) -> str:
    """The first ```bash block after the line `heading`."""
    start = text.index(heading)
    fence = text.index("```bash\n", start) + len("```bash\n")
    return text[fence : text.index("```", fence)]


_REPOSITORY_EXTRAS = {"test", "dev"}  # this repository's own (pyproject.toml says why)


def install_problems(guide: str, readme: str, pyproject: Mapping[str, object]) -> list[str]:
    """What section 1 of the guide says about installing that pyproject.toml or README.md
    contradicts, one sentence each ([] when they agree)."""
    project = pyproject["project"]
    assert isinstance(project, dict)
    problems: list[str] = []
    blocks = parse(guide)
    install = [b for b in blocks if b.kind == "install"]
    if len(install) != 1:
        return [f"the guide needs one <!-- guide:install --> block, found {len(install)}"]
    ours = _pip_commands(install[0].text)
    theirs = _pip_commands(_bash_block_after(readme, "## In your own project"))
    if ours != theirs:
        problems.append(
            f"the guide installs with {sorted(ours)}, README.md's 'In your own project' "
            f"with {sorted(theirs)}"
        )
    name = re.search(r"the distribution is `([^`]+)`", guide)
    if name is None or name[1] != project["name"]:
        problems.append(
            f"the guide should name the distribution `{project['name']}` "
            "('the distribution is `...`')"
        )
    required = {_requirement_name(r) for r in project["dependencies"]}
    for where, text in (("the guide", guide), ("README.md", readme)):
        said = re.search(r"requires\s+((?:[\w`]+,\s+)*[\w`]+\s+and\s+[\w`]+)", text)
        if said is None or _names(said[1]) != required:
            problems.append(
                f"{where} should say the distribution requires {sorted(required)} "
                f"(pyproject.toml), says {said[1] if said else 'nothing'!r}"
            )
    jax_floor = next(
        r.split(">=", 1)[1] for r in project["dependencies"] if _requirement_name(r) == "jax"
    )
    if f"{jax_floor} or newer" not in guide:
        problems.append(f"the guide should say jax {jax_floor} or newer (pyproject.toml)")
    extras = set(project["optional-dependencies"]) - _REPOSITORY_EXTRAS
    said_extras = re.search(r"optional extras: ([^.]*)\.", guide)
    named = set(re.findall(r"`([^`]+)`", said_extras[1])) if said_extras else set()
    if named != extras:
        problems.append(
            f"the guide's optional extras are {sorted(named)}, pyproject's {sorted(extras)}"
        )
    table = [b for b in blocks if b.kind == "file" and b.arg == "pyproject.toml"]
    keys = set()
    if table:
        parity_table = table[0].text.split("[tool.parity]", 1)[-1]
        keys = set(re.findall(r"^#? ?(\w+) = ", parity_table, re.MULTILINE))
    if keys != set(KEYS):
        problems.append(
            f"the guide's [tool.parity] shows the keys {sorted(keys)}; parity knows {sorted(KEYS)}"
        )
    return problems
