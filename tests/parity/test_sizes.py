"""The sizes a reader can hold, by the source's own syntax tree (issue 38): no module of
`src/parity` or `src/decomp` over 500 lines, no function (method, nested function) over 100,
declarative option tables aside."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGES = ("parity", "decomp")

MODULE_LINES = 500
FUNCTION_LINES = 100

#: Functions allowed past `FUNCTION_LINES` because they are declarative option tables: a
#: body that only declares options reads as a table, one option a row, and splitting it
#: would only scatter the rows. Each entry must be recognised as such by `_declarative`
#: (and still be over the limit), so the list cannot hold anything else.
OPTION_TABLES: set[tuple[str, str]] = set()

#: Calls that declare an option (argparse's, pytest's) or make the parser or group that
#: takes them; a call of a name ending in `_flag` or `_flags` is one of the shared option
#: declarations (`parity.commands._common.override_flag`).
_DECLARING = frozenset(
    {"add_argument", "addoption", "addini", "add_argument_group",
     "add_mutually_exclusive_group", "getgroup", "add_parser", "subparser"}
)  # fmt: skip


def _modules() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((SRC / package).rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(SRC).as_posix()


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the `def` (decorators aside) to the function's last line, docstring in."""
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def _declaring_call(node: ast.expr) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in _DECLARING or name.endswith(("_flag", "_flags"))


def _declarative(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the body, its docstring aside, is only option declarations: each statement a
    declaring call (`add_argument`, `addoption`, `addini`, a shared `*_flag(parser)`), or
    a plain name bound to one (`group = parser.getgroup(...)`, `p = subparser(...)`). Any
    other statement (an `if`, a loop, a computed value) makes it code, held to the limit."""
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    for stmt in body:
        if isinstance(stmt, ast.Expr) and _declaring_call(stmt.value):
            continue
        if (
            isinstance(stmt, ast.Assign)
            and all(isinstance(t, ast.Name) for t in stmt.targets)
            and _declaring_call(stmt.value)
        ):
            continue
        return False
    return bool(body)


def _long_functions() -> dict[tuple[str, str], tuple[int, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found = {}
    for path in _modules():
        for node in _functions(ast.parse(path.read_text(), str(path))):
            if _length(node) > FUNCTION_LINES:
                found[_name(path), node.name] = (_length(node), node)
    return found


def test_no_module_is_over_500_lines() -> None:
    long = {
        _name(p): n for p in _modules() if (n := len(p.read_text().splitlines())) > MODULE_LINES
    }
    assert long == {}, f"modules over {MODULE_LINES} lines (split them into a folder): {long}"


def test_no_function_is_over_100_lines_but_the_option_tables() -> None:
    found = _long_functions()
    over = {
        f"{path}:{node.lineno} {name} ({n} lines)"
        for (path, name), (n, node) in found.items()
        if (path, name) not in OPTION_TABLES
    }
    assert over == set(), f"functions over {FUNCTION_LINES} lines: {sorted(over)}"
    stale = (OPTION_TABLES) - set(found)
    assert stale == set(), f"no longer over {FUNCTION_LINES} lines: drop {sorted(stale)}"


def test_each_allowed_option_table_only_declares_options() -> None:
    for path, name in sorted(OPTION_TABLES):
        tree = ast.parse((SRC / path).read_text())
        (node,) = (f for f in _functions(tree) if f.name == name)
        assert _declarative(node), f"{path}:{name} does more than declare options"


def test_the_declarative_rule_tells_a_table_from_code() -> None:
    table, code = ast.parse(
        "def table(sub):\n"
        '    """Options."""\n'
        "    p = subparser(sub, 'x')\n"
        "    p.add_argument('--a', help=f'{1}')\n"
        "    override_flag(p)\n"
        "def code(sub):\n"
        "    p = subparser(sub, 'x')\n"
        "    if p:\n"
        "        p.add_argument('--a')\n"
    ).body
    assert isinstance(table, ast.FunctionDef) and isinstance(code, ast.FunctionDef)
    assert _declarative(table) and not _declarative(code)
