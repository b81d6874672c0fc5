"""The legacy references are independent of the code they check: no module of
`decomp.legacy` imports a private name of another `decomp` module, imports a private module,
or reaches a private attribute (of a module or of an object such as a model instance).

Otherwise a change inside the refactored code would change its reference too, and the live
differential would compare the new code with itself. Shared public primitives are listed,
with the reason, in `decomp.legacy`'s docstring.
"""

from __future__ import annotations

import ast
from pathlib import Path

import decomp.legacy

LEGACY = Path(decomp.legacy.__file__).parent
#: NamedTuple's public API happens to start with an underscore.
ALLOWED_ATTRS = {"_replace", "_asdict", "_fields", "_make"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def violations(source: str, filename: str) -> list[str]:
    """Every private reach into `decomp` in `source`, as `file:line: what`."""
    tree = ast.parse(source, filename)
    found: list[str] = []

    def add(node: ast.AST, what: str) -> None:
        found.append(f"{filename}:{getattr(node, 'lineno', '?')}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mod = node.module
            if mod.split(".")[0] != "decomp":
                continue
            names = ", ".join(a.name for a in node.names)
            if any(_private(part) for part in mod.split(".")):
                add(node, f"from {mod} import {names} (a private module)")
            for alias in node.names:
                if _private(alias.name):
                    add(node, f"from {mod} import {alias.name} (a private name)")
        elif isinstance(node, ast.ImportFrom) and node.level:
            add(node, f"relative import from {'.' * node.level}{node.module or ''}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "decomp" and any(_private(p) for p in parts):
                    add(node, f"import {alias.name} (a private module)")
        elif isinstance(node, ast.Attribute):
            if _private(node.attr) and node.attr not in ALLOWED_ATTRS:
                add(node, f"attribute access .{node.attr} ({ast.unparse(node)})")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
        ):
            add(node, f"{node.func.id}(..., {node.args[1].value!r})")
    return found


def test_legacy_modules_reach_no_private_name_of_the_new_code():
    files = sorted(LEGACY.glob("*.py"))
    assert files, f"no legacy modules found under {LEGACY}"
    found = [v for f in files for v in violations(f.read_text(), str(f))]
    assert not found, (
        "decomp.legacy must be independent of the code it checks; copy the helper into the "
        "legacy module instead of importing it:\n  " + "\n  ".join(found)
    )


def test_the_rule_catches_each_form_of_private_reach():
    src = "\n".join(
        [
            "from decomp.sources import _draw_site",
            "from decomp.targets._hf import load_state_dict",
            "import decomp.targets._hf",
            "import decomp.ci_function as cf",
            "x = cf._init_chunk",
            "y = model._logits(h)",
            "z = getattr(model, '_logits')",
            "from .ci_init import init_ci_function",
            "from decomp.nn import rms_norm",
            "t = tap._replace(layer=0)",
        ]
    )
    found = violations(src, "legacy/example.py")
    lines = sorted(int(v.split(":")[1]) for v in found)
    assert lines == [1, 2, 3, 5, 6, 7, 8], found
    assert found[0] == "legacy/example.py:1: from decomp.sources import _draw_site (a private name)"
