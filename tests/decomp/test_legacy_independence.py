"""The legacy references are independent of the code they check:

- no module of `decomp.legacy` imports a private name of another `decomp` module, imports a
  private module, or reaches a private attribute (of a module or of an object such as a
  model instance);
- what `decomp.legacy` imports from the rest of `decomp` is exactly the shared list below
  (`SHARED`), the one `decomp.legacy`'s docstring gives with the reason for each: a
  refactored form (`*_by_kind`, `decomp.losses`, `decomp.train`, ...) creeping into a
  reference fails here, naming the import;
- no module of `decomp` outside `decomp.legacy` imports it: the legacy package holds what
  only the references (and the tests) use.

Otherwise a change inside the refactored code would change its reference too, and the live
differential would compare the new code with itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import decomp.legacy

LEGACY = Path(decomp.legacy.__file__).parent
DECOMP = LEGACY.parent

#: `{module: names}` that `decomp.legacy` may import from the rest of `decomp` (see the
#: reasons in `decomp.legacy`'s docstring).
SHARED = {
    "decomp": {"nn"},
    "decomp.taps": {"parse_wanted"},
    "decomp.targets.glu_transformer": {"GLUConfig", "GLUTransformer"},
    "decomp.ci_function": {
        "CIBlocks",
        "CIFunction",
        "ci_lower",
        "ci_pre_activations_by_position",
        "ci_upper",
    },
    "decomp.config": {"CIConfig", "Remat", "SPDConfig"},
    "decomp.components": {"Components", "SiteComponents", "SiteMask", "weight_delta"},
    "decomp.model": {"DecomposedModel"},
    "decomp.stacked": {"SiteLayout"},
    "decomp.masks": {
        "constant_masks",
        "mask_from_draw",
        "recon_chunks",
        "source_masks",
        "uniform_k_routing",
    },
    "decomp.mesh": {"make_dp_mesh", "replicate", "replicated"},
    "decomp.jitted": {"JittedStep", "jit_step"},
}
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


def _imports(source: str) -> list[tuple[int, str, str]]:
    """`(line, module, name)` for every `from decomp... import name` and `import decomp...`
    (name empty) in `source`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, "") for a in node.names]
    return [(line, m, n) for line, m, n in out if m.split(".")[0] == "decomp"]


def test_legacy_modules_share_only_the_listed_names():
    found = []
    for f in sorted(LEGACY.glob("*.py")):
        for line, mod, name in _imports(f.read_text()):
            if mod == "decomp.legacy" or mod.startswith("decomp.legacy."):
                continue
            if name not in SHARED.get(mod, set()):
                found.append(f"{f.name}:{line}: {mod} {name or '(the module)'}")
    assert not found, (
        "decomp.legacy imports refactored code beyond the shared list (tests/decomp/"
        "test_legacy_independence.py SHARED, decomp.legacy's docstring); copy it into the "
        "legacy module, or share it on purpose and say why:\n  " + "\n  ".join(found)
    )


def test_the_refactored_package_does_not_import_legacy():
    found = [
        f"{f.relative_to(DECOMP)}:{line}: {mod}"
        for f in sorted(DECOMP.rglob("*.py"))
        if LEGACY not in f.parents
        for line, mod, name in _imports(f.read_text())
        if mod == "decomp.legacy" or mod.startswith("decomp.legacy.") or name == "legacy"
    ]
    assert not found, "decomp imports decomp.legacy:\n  " + "\n  ".join(found)
