"""Tolerance classes as data: what a refactor may change in an array.

A class is a name, a rule (an object of `parity.judge._fixed_rules` or
`parity.judge._measured_rules`: `Bitwise`, `OpByOp`, `Ulp`, `Close`, `RelativeToMax`, `Reduction`,
`Calibrated`, `Budget`, `LogitKL`),
one line saying what it tolerates and the measurement that set its threshold
(`ToleranceClass`, JSON-safe both ways). `REGISTRY` holds the named classes, each with the
measurement behind its bound. Under every class dtypes and shapes are strict (float32
against a float64 expected array is a mismatch, never a cast), NaN and inf (with its sign)
must sit at the same positions, and integer and bool arrays are compared exactly: the checking
itself lives in `parity.judge._compare`, the arithmetic of each rule in its rule. Which class
a key gets, and class names with parameters, are `parity.judge._tolerance`'s.

This module imports the rules alone (and through them numpy); jax arrays never reach it.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from parity.judge._fixed_rules import Bitwise, Close, OpByOp, RelativeToMax, UpToRounding
from parity.judge._measured_rules import Budget, Calibrated, LogitKL, Reduction
from parity.judge._registry import rule_from_dict
from parity.judge._rule_base import Rule

__all__ = [
    "BF16_KL_TAU",
    "CALIBRATED_FLOOR_ULPS",
    "CALIBRATED_K",
    "REDUCTION_K",
    "REGISTRY",
    "ToleranceClass",
]

_CLASS_FIELDS = ("name", "rule", "meaning", "measured")


@dataclass(frozen=True)
class ToleranceClass:
    """A named rule for how far an array may move from its expected one.

    **Arguments:**

    - `name`: the class name, as the class map and reports spell it.
    - `rule`: a `parity.judge._rule_base.Rule`, e.g. `Close(atol=2e-5)` or `Ulp(max_ulp=2)`.
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
                f"tolerance class {self.name!r}: rule must be a parity.Rule object "
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
        `"|a-b| <= 2 ulp(max|b|) + 0*|b|"`, with `b` the expected value.
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

        - `data`: a mapping with `name`, `rule` (a kind of `parity.judge._registry.RULES`),
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
        from parity.judge._registry import RULES

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
#: the expected array's largest magnitude (docs/design.md, "Tolerance from measured noise").
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
        "op_by_op",
        OpByOp(),
        meaning=(
            "how XLA compiled the same operations (fusion, GEMM blocking, a scan for an "
            "unrolled loop): bits may differ only where both programs, run op by op on the "
            "same inputs, compute this key from values equal bit for bit; no tolerance"
        ),
        measured="by proof: every operation recomputed on its own, on this machine",
    ),
    ToleranceClass(
        "up_to_rounding",
        UpToRounding(),
        meaning=(
            "what op_by_op admits, and a refactor that reorders arithmetic (a fused "
            "projection, a sum in another order): each operation, computed again on the "
            "base's own values, gives the base's value within that operation's own rounding; "
            "no tolerance"
        ),
        measured=(
            "by proof: each operation's IEEE rounding bound from its operands (Higham's "
            "gamma_n), on the base's values, on this machine"
        ),
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
            "production: 3-step trajectories within 3.9e-6 abs. Subject (the pinned "
            "trajectories' tiny GLU, AVX2): remat 'nothing'/'dots' against none, worst 2.8e-6 "
            "on state leaves and metrics (a CI weight), 1.6e-6 on the PGD sources"
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
