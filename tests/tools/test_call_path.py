"""tools/call_path.py follows a flow as a reader does: on a package small enough to walk by
hand, its stops, climbs and returns are the ones counted here by eye; a protocol's method
leads to the class a face built; and on parity it reaches the stages of the check."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("call_path", ROOT / "tools" / "call_path.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["call_path"] = module
    spec.loader.exec_module(module)
    return module


cp = _tool()

#: A package of three floors: `top` over `mid` over `low`.
PACKAGE = {
    "__init__.py": "",
    "low.py": """
def z():
    return 1

def y():
    return 2


def v(x):
    return x


def w(x):
    return x
""",
    "mid.py": """
from typing import Protocol

from pkg.low import v, w, y, z


class Step(Protocol):
    def go(self) -> int: ...


class Plain:
    def go(self) -> int:
        return y()


def a():
    return z()


def b():
    return 0


def door(step: Step):
    return step.go()


def a_with(first, second):
    w(second)
    v(first)
""",
    "top.py": """
from pkg import low, mid


def run():
    mid.a()
    low.z()
    mid.b()


def handed():
    step = mid.Plain()
    return mid.door(step)


def data(value, other):
    mid.b()  # does not take the value: not on its way
    doubled = [value, value]
    kept = []
    kept.append(low.y)
    kept.append(doubled)
    mid.b(other)
    return mid.door(step=kept), [mid.a_with(*each) for each in [kept]]
""",
}
FLOORS = {"pkg.low": 0, "pkg.mid": 1, "pkg.top": 2}


def _walk(tmp_path: Path, entry: str) -> list:
    for name, text in PACKAGE.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    index = cp.Index(tmp_path, package="pkg")
    module, _, name = entry.partition(":")
    return cp.walk(index, (module, name), floor=lambda m: FLOORS.get(m, -1))


def test_a_function_reached_twice_is_one_stop_and_a_climb_and_a_return_are_counted(
    tmp_path: Path,
) -> None:
    stops = _walk(tmp_path, "pkg.top:run")
    # run -> mid.a -> low.z; low.z again (already read); then mid.b: back up from low to
    # mid (a climb), into mid, which the reader had left for low (a return).
    assert [(s.module, s.name, s.depth) for s in stops] == [
        ("pkg.top", "run", 0),
        ("pkg.mid", "a", 1),
        ("pkg.low", "z", 2),
        ("pkg.mid", "b", 1),
    ]
    assert cp.Figures.of(stops) == cp.Figures(stops=4, modules=3, climbs=1, returns=1, functions=4)
    assert cp.moves(stops) == [(), (), (), ("climb", "return")]
    # the climb and the return are run's: it called mid.b after mid.a had gone down to low
    assert [c and c.name for c in cp.callers(stops)] == [None, "run", "a", "run"]


def test_a_protocol_s_method_leads_to_the_class_built_on_the_way(tmp_path: Path) -> None:
    stops = _walk(tmp_path, "pkg.top:handed")
    names = [f"{s.module}:{s.name}" for s in stops]
    assert names == ["pkg.top:handed", "pkg.mid:door", "pkg.mid:Plain.go", "pkg.low:y"]


def test_the_check_s_way_goes_through_its_stages_in_order() -> None:
    found, stops = cp.figures("parity.run._produced:check_produced@produced")
    names = [f"{s.module}:{s.name}" for s in stops]
    stages = [
        "parity.check._flow:check_groups",
        "parity.check._first:first_verdict",
        "parity.check._against_baseline:against_baseline",
        "parity.check._conclusion:conclude",
    ]
    assert all(s in names for s in stages), names
    assert [names.index(s) for s in stages] == sorted(names.index(s) for s in stages)
    assert found.functions == len(stops) and found.modules == len({s.module for s in stops})
    # each visit after a module's first is a return to it
    assert found.returns == found.stops - found.modules


def test_the_data_s_way_is_the_calls_that_take_it_or_a_value_computed_from_it(
    tmp_path: Path,
) -> None:
    _walk(tmp_path, "pkg.top:run")  # writes the package
    index = cp.Index(tmp_path, package="pkg")
    stops = cp.walk_data(index, ("pkg.top", "data"), "value", floor=lambda m: FLOORS[m])
    # mid.b() and mid.b(other) take neither the value nor a value computed from it; `kept`
    # holds one after `kept.append(doubled)`, so door (by keyword) and a_with (by *each, each
    # of a comprehension over it: both parameters) take it; door's step is bound, and no
    # class was built on the way: its go is the protocol's own
    assert [(s.module, s.name, s.depth) for s in stops] == [
        ("pkg.top", "data", 0),
        ("pkg.mid", "door", 1),
        ("pkg.mid", "Step.go", 2),
        ("pkg.mid", "a_with", 1),
        ("pkg.low", "w", 2),
        ("pkg.low", "v", 2),
    ]
    assert cp.Figures.of(stops) == cp.Figures(stops=3, modules=3, climbs=0, returns=0, functions=6)


def test_a_parameter_the_data_is_not_bound_to_is_not_followed(tmp_path: Path) -> None:
    _walk(tmp_path, "pkg.top:run")
    index = cp.Index(tmp_path, package="pkg")
    entry = ("pkg.mid", "a_with")
    assert [s.name for s in cp.walk_data(index, entry, "first", floor=FLOORS.__getitem__)] == [
        "a_with",
        "v",
    ]
    assert [s.name for s in cp.walk_data(index, entry, "second", floor=FLOORS.__getitem__)] == [
        "a_with",
        "w",
    ]
