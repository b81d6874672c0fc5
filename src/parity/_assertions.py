"""`assert_equivalent`: compare two pytrees under tolerance classes, chex-style.

For any test framework or none: it raises `NotEquivalent`, an `AssertionError` whose
message is the failure table (per class, the first divergence, every failing key with its
reason) and whose fields are the comparison and the origin it was made from. The first
divergence is named "in forward order" where the order was given (`order=`) or derived
(a `Dataflow` from `parity.in_dataflow_order`, or `new_fn`'s program traced), "in
container order" otherwise: a `NamedTuple`'s fields, a dict's keys as jax sorts them, are
not the program's order.
A live check (`parity.check.check_live`, through the one comparison every check
makes) plus the tree's non-array leaves, compared with `==`
(`parity.judge._trees.non_array_differences`, as the pytest fixture `parity_check` does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypedDict, Unpack

from parity._errors import ParityError
from parity._results import CheckResult
from parity.check import BARE_KEY, Settler, check_live
from parity.check._flow import probed
from parity.check._request import refuse_unknown_options
from parity.judge._classes import REGISTRY, ToleranceClass
from parity.judge._compare import Comparison, Order
from parity.judge._converting import Conversion
from parity.judge._dataflow import Dataflow
from parity.judge._renames import parse_renames
from parity.judge._stacking import parse_stack
from parity.judge._tolerance import ClassMap
from parity.judge._trees import flatten, non_array_differences
from parity.origin._localisation import Localisation
from parity.origin._settling import LiveSides, Rules, settle_by
from parity.report import format_table

__all__ = ["AssertOptions", "NotEquivalent", "assert_equivalent"]


class AssertOptions(TypedDict, total=False):
    """`assert_equivalent`'s options (each described there)."""

    class_map: ClassMap | str
    order: Order | None
    overrides: Sequence[tuple[str, str]]
    registry: Mapping[str, ToleranceClass]
    new_fn: Callable[..., Any] | None
    old_fn: Callable[..., Any] | None
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] | None
    stack: Sequence[str] | str | None
    rename: Sequence[str | Sequence[str]] | str | None
    convert: Callable[[dict[str, Any]], Any] | None


@dataclass(frozen=True)
class _Programs:
    """The two functions whose outputs a failing `assert_equivalent` compared, and what they
    were called with: the check's `Settler` (`parity.check.Settler`), through the one door
    every face settles by (`parity.origin.settle_by`), its sides the two live functions
    recorded op by op once (`parity.origin.LiveSides`)."""

    sides: LiveSides
    rules: Rules

    def settle(self, results: Sequence[CheckResult]) -> list[CheckResult]:
        failing = {str(i): r.comparison for i, r in enumerate(results) if not r.passed}
        done = settle_by(failing, self.sides, rules=self.rules)
        out = []
        for i, r in enumerate(results):
            if (settled := done.get(str(i))) is not None:
                r = dataclasses.replace(r, comparison=settled.comparison, origin=settled.origin)
            out.append(r)
        return out


def assert_equivalent(actual: Any, expected: Any, **options: Unpack[AssertOptions]) -> Comparison:
    """Assert that every array leaf of `actual` holds its tolerance class against `expected`.

    **Arguments:**

    - `actual`, `expected`: pytrees: dicts, lists, tuples, named tuples, and (where jax is
        imported) equinox modules and other registered pytrees. A leaf's key is its path,
        joined by "." (`mlp.layers.0.weight`); a bare array is a tree of one leaf, named
        `array`. Non-array leaves (an equinox MLP's activation function) are compared with
        `==`.
    - `class_map`: a class name for every leaf (default `"bitwise"`), or a `ClassMap` by
        key pattern.
    - `order`: the forward order (keys, or a callable key -> sort key) in which the first
        divergence is named; default: where `new_fn` is given, the order its program
        computes its outputs in (`parity.dataflow_order(new_fn, *args, **kwargs)`, traced
        on a failure only), else (or where it does not trace) `expected`'s own order (as
        `flatten` walks it), then keys only in `actual`. A dict that came out of `jax.jit`
        is in alphabetical order (jax sorts dict keys): pass the outputs of
        `parity.in_dataflow_order(fn)(...)`, or `order=parity.dataflow_order(fn, ...)`, to
        walk them as the program computed them.
    - `overrides`: `(pattern, class)` rules tried before `class_map`.
    - `registry`: the classes by name.
    - `stack`, `rename`: keys said as one: `"blocks.{i}"` compares a key stacked on a
        leading axis (`blocks.w`) row by row with the other tree's per-layer keys
        (`blocks.1.w`, `parity.judge._stacking`); `"encoder=backbone"`, `actual`'s
        `backbone.<rest>` with `expected`'s `encoder.<rest>` (`parity.judge._renames`).
        Without them a failure says which missing keys new ones replace, and the rule.
    - `convert`: any other layout, by your own converter of `expected`'s layout into
        `actual`'s (the function that converts an old checkpoint: it takes `expected` as
        nested dicts, its keys split at their dots, and returns the new layout): `actual`
        is read in `expected`'s layout through it, so each key is judged as `expected`
        names it, and a failure says where `actual` holds its element
        (`parity.judge._converting`; a converter that computes rather than moves is a
        `parity.CheckError`).
    - `new_fn`, `old_fn`, `args`, `kwargs`: the functions whose outputs `actual` and
        `expected` are, and what they were called with: on a failure both programs are
        recorded op by op, once; a key of class `op_by_op` whose bits differ then passes
        where it is proved op by op (every value it is computed from equal bit for bit,
        `parity.origin._proof`), and a failure ends with an `origin:` line naming the first
        operation of `new_fn` that computes what `old_fn` never did, at its source line
        (`parity.localise`), or why there is none.

    **Returns:** the `Comparison`, when it passes. Raises `NotEquivalent` (an
    `AssertionError`) with the failure table otherwise (missing and unexpected leaves
    included; its `comparison` and `origin` as fields), and `parity.CheckError` for
    input it cannot compare (a class name the registry lacks, an object array), as every
    check does.

    **Example:**

    ```python
    params, tokens = init(key), jnp.arange(16) % 64
    parity.assert_equivalent(
        scanned(params, tokens), unrolled(params, tokens), class_map="op_by_op",
        new_fn=scanned, old_fn=unrolled, args=(params, tokens),
    )  # bits may differ only where both programs, run op by op, prove it
    ```
    """
    __tracebackhide__ = True  # a failure points at the caller's line, not at parity's
    refuse_unknown_options(options, AssertOptions, "assert_equivalent")
    statics_a, statics_e = dict[str, Any](), dict[str, Any]()
    order, registry = options.get("order"), options.get("registry", REGISTRY)
    said = {k: v for k in ("stack", "rename") if (v := options.get(k)) is not None}
    # The converter probed once, on `expected`'s layout: every comparison and the settling
    # read it so.
    said["convert"] = _conversion(options.get("convert"), expected)

    def check(order: Order | None, settle: Settler | None = None) -> CheckResult:
        statics_a.clear()
        statics_e.clear()
        return check_live(
            actual,
            expected,
            class_map=options.get("class_map", "bitwise"),
            overrides=options.get("overrides", ()),
            order=order,
            registry=registry,
            **said,
            name="assert_equivalent",
            non_arrays=(statics_a, statics_e),
            settle=settle,
        )

    result = check(order)
    static_problems = non_array_differences(statics_a, statics_e)
    if result.passed and not static_problems:
        return result.comparison
    dataflow = isinstance(expected, Dataflow) or isinstance(actual, Dataflow)
    if not result.passed:
        result, order = _settled(result, check, options, said, dataflow=dataflow)
    if result.passed and not static_problems:
        return result.comparison
    # Without an order or a `Dataflow`, the walk is the containers' own: not the forward one.
    walk = "forward order" if order is not None or dataflow else "container order"
    raise NotEquivalent.of(result.comparison, walk, static_problems, result.origin)


class NotEquivalent(AssertionError, ParityError):
    """`assert_equivalent`'s failure: an `AssertionError` (pytest shows it as any failed
    assert) whose message is the table, and whose fields are what it was made from.

    **Fields:** `comparison` (the `Comparison`, every key's verdict and its basis, settled
    op by op where the functions were given), `origin` (the `Localisation` of the first
    key still failing, or None where the programs were not recorded).

    **Class attributes:** `exit_code` 1: the trees were judged, and differ (not an error in
    what parity was given).
    """

    exit_code: ClassVar[int] = 1

    def __init__(
        self, message: str, *, comparison: Comparison, origin: Localisation | None = None
    ) -> None:
        super().__init__(message)
        self.comparison, self.origin = comparison, origin

    @classmethod
    def of(
        cls,
        comparison: Comparison,
        walk: str,
        static_problems: Sequence[str],
        found: Localisation | None,
    ) -> NotEquivalent:
        """The failure of `comparison`, its message `_message`'s."""
        return cls(_message(comparison, walk, static_problems, found), comparison=comparison,
                   origin=found)  # fmt: skip


def _message(
    comparison: Comparison, walk: str, static_problems: Sequence[str], found: Localisation | None
) -> str:
    """The failure's text: the table (its first divergence named in `walk`), the non-array
    leaves that differ, and the `origin:` line where the programs were recorded (or where
    recording them raised, with its traceback)."""
    message = "trees are not equivalent\n" + format_table(comparison, order=walk)
    if static_problems:
        message += f"non-array leaves that differ ({len(static_problems)}):\n"
        message += "\n".join(static_problems) + "\n"
    if found is not None and not comparison.passed:
        message += found.line + "\n"
        if found.traceback:  # recording raised here: where, in the user's own frames
            message += "the recording's traceback:\n" + found.traceback
    return message


def _settled(
    result: CheckResult,
    check: Callable[[Order | None, Settler | None], CheckResult],
    options: AssertOptions,
    said: Mapping[str, Any],
    *,
    dataflow: bool,
) -> tuple[CheckResult, Order | None]:
    """A failing `result` with the functions in hand: the forward order read from
    `new_fn`'s program (traced only now, on a failure; where it does not trace, the
    containers' order stands), and both programs recorded op by op, once, so that a key of
    a class that proves is proved or told why not and the first key still failing gets its
    origin; the trees compared again (`check`) only where the order changed. `said`: the
    stack and rename rules and the converter's `Conversion`, as the comparison read them.

    **Returns:** the result and the order it walked."""
    given = order = options.get("order")
    new_fn, old_fn = options.get("new_fn"), options.get("old_fn")
    args, kwargs = options.get("args", ()), options.get("kwargs") or {}
    if order is None and not dataflow and new_fn is not None:
        order = _forward_order(new_fn, args, kwargs)
    if new_fn is not None and old_fn is not None:
        registry = options.get("registry", REGISTRY)
        sides = LiveSides(new_fn, old_fn, tuple(args), dict(kwargs))
        programs = _Programs(sides, _rules(said, registry))
        result = programs.settle([result])[0] if order is given else check(order, programs)
    elif order is not None and given is None:
        result = check(order, None)
    return result, order


def _rules(said: Mapping[str, Any], registry: Mapping[str, ToleranceClass]) -> Rules:
    """What the two functions' recordings are settled by: the classes, the stack and rename
    rules said, and the converter's `Conversion` (for the one comparison `_Programs`
    settles, named `"0"`)."""
    stack, rename = parse_stack(said.get("stack")), parse_renames(said.get("rename"))
    convert = said.get("convert")
    converted = {} if convert is None else {"0": convert}
    return Rules(registry, stack, rename, convert=converted)


def _conversion(
    convert: Callable[[dict[str, Any]], Any] | None, expected: Any
) -> Conversion | Callable[[dict[str, Any]], Any] | None:
    """What `convert` does to `expected`'s layout (`parity.check._flow.probed`: its keys
    and shapes only, no leaf copied), probed once for every comparison and the settling;
    `convert` as it is where `expected` does not flatten (the comparison says why)."""
    if convert is None:
        return None
    try:
        flat = flatten(expected, bare=BARE_KEY, non_arrays={}, to_array=lambda leaf: leaf)
    except (TypeError, ValueError):
        return convert
    return probed(convert, flat, "assert_equivalent")


def _forward_order(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> list[str] | None:
    """The keys of `fn(*args, **kwargs)` in the order its program computes them
    (`parity.origin._record.dataflow_order`), or None where it does not trace (its
    `DataflowError`) or returns no container of keys to order (a bare array: the
    `TypeError` of `flatten`, which `DataflowError` is too)."""
    from parity.origin._record import dataflow_order

    try:
        return dataflow_order(fn, *args, **kwargs)
    except TypeError:
        return None
