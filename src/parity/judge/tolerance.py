"""Tolerance classes: what a refactor may change in an array, as data.

A class is a name, a rule (an object of `parity.judge.rules`: `Bitwise`, `Ulp`, `Close`,
`RelativeToMax`, `Reduction`, `Budget`, `LogitKL`), one line saying what it tolerates and
the measurement that set its threshold. `REGISTRY` holds the named classes; a `ClassMap`
gives each array key a class by glob pattern, and is pinned in every golden file.

A class map may set rule parameters per pattern by writing them after the class name:
`"reduction[K=512]"` is the registry's `reduction` class with the reduction length `K`
set to 512 (`get_class` builds it; reports name it as written). A class whose rule needs
a parameter the registry leaves open (`Reduction.K`) can only be used that way.

Under every class dtypes and shapes are strict (float32 against a float64 golden is a
mismatch, never a cast), NaN and inf (with its sign) must sit at the same positions, and
integer and bool arrays are compared exactly. The checking itself lives in
`parity.judge.compare`; the arithmetic of each rule in `parity.judge.rules`.

This module imports numpy and ml_dtypes only: jax arrays reach it through `np.asarray`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import types
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any, cast

import numpy as np

from parity.judge.rules import (
    Bitwise,
    Budget,
    Calibrated,
    Close,
    LogitKL,
    Reduction,
    RelativeToMax,
    Rule,
    Scale,
    rule_from_dict,
)
from parity.judge.ulp import (
    ULP_NAN,
    is_float_dtype,
    is_int_dtype,
    to_float64,
    ulp_distance,
)

__all__ = [
    "REGISTRY",
    "ULP_NAN",
    "ClassMap",
    "ToleranceClass",
    "UnknownClassError",
    "UnmatchedKeyError",
    "effective_atol",
    "get_class",
    "is_float_dtype",
    "is_int_dtype",
    "parse_class_name",
    "to_float64",
    "ulp_distance",
]


class UnknownClassError(KeyError):
    """A tolerance class name that the registry does not hold."""

    def __str__(self) -> str:
        # KeyError's str() is the repr of its argument, which quotes a whole sentence.
        return str(self.args[0]) if self.args else ""


class UnmatchedKeyError(KeyError):
    """An array key that no rule of a `ClassMap` matches, with no default to fall back on."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


_CLASS_FIELDS = ("name", "rule", "meaning", "measured")


@dataclass(frozen=True)
class ToleranceClass:
    """A named rule for how far an array may move from its golden.

    **Arguments:**

    - `name`: the class name, as the class map and reports spell it.
    - `rule`: a `parity.judge.rules.Rule`, e.g. `Close(atol=2e-5)` or `Ulp(max_ulp=2)`.
    - `meaning`: one line saying what the class tolerates.
    - `measured`: the measurement that set the threshold.
    """

    name: str
    rule: Rule
    _: KW_ONLY
    meaning: str
    measured: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"tolerance class name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.rule, Rule):
            raise ValueError(
                f"tolerance class {self.name!r}: rule must be a parity.judge.rules.Rule object "
                f"such as Close(atol=1e-6) or Ulp(max_ulp=2), got {self.rule!r}"
            )
        for field in ("meaning", "measured"):
            if not isinstance(getattr(self, field), str):
                raise ValueError(
                    f"tolerance class {self.name!r}: {field} must be a str, "
                    f"got {getattr(self, field)!r}"
                )

    def describe_allowed(self) -> str:
        """One line saying what the class allows (`Rule.describe`).

        **Returns:** for example `"bitwise"`, `"ulp <= 4"`, `"|a-b| <= 1.7e-05 + 0*|b|"` or
        `"|a-b| <= 2 ulp(max|b|) + 0*|b|"`, with `b` the golden.
        """
        return self.rule.describe()

    def to_dict(self) -> dict[str, Any]:
        """The class as a JSON-safe dict: `name`, `rule` (its kind), the rule's parameters,
        `meaning` and `measured`; `ToleranceClass.from_dict` reads it back."""
        return {
            "name": self.name,
            "rule": self.rule.kind,
            **self.rule.params(),
            "meaning": self.meaning,
            "measured": self.measured,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToleranceClass:
        """Build a class from `to_dict` output.

        **Arguments:**

        - `data`: a mapping with `name`, `rule` (a kind of `parity.judge.rules.RULES`),
          `meaning`, optionally `measured`, and the rule's parameters. Parameters another
          rule takes are accepted only at their neutral values (0 or null), as older
          reports wrote every rule's parameters.

        **Returns:** the `ToleranceClass`; raises `ValueError` on unknown or missing fields.
        """
        missing = sorted({"name", "rule", "meaning"} - set(data))
        if missing:
            raise ValueError(f"tolerance class dict lacks required fields {missing}: {data!r}")
        params = {k: v for k, v in data.items() if k not in _CLASS_FIELDS}
        kind = data["rule"]
        from parity.judge.rules import RULES

        takes: set[str] = set()
        if kind in RULES:
            takes = {f.name for f in dataclasses.fields(RULES[kind])}  # pyright: ignore[reportArgumentType]
        params = {k: v for k, v in params.items() if k in takes or v not in (None, 0, 0.0)}
        try:
            rule = rule_from_dict(kind, params)
        except ValueError as e:
            raise ValueError(f"tolerance class {data['name']!r}: {e}") from None
        return cls(data["name"], rule, meaning=data["meaning"], measured=data.get("measured", ""))


#: Safety factor of the `reduction` class and the measurement behind it (`parity calibrate`).
REDUCTION_K = 4.0
REDUCTION_MEASURED = (
    "k needed = max|a-b| / (sqrt(K)*u*max|b|). bf16 GLU forward against the fp32 forward "
    "rounded to bf16 (4 layers, d_model 32, d_mlp 64, every tap): worst k 0.83 at K = 32 "
    "(MLP-inner), 0.45 at K = 64. fp32 forward taps under `parity calibrate` (ISA caps "
    "SSE4_2 and AVX against the pinned AVX2, 1/2/4 devices): worst k 2.42 at K = 32 "
    "(qwen3 layer 3 MLP-inner, SSE4_2). k = 4 leaves 1.65x over the ISA noise, 4.8x over "
    "bf16 against fp32"
)
#: The `bf16_logits` class's KL bound (nats) and the measurement behind it.
BF16_KL_TAU = 1e-3
BF16_LOGITS_MEASURED = (
    "bf16 GLU forward against the fp32 forward (4 layers, vocab 64, 48 positions): largest "
    "per-position KL 1.8e-4 (mean 6.3e-5), least top-5 agreement 0.8 (one swap), top-1 "
    "always equal, max |logit| difference 6.7e-2; tau 1e-3 leaves 5.5x, p 0.6 one more swap"
)


#: The `calibrated` class's margin over a key's measured spread, and its floor in ulps of
#: the golden's largest magnitude (docs/design.md, "Tolerance from measured noise").
CALIBRATED_K = 4.0
CALIBRATED_FLOOR_ULPS = 4.0
CALIBRATED_MEASURED = (
    "per key, from parity calibrate --write (the spread under other ISA caps, device counts, "
    "process layouts and a repeat, recorded in the golden file)"
)


def _frozen_registry(*classes: ToleranceClass) -> Mapping[str, ToleranceClass]:
    return types.MappingProxyType({c.name: c for c in classes})


#: The named classes. Read-only: to add classes, build your own dict
#: (`{**REGISTRY, "mine": ToleranceClass(...)}`) and pass it where a registry is taken.
REGISTRY: Mapping[str, ToleranceClass] = _frozen_registry(
    ToleranceClass(
        "bitwise",
        Bitwise(),
        meaning="nothing: same dtype, shape and bytes (NaN payloads and the sign of zero count)",
        measured="by definition",
    ),
    ToleranceClass(
        "fp32_reassoc",
        Close(atol=2e-5),
        meaning="fp32 reassociation of sums: scan against unrolled loop, fused against split",
        measured=(
            "production: taps against the unrolled forward within 1.7e-5 abs. Subject (AVX2, "
            "fp32): scan against unrolled, 600 hypothesis examples, worst tap 2.4e-6 abs, "
            "worst logit 1.1e-5 abs; live differential on the golden models 3.8e-6 abs"
        ),
    ),
    ToleranceClass(
        "fp32_reassoc_scaled",
        RelativeToMax(k=4e-6),
        meaning=(
            "fp32 reassociation on arrays whose scale varies (random configurations, tied "
            "heads): |a-b| within a fixed share of the array's largest magnitude"
        ),
        measured=(
            "scan against unrolled, 600 hypothesis examples over random GLU configurations "
            "(AVX2, fp32): worst tap 7.4e-7 of the tap's largest magnitude, worst logits "
            "6.2e-7 of the largest logit; 4e-6 (about 34 fp32 ulps of the largest "
            "magnitude) leaves a factor 5"
        ),
    ),
    ToleranceClass(
        "trajectory",
        Close(atol=5e-6),
        meaning="3 training steps whose fp32 reassociation propagates through the updates",
        measured=(
            "production: 3-step trajectories within 3.9e-6 abs. Subject (tiny GLU, AVX2): "
            "remat 'nothing'/'dots' against none, worst 9.5e-7 on metrics and component/CI "
            "leaves, 3.3e-6 on the PGD sources"
        ),
    ),
    ToleranceClass(
        "device_count",
        Close(atol=1e-7, rtol=1e-4),
        meaning="1 against 4 data-parallel devices: reductions split and summed in another order",
        measured=(
            "production: 1 against 4 devices within 1e-4*|a| + 1e-7 (here relative to the "
            "golden |b|). Subject (tiny GLU, 3 steps): train metrics within 3e-8, toy "
            "outputs 2.4e-7 abs / 2.7e-6 rel"
        ),
    ),
    ToleranceClass(
        "eval_metric",
        Close(atol=4e-6, rtol=1e-4),
        meaning=(
            "eval metrics that are differences of two cross-entropies (~4.2, ulp 4.8e-7): "
            "a few ulps of each CE, plus device_count's relative part"
        ),
        measured=(
            "1 against 4 devices, tiny GLU: worst |a-b| 1.17e-6 (ce_diff/random, value -8.1e-3), "
            "the cancellation of two CEs near 4.2; 8 ulp of 4.2 is 3.8e-6"
        ),
    ),
    ToleranceClass(
        "compile_budget",
        Budget(rtol=0.02),
        meaning=(
            "compile statistics (HLO bytes, instruction counts) at most 2% above the pinned "
            "budget; a shrink passes with the note 'below budget: repin to ratchet it down'"
        ),
        measured="HLO bytes and instruction counts are deterministic for a fixed jax/XLA build",
    ),
    ToleranceClass(
        "reduction",
        Reduction(k=REDUCTION_K),
        meaning=(
            "reassociation of a length-K reduction (declare K per key: 'reduction[K=512]'): "
            "|a-b| <= k*sqrt(K)*u*max|b|, u the unit roundoff of the golden's dtype"
        ),
        measured=REDUCTION_MEASURED,
    ),
    ToleranceClass(
        "calibrated",
        Calibrated(k=CALIBRATED_K, floor_ulps=CALIBRATED_FLOOR_ULPS),
        meaning=(
            "the key's own measured noise: |a-b| <= max(floor, k * the largest spread benign "
            "perturbations of the environment gave it), as calibrate recorded it"
        ),
        measured=CALIBRATED_MEASURED,
    ),
    ToleranceClass(
        "bf16_logits",
        LogitKL(tau=BF16_KL_TAU, top_k=5, p=0.6),
        meaning=(
            "bf16 logits as distributions: per-position KL(golden||actual) and top-5 "
            "agreement, where bitwise is impossible (bf16 against fp32, another framework)"
        ),
        measured=BF16_LOGITS_MEASURED,
    ),
)


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


def get_class(name: str, registry: Mapping[str, ToleranceClass] = REGISTRY) -> ToleranceClass:
    """Look a class up by name.

    **Arguments:**

    - `name`: the class name, optionally with rule parameters (`"reduction[K=512]"`: the
      class `reduction` with `K=512`).
    - `registry`: where to look; defaults to `REGISTRY`.

    **Returns:** the `ToleranceClass`; raises `UnknownClassError` (a `KeyError`) listing the
    known names when `name` is not there, or naming the parameter a class needs and was
    not given, and `ValueError` when the class found under `name` is named otherwise.
    """
    tol = _lookup(name, registry)
    missing = tol.rule.missing()
    if missing:
        base, _ = parse_class_name(name)
        example = ",".join(f"{m}=<number>" for m in missing)
        raise UnknownClassError(
            f"tolerance class {name!r} needs {missing} set per key in the class map "
            f"(its rule is {tol.describe_allowed()}); write it as '{base}[{example}]', "
            f"for example ('taps.*', '{base}[{missing[0]}=512]')"
        )
    return tol


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


def effective_atol(tol: ToleranceClass, golden: Any) -> float:
    """The absolute tolerance `tol` gives against `golden`.

    **Arguments:**

    - `tol`: the class.
    - `golden`: the golden array.

    **Returns:** for a `Close` rule its `atol`, or, when `atol_ulps` is set and the golden
    is a float array, `atol_ulps * spacing(max finite |golden|)` in the golden's dtype (the
    spacing at 0 when the golden has no finite element); 0.0 for other rules.
    """
    rule = tol.rule
    if not isinstance(rule, Close):
        return 0.0
    g = np.asarray(golden)
    if rule.atol_ulps is not None and not is_float_dtype(g.dtype):
        return 0.0
    return rule.effective_atol(
        Scale.of(g, to_float64(g)) if rule.atol_ulps is not None else Scale(g.dtype, 0.0)
    )
