"""The way a reader follows a flow of parity from one function, call by call: each function
of parity it reaches, in the order a reader meets them (depth first, in source order, each
function once), with the module and the floor it stands on.

Two ways are walked. From `module:function`, every call the function makes; from
`module:function@name`, only the calls that take the value `name` (a parameter or a local
of that function) or a value computed from it, then in each function reached the parameters
it was bound to: the way the data of a flow takes (`parity.commands._check:run@args`, the
way of `parity check`'s arguments).

A floor is a tier of the layers the import test holds (`tests/parity/_layers.py`), lowest
first. The functions of the rooms below the check's floor (the calibrated class, the
results, the origin, the store, the judge, the environment) are stops whose own calls are
not followed (`--lowest`). The figures:

- **stops**: the module visits, calls that stay in the same module being one visit (and
  the functions, each counted once);
- a **climb**: the next stop stands on a higher floor than the last one (the reader went
  down into a helper and must come back up to read on);
- a **return**: the next stop is in a module the reader had already left (stops less
  modules).

Calls are resolved from the source alone (`ast`, nothing imported): names a module defines
or imports from parity, `module.name`, `Class.method`, `self.method`, and `x.method` where
`x` is annotated with, built as, or returned as a parity class. A call of a protocol's
method (a `BaselineSource`, a `Settler`) goes to that method of the classes built on the
way so far, as a reader follows the value a face built and handed down. A call through a
value the reader cannot name from the source (a callback) is not followed.

    python tools/call_path.py parity.commands._check:run@args        # the figures
    python tools/call_path.py parity.run._produced:check_produced@produced -v  # every stop
"""

from __future__ import annotations

import argparse
import ast
import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "parity"))

from _layers import floor_of  # noqa: E402  # pyright: ignore[reportMissingImports]

Target = tuple[str, str]  # (module, qualified name in it)

#: The lowest unit whose functions' calls are followed: the check's own floor.
LOWEST = "parity.check"


@dataclass
class _Module:
    name: str
    package: str
    defs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef] = field(
        default_factory=dict
    )
    imported: dict[str, str] = field(default_factory=dict)  # local name -> dotted target


def _absolute(module: _Module, node: ast.ImportFrom) -> str:
    base = node.module or ""
    if node.level:
        anchor = module.package.rsplit(".", node.level - 1)[0] if node.level > 1 else module.package
        base = f"{anchor}.{base}" if base else anchor
    return base


class Index:
    """Every module of one package, read once: what each defines and imports."""

    def __init__(self, src: Path, package: str = "parity"):
        self.modules: dict[str, _Module] = {}
        for path in sorted((src / package).rglob("*.py")):
            parts = path.relative_to(src).with_suffix("").parts
            is_init = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_init else parts)
            module = _Module(name, name if is_init else name.rpartition(".")[0])
            tree = ast.parse(path.read_text(), str(path))
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    module.defs[node.name] = node
            for node in ast.walk(tree):  # imports inside functions are the module's too
                if isinstance(node, ast.ImportFrom):
                    base = _absolute(module, node)
                    for alias in node.names:
                        module.imported[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.asname:
                            module.imported[alias.asname] = alias.name
            self.modules[name] = module

    def resolve(self, dotted: str) -> Target | str | None:
        """A dotted name as a definition (module, qualname), a module's name, or None."""
        if dotted in self.modules:
            return dotted
        parent, _, last = dotted.rpartition(".")
        if parent in self.modules:
            module = self.modules[parent]
            if last in module.defs:
                return (parent, last)
            if last in module.imported:  # a re-export
                return self.resolve(module.imported[last])
            return None
        owner = self.resolve(parent) if parent else None
        if isinstance(owner, tuple) and isinstance(self.node(owner), ast.ClassDef):
            return self.member(owner, last)
        return None

    def node(self, target: Target) -> ast.AST | None:
        module, qualname = target
        head, _, rest = qualname.partition(".")
        found: ast.AST | None = self.modules[module].defs.get(head)
        if rest and isinstance(found, ast.ClassDef):
            found = next(
                (n for n in found.body if isinstance(n, ast.FunctionDef) and n.name == rest), None
            )
        return found

    def member(self, cls: Target, name: str) -> Target | None:
        target = (cls[0], f"{cls[1]}.{name}")
        return target if self.node(target) is not None else None


def _class_named(index: Index, module: _Module, annotation: ast.expr | None) -> Target | None:
    """The parity class an annotation names (`C`, `C | None`, `"C"`), if one."""
    if annotation is None:
        return None
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(annotation, ast.BinOp):
        return _class_named(index, module, annotation.left) or _class_named(
            index, module, annotation.right
        )
    found = _lookup(index, module, annotation, {})
    is_class = isinstance(found, tuple) and isinstance(index.node(found), ast.ClassDef)
    return found if is_class and isinstance(found, tuple) else None


def _lookup(
    index: Index, module: _Module, expr: ast.expr, types: dict[str, Target]
) -> Target | str | None:
    """What an expression names: a definition, a module, or (for a typed local) a class."""
    if isinstance(expr, ast.Name):
        if expr.id in types:
            return types[expr.id]
        if expr.id in module.defs:
            return (module.name, expr.id)
        if expr.id in module.imported:
            return index.resolve(module.imported[expr.id])
        return None
    if isinstance(expr, ast.Attribute):
        owner = _lookup(index, module, expr.value, types)
        if isinstance(owner, str):
            return index.resolve(f"{owner}.{expr.attr}")
        if isinstance(owner, tuple) and isinstance(index.node(owner), ast.ClassDef):
            return index.member(owner, expr.attr)
    return None


def _returned_class(index: Index, target: Target) -> Target | None:
    node = index.node(target)
    module = index.modules[target[0]]
    if isinstance(node, ast.ClassDef):
        return target
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if (
            target[1].count(".")
            and node.returns is not None
            and ast.unparse(node.returns)
            in (
                "Self",
                f'"{target[1].split(".")[0]}"',
                target[1].split(".")[0],
            )
        ):
            return (target[0], target[1].split(".")[0])
        return _class_named(index, module, node.returns)
    return None


def _local_types(
    index: Index, module: _Module, fn: ast.FunctionDef | ast.AsyncFunctionDef, owner: str | None
) -> dict[str, Target]:
    """The parity class of each local the function's source names one for."""
    types: dict[str, Target] = {}
    if owner is not None:
        types["self"] = types["cls"] = (module.name, owner)
    args = fn.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
        cls = _class_named(index, module, arg.annotation)
        if cls is not None:
            types[arg.arg] = cls
    for node in ast.walk(fn):
        value, names = None, []
        if isinstance(node, ast.Assign):
            value, names = node.value, [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            cls = _class_named(index, module, node.annotation)
            if cls is not None:
                types[node.target.id] = cls
                continue
            value, names = node.value, [node.target.id]
        elif isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
            value, names = node.context_expr, [node.optional_vars.id]
        if isinstance(value, ast.Call) and names:
            called = _lookup(index, module, value.func, types)
            cls = _returned_class(index, called) if isinstance(called, tuple) else None
            if cls is not None:
                for name in names:
                    types[name] = cls
    return types


@dataclass(frozen=True)
class Stop:
    """One function of the way: where it is defined and the floor its module stands on."""

    module: str
    name: str
    depth: int
    floor: int


def _calls_of(node: ast.AST) -> list[ast.Call]:
    """The calls in `node` in the order they run: a call's arguments (calls among them)
    before the call itself."""
    found: list[ast.Call] = []

    def visit(n: ast.AST) -> None:
        for child in ast.iter_child_nodes(n):
            visit(child)
        if isinstance(n, ast.Call):
            found.append(n)

    visit(node)
    return found


def _in_evaluation_order(node: ast.AST) -> list[ast.Call]:
    """The calls in `node`'s body in the order they run, statement by statement."""
    return [call for statement in getattr(node, "body", []) for call in _calls_of(statement)]


def _called(index: Index, target: Target) -> list[Target]:
    """The parity functions `target`'s body calls, in source order; a class called is
    itself in the list (`walk` follows its `__init__` or `__post_init__`)."""
    node = index.node(target)
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    module = index.modules[target[0]]
    owner = target[1].rpartition(".")[0] or None
    types = _local_types(index, module, node, owner)
    out: list[Target] = []
    for call in _in_evaluation_order(node):
        found = _lookup(index, module, call.func, types)
        if isinstance(found, tuple) and found != target:
            out.append(found)
    return out


def _is_protocol(index: Index, cls: Target) -> bool:
    node = index.node(cls)
    return isinstance(node, ast.ClassDef) and any(
        ast.unparse(b).split("[")[0].endswith("Protocol") for b in node.bases
    )


def _resolved(index: Index, callee: Target, built: list[Target]) -> list[Target]:
    """What a call to `callee` runs: a class's `__init__` or `__post_init__` (none where it
    defines neither); a protocol's method, the same method of each class built on the way
    so far that has it (the protocol's own where none), as a reader follows the value a
    face built and handed down; else `callee`."""
    if isinstance(index.node(callee), ast.ClassDef):
        if callee not in built:
            built.append(callee)
        init = index.member(callee, "__init__") or index.member(callee, "__post_init__")
        return [init] if init is not None else []
    owner, _, method = callee[1].rpartition(".")
    if owner and _is_protocol(index, (callee[0], owner)):
        done = [index.member(c, method) for c in built if not _is_protocol(index, c)]
        return [t for t in done if t is not None] or [callee]
    return [callee]


def walk(
    index: Index, entry: Target, *, floor: Callable[[str], int] = floor_of, lowest: int = 0
) -> list[Stop]:
    """The stops from `entry`, depth first in source order, each function once; `floor`
    says the floor of a module; a function on a floor below `lowest` is a stop whose own
    calls are not followed."""
    seen: set[Target] = set()
    stops: list[Stop] = []
    built: list[Target] = []

    def visit(target: Target, depth: int) -> None:
        seen.add(target)
        stops.append(Stop(target[0], target[1], depth, floor(target[0])))
        if floor(target[0]) < lowest:
            return
        for called in _called(index, target):
            for callee in _resolved(index, called, built):
                if callee not in seen:
                    visit(callee, depth + 1)

    visit(entry, 0)
    return stops


def _loads(expr: ast.AST | None) -> set[str]:
    """The names an expression reads (in its lambdas and comprehensions too)."""
    if expr is None:
        return set()
    return {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}


def _stored(target: ast.AST) -> set[str]:
    """The local a statement writes: `x`, `x, y`, `x[k]`, `x.field` (the last two change x)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_stored(e) for e in target.elts))
    if isinstance(target, (ast.Subscript, ast.Attribute, ast.Starred)):
        return _stored(target.value)
    return set()


def _bound(
    fn: ast.FunctionDef | ast.AsyncFunctionDef,
    call: ast.Call,
    held: set[str],
    *,
    skip_self: bool,
    receiver_held: bool,
) -> set[str]:
    """The parameters of `fn` that a call binds to a value derived from the data."""
    args = fn.args
    positional = [a.arg for a in [*args.posonlyargs, *args.args]]
    out: set[str] = set()
    if skip_self and positional:
        if receiver_held:
            out.add(positional[0])
        positional = positional[1:]
    named = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    for i, arg in enumerate(call.args):
        if not _loads(arg) & held:
            continue
        if isinstance(arg, ast.Starred):
            out.update(positional[i:])
            out.update([args.vararg.arg] if args.vararg else [])
        elif i < len(positional):
            out.add(positional[i])
        elif args.vararg is not None:
            out.add(args.vararg.arg)
    for keyword in call.keywords:
        if not _loads(keyword.value) & held:
            continue
        if keyword.arg is None:  # **mapping: any parameter may be bound from it
            out.update(named | ({args.kwarg.arg} if args.kwarg else set()))
        elif keyword.arg in named:
            out.add(keyword.arg)
        elif args.kwarg is not None:
            out.add(args.kwarg.arg)
    return out


def walk_data(
    index: Index,
    entry: Target,
    name: str,
    *,
    floor: Callable[[str], int] = floor_of,
    lowest: int = 0,
) -> list[Stop]:
    """The stops the data named `name` in `entry` (a parameter or a local) reaches: the parity
    functions called with it, or with a value computed from it, then in each the parameters
    it was bound to, depth first in source order, each function once. A value is derived
    from the data where an assignment, a `for`, a comprehension or a `with` computes it from
    a derived value, or a method call or an item assignment puts one into it."""
    seen: set[Target] = set()
    stops: list[Stop] = []
    built: list[Target] = []

    def visit(target: Target, held: set[str], depth: int) -> None:
        seen.add(target)
        stops.append(Stop(target[0], target[1], depth, floor(target[0])))
        fn = index.node(target)
        if floor(target[0]) < lowest or not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return
        module = index.modules[target[0]]
        owner = target[1].rpartition(".")[0] or None
        types = _local_types(index, module, fn, owner)

        def calls(node: ast.AST | None) -> bool:
            """Follow the calls `node` makes with derived values; whether it reads one."""
            if node is None:
                return False
            # a comprehension's names over a derived iterable are derived too
            loops = [c for c in ast.walk(node) if isinstance(c, ast.comprehension)]
            for _ in loops:
                for c in loops:
                    if _loads(c.iter) & held:
                        held.update(_stored(c.target))
            for call in _calls_of(node):
                found = _lookup(index, module, call.func, types)
                receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
                receiver_held = bool(_loads(receiver) & held) and isinstance(found, tuple)
                argued = any(
                    _loads(a) & held for a in [*call.args, *(k.value for k in call.keywords)]
                )
                if not isinstance(found, tuple):
                    if argued and receiver is not None:  # x.append(derived): x is derived
                        held.update(_stored(receiver))
                    continue
                is_class = isinstance(index.node(found), ast.ClassDef)
                for callee in _resolved(index, found, built):
                    node_of = index.node(callee)
                    if callee in seen or not isinstance(
                        node_of, (ast.FunctionDef, ast.AsyncFunctionDef)
                    ):
                        continue  # `target` itself is in `seen`
                    method = "." in callee[1] and (is_class or receiver is not None)
                    bound = _bound(
                        node_of, call, held, skip_self=method, receiver_held=receiver_held
                    )
                    if bound:
                        visit(callee, bound, depth + 1)
            return bool(_loads(node) & held)

        def run(body: list[ast.stmt]) -> None:
            for statement in body:
                if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    run(statement.body)  # a closure is read where it is written
                elif isinstance(statement, (ast.For, ast.AsyncFor)):
                    if calls(statement.iter):
                        held.update(_stored(statement.target))
                    run(statement.body)
                    run(statement.orelse)
                elif isinstance(statement, (ast.With, ast.AsyncWith)):
                    for item in statement.items:
                        if calls(item.context_expr) and item.optional_vars is not None:
                            held.update(_stored(item.optional_vars))
                    run(statement.body)
                elif isinstance(statement, (ast.If, ast.While)):
                    calls(statement.test)
                    run(statement.body)
                    run(statement.orelse)
                elif isinstance(statement, ast.Try):
                    handlers = [h.body for h in statement.handlers]
                    for part in (statement.body, *handlers, statement.orelse, statement.finalbody):
                        run(part)
                elif isinstance(statement, ast.Match):
                    calls(statement.subject)
                    for case in statement.cases:
                        run(case.body)
                elif isinstance(statement, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                    targets = (
                        statement.targets
                        if isinstance(statement, ast.Assign)
                        else [statement.target]
                    )
                    if calls(statement.value):
                        for t in targets:
                            held.update(_stored(t))
                else:
                    for child in ast.iter_child_nodes(statement):
                        if isinstance(child, ast.expr):
                            calls(child)

        run(fn.body)

    visit(entry, {name}, 0)
    return stops


@dataclass(frozen=True)
class Figures:
    """How hard a way is to follow: its stops (module visits), the modules they are in, its
    climbs back up a floor and its returns to a module already left, and the functions it
    reaches."""

    stops: int
    modules: int
    climbs: int
    returns: int
    functions: int

    @classmethod
    def of(cls, stops: list[Stop]) -> Figures:
        marks = moves(stops)
        climbs = sum("climb" in m for m in marks)
        returns = sum("return" in m for m in marks)
        visits = 1 + sum(b.module != a.module for a, b in itertools.pairwise(stops))
        return cls(visits, len({s.module for s in stops}), climbs, returns, len(stops))


def moves(stops: list[Stop]) -> list[tuple[str, ...]]:
    """What reaching each stop was: `climb` (a higher floor than the stop before),
    `return` (a module the reader had left), both or neither; the first stop, neither."""
    out: list[tuple[str, ...]] = [()]
    left: set[str] = set()
    for a, b in itertools.pairwise(stops):
        if b.module != a.module:
            left.add(a.module)
        marks = ("climb",) if b.floor > a.floor else ()
        out.append(marks + (("return",) if b.module != a.module and b.module in left else ()))
    return out


def callers(stops: list[Stop]) -> list[Stop | None]:
    """The function each stop was called from (None for the entry)."""
    out: list[Stop | None] = []
    stack: list[Stop] = []
    for s in stops:
        while stack and stack[-1].depth >= s.depth:
            stack.pop()
        out.append(stack[-1] if stack else None)
        stack.append(s)
    return out


def figures(
    entry: str, src: Path = ROOT / "src", *, lowest: str = LOWEST
) -> tuple[Figures, list[Stop]]:
    """The figures of the way from `entry` (`module:function` or `module:Class.method`),
    not following the calls of functions on the floors below `lowest`'s; with `@name`
    (`parity.commands._check:run@args`), the way of that value (`walk_data`)."""
    module, _, name = entry.partition(":")
    name, _, data = name.partition("@")
    index = Index(src)
    if index.node((module, name)) is None:
        raise SystemExit(f"{entry}: no such function in {src}; pass module:function[@name]")
    if data:
        stops = walk_data(index, (module, name), data, lowest=floor_of(lowest))
    else:
        stops = walk(index, (module, name), lowest=floor_of(lowest))
    return Figures.of(stops), stops


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "entry",
        nargs="+",
        help="module:function, e.g. parity.commands._check:run; module:function@name follows "
        "the value `name` of that function (a parameter or a local), e.g. "
        "parity.commands._check:run@args",
    )
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the folder parity is in")
    parser.add_argument(
        "--lowest",
        default=LOWEST,
        help=f"the lowest unit whose functions' calls are followed (default: {LOWEST}, the "
        "check's own floor: the rooms below it, the calibrated class, the results, the "
        "origin, the store, the judge, are stops whose insides a reader of the check does "
        "not follow)",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="print every stop, and what reaching it was"
    )
    parser.add_argument(
        "--by-caller",
        action="store_true",
        help="print, per function, the climbs and returns of the calls it makes",
    )
    args = parser.parse_args(argv)
    for entry in args.entry:
        found, stops = figures(entry, args.src, lowest=args.lowest)
        marks = moves(stops)
        if args.verbose:
            for s, m in zip(stops, marks, strict=True):
                print(f"{'  ' * s.depth}{s.module}:{s.name}  (floor {s.floor}) {' '.join(m)}")
        if args.by_caller:
            tally: dict[str, list[int]] = {}
            for caller, m in zip(callers(stops), marks, strict=True):
                if caller is not None and m:
                    row = tally.setdefault(f"{caller.module}:{caller.name}", [0, 0])
                    row[0] += "climb" in m
                    row[1] += "return" in m
            for name, (c, r) in sorted(tally.items(), key=lambda kv: -sum(kv[1])):
                print(f"{c:4d} climbs {r:4d} returns  {name}")
        print(
            f"{entry}: {found.stops} stops in {found.modules} modules ({found.functions} "
            f"functions), {found.climbs} climbs back up a floor, {found.returns} returns to a "
            "module already left"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
