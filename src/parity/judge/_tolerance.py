"""Which tolerance class an array gets: class names looked up, class maps applied.

`get_class` looks a class up by name in a registry (`REGISTRY` by default, the named classes
of `parity.judge._classes`); a `ClassMap` gives each array key a class name by glob pattern,
and is pinned in every golden file. `effective_atol` is the absolute tolerance a class
gives against one expected array. `flag_rules` reads the rules a user gives as flags (`--override`,
`--class`; the plugin's `--parity-override`, `--parity-class`), for both faces.

A class map may set rule parameters per pattern by writing them after the class name:
`"reduction[K=512]"` is the registry's `reduction` class with the reduction length `K`
set to 512 (`get_class` builds it; reports name it as written). A class whose rule needs
a parameter the registry leaves open (`Reduction.K`) can only be used that way.

`ToleranceClass` and `REGISTRY` are defined in `parity.judge._classes` (public as
`parity.ToleranceClass` and `parity.REGISTRY`).

This module imports numpy, ml_dtypes and `parity._errors` only: jax arrays reach it through
`np.asarray`.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from parity._errors import ParityError
from parity.judge._classes import REGISTRY, ToleranceClass
from parity.judge._fixed_rules import Close
from parity.judge._registry import rule_from_dict
from parity.judge._rule_base import Scale
from parity.judge._ulp import is_float_dtype, to_float64

__all__ = [
    "DEFAULT_CLASS",
    "OVERRIDE_HELP",
    "PER_KEY_PARAMS",
    "ClassMap",
    "ClassMapLike",
    "KeyClass",
    "Overrides",
    "RuleError",
    "UnknownClassError",
    "UnmatchedKeyError",
    "class_help",
    "class_problem",
    "class_resolver",
    "effective_atol",
    "flag_rules",
    "get_class",
    "nearest_class",
    "parse_class_name",
    "split_override",
    "to_class",
]


#: What a class map gives a key: a class name, or a class already resolved for that key
#: (`get_class(name, params=...)`: a `calibrated` key with its recorded spread bound).
KeyClass = str | ToleranceClass


def to_class(given: KeyClass, registry: Mapping[str, ToleranceClass] = REGISTRY) -> ToleranceClass:
    """The `ToleranceClass` of `given`: itself if resolved already, else `get_class(given,
    registry)`."""
    return given if isinstance(given, ToleranceClass) else get_class(given, registry)


class UnknownClassError(ParityError, KeyError):
    """A tolerance class name that the registry does not hold."""

    def __str__(self) -> str:
        # KeyError's str() is the repr of its argument, which quotes a whole sentence.
        return str(self.args[0]) if self.args else ""


class UnmatchedKeyError(ParityError, KeyError):
    """An array key that no rule of a `ClassMap` matches, with no default to fall back on."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _param_value(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def parse_class_name(name: str) -> tuple[str, dict[str, int | float]]:
    """Split `"base[p=v,q=w]"` into the base class name and its parameters.

    **Arguments:**

    - `name`: a class name as a class map writes it, with or without parameters.

    **Returns:** `(base, params)`, values as int where they read as one, else float;
    `(name, {})` without brackets. Raises `UnknownClassError` for a malformed bracket.
    """
    if not name.endswith("]") or "[" not in name:
        return name, {}
    base, _, inner = name[:-1].partition("[")
    params: dict[str, int | float] = {}
    try:
        for item in inner.split(","):
            field, eq, value = item.partition("=")
            if not eq or not field.strip():
                raise ValueError(item)
            params[field.strip()] = _param_value(value.strip())
    except ValueError:
        raise UnknownClassError(
            f"tolerance class {name!r}: parameters must read 'name[param=number,...]', "
            "e.g. 'reduction[K=512]'"
        ) from None
    return base, params


def _lookup(name: str, registry: Mapping[str, ToleranceClass]) -> ToleranceClass:
    try:
        tol = registry[name]
    except KeyError:
        if name.endswith("]") and "[" in name:
            base_name, params = parse_class_name(name)
            base = _lookup(base_name, registry)
            try:
                rule = rule_from_dict(base.rule.kind, {**base.rule.params(), **params})
            except ValueError as e:
                raise UnknownClassError(f"tolerance class {name!r}: {e}") from None
            return ToleranceClass(name, rule, meaning=base.meaning, measured=base.measured)
        raise UnknownClassError(
            f"unknown tolerance class {name!r}; known classes: {sorted(registry)}. "
            "Fix the name in the class map, or pass a registry that defines it."
        ) from None
    if tol.name != name:
        # Findings and reports name the class by `tol.name`; a registry key that differs
        # would make them disagree with the class map.
        raise ValueError(
            f"registry key {name!r} holds the tolerance class named {tol.name!r}; register "
            "each class under its own name, e.g. {c.name: c for c in classes}"
        )
    return tol


def get_class(
    name: str,
    registry: Mapping[str, ToleranceClass] = REGISTRY,
    *,
    params: Mapping[str, float] | None = None,
) -> ToleranceClass:
    """Look a class up by `name`, optionally with rule parameters (`"reduction[K=512]"`:
    the class `reduction` with `K=512`), in `registry`; `params` are rule parameters bound
    for one key, as data (a `calibrated` key's recorded `spread`, exact): set on the rule,
    never written into the name, which stays `name`.

    **Returns:** the `ToleranceClass`; raises `UnknownClassError` (a `KeyError`) listing the
    known names when `name` is not there, or naming the parameter a class needs and was
    not given, and `ValueError` when the class found under `name` is named otherwise.

    **Example:**

    ```python
    tol = parity.get_class("reduction[K=512]")
    tol.describe_allowed()  # "|a-b| <= 4*sqrt(512)*u*max|b|", u the dtype's unit roundoff
    ```
    """
    tol = _lookup(name, registry)
    if params:
        try:
            rule = rule_from_dict(tol.rule.kind, {**tol.rule.params(), **params})
        except ValueError as e:
            raise UnknownClassError(f"tolerance class {name!r}: {e}") from None
        tol = ToleranceClass(name, rule, meaning=tol.meaning, measured=tol.measured)
    missing = tol.rule.missing()
    if missing:
        base, example = parse_class_name(name)[0], ",".join(f"{m}=<number>" for m in missing)
        raise UnknownClassError(
            f"tolerance class {name!r} needs {missing} set per key in the class map "
            f"(its rule is {tol.describe_allowed()}); write it as '{base}[{example}]', "
            f"for example ('taps.*', '{base}[{missing[0]}=512]')"
        )
    return tol


#: Rule parameters a check binds per key from the golden file's recorded calibration
#: (`parity.calibrated._bounds.bind_calibrated`), so a class map or an override may name a
#: class that leaves them open (`calibrated`, whose `spread` is each key's own).
PER_KEY_PARAMS = frozenset({"spread"})


def nearest_class(name: str, registry: Mapping[str, ToleranceClass] = REGISTRY) -> str | None:
    """The registry's class name closest to `name` (a typo's likely meaning), or None where
    none is close (`difflib.get_close_matches`, on the name without its parameters)."""
    import difflib  # only a name that is not a class needs it: not loaded by every check

    found = difflib.get_close_matches(name.partition("[")[0], sorted(registry), n=1, cutoff=0.6)
    return found[0] if found else None


def class_problem(
    name: str, where: str, registry: Mapping[str, ToleranceClass] = REGISTRY
) -> str | None:
    """Why the class `name` cannot stand where `where` says it is given (`"--override
    'logits=fp32_reasoc'"`, `"CLASS_MAP rule ('logits', 'fp32_reasoc')"`), as one
    sentence, or None where it can: a class `registry` holds, with every parameter its
    rule needs, except those a check binds per key (`PER_KEY_PARAMS`: bare `calibrated` is
    usable, each key judged by the spread its golden file records; a golden that records
    none is refused by the check, naming `parity calibrate`).

    An unknown name is said with the nearest known one (`nearest_class`) and every known
    class; another problem (a parameter missing or malformed) in `get_class`'s words."""
    if name.partition("[")[0] not in registry:
        near = nearest_class(name, registry)
        hint = f" (did you mean {near!r}?)" if near else ""
        return (
            f"{where} names the unknown tolerance class {name!r}{hint}; known classes: "
            f"{', '.join(sorted(registry))} (a class may take parameters: "
            "'reduction[K=512]')"
        )
    try:
        tol = _lookup(name, registry)
        if [m for m in tol.rule.missing() if m not in PER_KEY_PARAMS]:
            get_class(name, registry)
    except (UnknownClassError, ValueError) as e:
        return f"{where}: {e}"
    return None


class RuleError(ParityError, ValueError):
    """A class rule given as a flag (`--override PATTERN=CLASS`, `--class NAME`, or the
    plugin's `--parity-override` and `--parity-class`) that cannot stand; its text is one
    sentence naming the flag that gave it."""


#: The help of `--override PATTERN=CLASS`: the subcommands' and, as `--parity-override`,
#: the pytest plugin's.
OVERRIDE_HELP = (
    "check keys matching PATTERN (shell-style, e.g. 'traj.*') under CLASS, before "
    "everything else (repeatable); 'calibrated' judges each key by the spread `parity "
    "calibrate --write` recorded in its golden file"
)


def class_help(prefix: str = "--") -> str:
    """The help of `--class NAME` (`prefix` `"--"`: the subcommands') and of
    `--parity-class NAME` (`"--parity-"`: the pytest plugin's)."""
    return (
        f"check every key under tolerance class NAME (after {prefix}override, before any "
        f"other class, the goldens' pinned ones included); known: {', '.join(sorted(REGISTRY))}"
    )


def split_override(text: str) -> tuple[str, str] | None:
    """`PATTERN=CLASS` (`--override`, `--parity-override`) as `(pattern, class)`, or None
    if malformed. The class may carry parameters (`'taps.*=reduction[K=512]'`): the split
    is at the last `=` outside brackets. Whether the class exists is the caller's check."""
    head = text[: text.rindex("[")] if text.endswith("]") and "[" in text else text
    pattern, sep, _ = head.rpartition("=")
    name = text[len(pattern) + 1 :] if sep else ""
    return (pattern, name) if sep and pattern and name else None


def flag_rules(
    overrides: Iterable[str], class_name: str | None = None, *, prefix: str = "--"
) -> list[tuple[str, str]]:
    """The class rules given as flags, in their precedence: each `--override PATTERN=CLASS`
    as `(pattern, class)`, then `--class NAME` as `("*", NAME)` (every key).

    **Arguments:**

    - `overrides`: the `--override` texts, in the order given.
    - `class_name`: the `--class` name, or None.
    - `prefix`: the flags' prefix, for messages: `"--"` (the subcommands) or `"--parity-"`
      (the pytest plugin).

    **Returns:** the `(pattern, class)` rules. Raises `RuleError` naming the flag for a
    rule that is not `PATTERN=CLASS` or a class that cannot stand there (`class_problem`).
    """
    given = [(split_override(text), f"{prefix}override {text!r}") for text in overrides]
    if class_name is not None:
        given.append((("*", class_name), f"{prefix}class"))
    rules: list[tuple[str, str]] = []
    for rule, where in given:
        if rule is None:
            raise RuleError(
                f"{where} is not PATTERN=CLASS; for example {prefix}override 'traj.*=device_count'"
            )
        problem = class_problem(rule[1], where)
        if problem is not None:
            raise RuleError(problem)
        rules.append(rule)
    return rules


@dataclass(frozen=True)
class ClassMap:
    """Which tolerance class each array key gets, by glob pattern; first match wins.

    **Arguments:**

    - `rules`: `(pattern, class_name)` pairs, tried in order with `fnmatch.fnmatchcase`
        (`*` also matches `.`, so `"layers.*.h1"` matches `"layers.3.h1"`).
    - `default`: the class for keys that no rule matches, or `None` to make such keys an
        error.
    """

    rules: tuple[tuple[str, str], ...] = ()
    default: str | None = None

    def __post_init__(self) -> None:
        # Accept lists (as JSON gives them) but store tuples, so the map stays hashable.
        try:
            rules = tuple((p, c) for p, c in self.rules)
        except (TypeError, ValueError):
            raise ValueError(
                f"ClassMap rules must be (pattern, class_name) pairs, got {self.rules!r}"
            ) from None
        for pattern, name in rules:
            if not isinstance(pattern, str) or not isinstance(name, str) or not name:
                raise ValueError(
                    f"ClassMap rule must be a (str pattern, non-empty str class name) pair, "
                    f"got {(pattern, name)!r}"
                )
        if self.default is not None and (not isinstance(self.default, str) or not self.default):
            raise ValueError(f"ClassMap default must be a class name or None, got {self.default!r}")
        object.__setattr__(self, "rules", rules)

    def class_for(self, key: str) -> str:
        """The class name for `key`: the first matching rule's, else the default.

        **Arguments:**

        - `key`: an array key, for example `"layers.3.h1"`.

        **Returns:** the class name; raises `UnmatchedKeyError` (a `KeyError`) when no rule
        matches and there is no default.
        """
        for pattern, name in self.rules:
            if fnmatch.fnmatchcase(key, pattern):
                return name
        if self.default is not None:
            return self.default
        patterns = [p for p, _ in self.rules]
        raise UnmatchedKeyError(
            f"no class map rule matches key {key!r} (patterns, in order: {patterns}) and the "
            "map has no default; add a rule for it or set a default class"
        )

    def resolve(
        self, key: str, registry: Mapping[str, ToleranceClass] = REGISTRY
    ) -> ToleranceClass:
        """The `ToleranceClass` for `key`, looked up in `registry`.

        **Arguments:**

        - `key`: an array key.
        - `registry`: the classes by name; defaults to `REGISTRY`.

        **Returns:** the class; raises `UnmatchedKeyError` or `UnknownClassError`.
        """
        return get_class(self.class_for(key), registry)

    def class_names(self) -> tuple[str, ...]:
        """Every class name the map can give, in rule order, default last, no repeats."""
        names = [c for _, c in self.rules] + ([self.default] if self.default else [])
        return tuple(dict.fromkeys(names))

    def check(self, registry: Mapping[str, ToleranceClass] = REGISTRY) -> None:
        """Raise `UnknownClassError` if the map names a class that `registry` lacks."""
        unknown = []
        for n in self.class_names():
            try:
                get_class(n, registry)
            except UnknownClassError:
                unknown.append(n)
        if unknown:
            raise UnknownClassError(
                f"class map names unknown tolerance classes {unknown}; known classes: "
                f"{sorted(registry)}"
            )

    def to_json(self) -> str:
        """The map as JSON text, byte-stable for a given map (it is pinned in golden files)."""
        return json.dumps(
            {"rules": [list(r) for r in self.rules], "default": self.default},
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> ClassMap:
        """Read a map written by `to_json`.

        **Arguments:**

        - `text`: JSON with `rules` (a list of `[pattern, class_name]`) and `default`.

        **Returns:** the `ClassMap`; raises `ValueError` on any other shape.
        """
        data = json.loads(text)
        if not isinstance(data, dict) or set(data) - {"rules", "default"}:
            raise ValueError(
                f"class map JSON must be an object with 'rules' and 'default', got {text!r}"
            )
        data = cast(dict[str, Any], data)
        rules = data.get("rules", [])
        if not isinstance(rules, list) or not all(
            isinstance(r, list) and len(cast(list[Any], r)) == 2 for r in cast(list[Any], rules)
        ):
            raise ValueError(
                f"class map 'rules' must be a list of [pattern, class] pairs: {text!r}"
            )
        pairs = cast(Iterable[list[str]], rules)
        return cls(tuple((p, c) for p, c in pairs), data.get("default"))


def effective_atol(tol: ToleranceClass, expected: Any) -> float:
    """The absolute tolerance `tol` gives against `expected`.

    **Arguments:**

    - `tol`: the class.
    - `expected`: the array compared with (a golden's, a baseline's, a live tree's).

    **Returns:** for a `Close` rule its `atol`, or, when `atol_ulps` is set and `expected`
    is a float array, `atol_ulps * spacing(max finite |expected|)` in its dtype (the
    spacing at 0 when it has no finite element); 0.0 for other rules.
    """
    rule = tol.rule
    if not isinstance(rule, Close):
        return 0.0
    e = np.asarray(expected)
    if rule.atol_ulps is not None and not is_float_dtype(e.dtype):
        return 0.0
    return rule.effective_atol(
        Scale.of(e, to_float64(e)) if rule.atol_ulps is not None else Scale(e.dtype, 0.0)
    )


# --------------------------------------------------------------------------- precedence

#: The class of a key that no level of the precedence covers.
DEFAULT_CLASS = "bitwise"
#: `(pattern, class)` rules tried before every class map (`fnmatch.fnmatchcase`).
Overrides = Sequence[tuple[str, str]]
#: What a caller may give as its class map: a `ClassMap`, a class name for every key, none.
ClassMapLike = ClassMap | str | None


def class_resolver(
    *,
    overrides: Overrides = (),
    class_map: ClassMapLike = None,
    pinned: ClassMap | None = None,
    recorded: Mapping[str, str] | None = None,
) -> Callable[[str], str]:
    """key -> class name, by the one precedence every check uses (the CLI, the pytest
    plugin, `parity diff`, `assert_equivalent`):

    1. explicit overrides: `(pattern, class)` rules given for this check (for example
       `[("traj.*", "device_count")]` on 4 devices);
    2. the class map the caller gives (a `ClassMap`, or a class name for every key);
    3. the class map pinned in the golden file (and, for a key it does not cover, the class
       recorded with the array);
    4. `bitwise`.

    A level that has no answer for a key (a `ClassMap` without a default whose rules do not
    match) passes the key to the next level.

    **Arguments:**

    - `overrides`: `(pattern, class)` rules tried first (`fnmatch.fnmatchcase`).
    - `class_map`: the caller's map, or a class name for every key.
    - `pinned`: the golden file's pinned map.
    - `recorded`: the classes recorded with the golden's arrays, by key.

    **Returns:** a function giving each key its class name (never raising).
    """
    rules = tuple((str(p), str(c)) for p, c in overrides)
    caller = ClassMap(default=class_map) if isinstance(class_map, str) else class_map
    recorded = recorded or {}

    def resolve(key: str) -> str:
        for pattern, name in rules:
            if fnmatch.fnmatchcase(key, pattern):
                return name
        for level in (caller, pinned):
            if level is None:
                continue
            try:
                return level.class_for(key)
            except KeyError:  # no rule matches and the map has no default
                pass
        return recorded.get(key) or DEFAULT_CLASS

    return resolve
