"""Which modules a source file imports, read with `ast` (nothing is imported): the one reader
behind the import tests of parity (`tests/parity/test_import_boundaries.py`) and of decomp
(`tests/decomp/test_import_graph.py`)."""

from __future__ import annotations

import ast
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    """The dotted name of the module at `path`, `root` being the folder its top package
    sits in (`src`)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_imports(
    path: Path,
    root: Path,
    known: set[str],
    *,
    anywhere: bool = False,
    type_checking: bool = False,
    packages: bool = True,
) -> set[str]:
    """The modules of `known` that the module at `path` imports (itself left out).

    - `anywhere`: imports inside functions and classes count too (they run as soon as the
      function does); else only those at the module's top level.
    - `type_checking`: imports under `if TYPE_CHECKING:` count too (a reader sees them,
      though they never run).
    - `packages`: `from a.b import c` imports the package `a.b` as well as the submodule
      `a.b.c`; without it, only the submodule where `c` is one (a module's packages run
      before it whatever it imports, so they are no edge of their own).
    """
    name = module_name(path, root)
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    nodes = list(ast.walk(tree)) if anywhere else tree.body
    never_run = set()
    if not type_checking:
        never_run = {
            id(n)
            for node in nodes
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
            for n in ast.walk(node)
        }
    found: set[str] = set()
    for node in nodes:
        if id(node) in never_run:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            submodules = {f"{base}.{alias.name}" for alias in node.names} & known
            found |= (submodules | {base}) if packages else (submodules or {base})
    return {m for m in found if m in known and m != name}
