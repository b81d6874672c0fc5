"""Stacked and per-layer keys compared as one (a layer loop turned into a `lax.scan` stacks
the layers' parameters: `blocks.0.attn.w` (32, 96) and `blocks.1.attn.w` become one
`blocks.attn.w` (2, 32, 96), and no number moved).

A stack rule is a key template whose last segment is `{i}`: `"blocks.{i}"` says that the
per-layer key `blocks.<i>.<rest>` is row `i` of the stacked key `blocks.<rest>` (the layers
on its leading axis). `unstack` splits, on either side of a comparison, each stacked key
whose rows the other side holds as per-layer keys, so both sides name the per-layer keys:
each row is judged under its per-layer key's class, and a report says which layer. A golden
check's keys are its goldens' (their classes, spreads and baselines are kept by key): where
the goldens hold a stacked key and the tree its rows per layer, `join_rows` stacks the tree's
rows into the golden's key, and a report's index leads with the layer. Where no rule is
declared, `stacking_offer` recognises keys on one side that are the rows of keys on the
other and says the rule that would compare them.

numpy only.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from parity.judge._chunks import read_whole

__all__ = [
    "StackRule",
    "join_rows",
    "parse_stack",
    "row_of",
    "rows_held",
    "split_stacked",
    "stacking_offer",
    "unstack",
]

_INDEX = "{i}"


@dataclass(frozen=True)
class StackRule:
    """One stack rule (module docstring). **Fields:** `template` (`"blocks.{i}"`) and
    `prefix`, the template without its `.{i}` (`"blocks"`)."""

    template: str
    prefix: str

    @classmethod
    def parse(cls, template: str) -> StackRule:
        """The rule of `template`; raises `ValueError` saying the expected form."""
        prefix = template.removesuffix("." + _INDEX)
        if prefix == template or not prefix or _INDEX in prefix:
            raise ValueError(
                f"stack rule {template!r}: expected a key template whose last segment is "
                "{i} and the only one, such as 'blocks.{i}' (blocks.<i>.<rest> is row i of "
                "blocks.<rest>)"
            )
        return cls(template, prefix)

    def layer(self, key: str) -> tuple[int, str] | None:
        """`(i, rest)` of a per-layer key of this rule, else None."""
        if not key.startswith(self.prefix + "."):
            return None
        index, _, rest = key[len(self.prefix) + 1 :].partition(".")
        return (int(index), rest) if index.isdigit() else None

    def rest(self, key: str) -> str | None:
        """The `<rest>` of a key of stacked form (`prefix` itself: `""`), else None."""
        if key == self.prefix:
            return ""
        return key[len(self.prefix) + 1 :] if key.startswith(self.prefix + ".") else None

    def per_layer(self, i: int, rest: str) -> str:
        """The per-layer key of row `i` of the stacked key of `rest`."""
        return f"{self.prefix}.{i}" + (f".{rest}" if rest else "")

    def stacked(self, rest: str) -> str:
        """The stacked key of `rest`."""
        return f"{self.prefix}.{rest}" if rest else self.prefix


def row_of(key: str, keys: Container[str], rules: Sequence[StackRule]) -> tuple[str, int] | None:
    """Where a per-layer `key` that `keys` lacks lies in them: `(stacked key, row)` under
    the first rule whose stacked key `keys` holds, else None."""
    for rule in rules:
        found = rule.layer(key)
        if found is not None and rule.stacked(found[1]) in keys:
            return rule.stacked(found[1]), found[0]
    return None


def parse_stack(templates: Sequence[str] | str | None) -> tuple[StackRule, ...]:
    """The rules of `templates` (one template or several; None: none)."""
    if templates is None:
        return ()
    if isinstance(templates, str):
        templates = [templates]
    return tuple(StackRule.parse(t) for t in templates)


def split_stacked(
    side: Mapping[str, Any], other: Mapping[str, Any], rules: Sequence[StackRule]
) -> dict[str, Any]:
    """`side` with each stacked key whose rows `other` holds as per-layer keys split into
    them, in its place."""
    if not rules:
        return dict(side)
    # Per rule, the last row `other` holds of each stacked key's rest, found once.
    last: list[dict[str, int]] = []
    for rule in rules:
        rows: dict[str, int] = {}
        for found in filter(None, map(rule.layer, other)):
            rows[found[1]] = max(found[0], rows.get(found[1], -1))
        last.append(rows)
    out: dict[str, Any] = {}
    for key, value in side.items():
        out |= {key: value} if key in other else _split(key, value, rules, last)
    return out


def _split(
    key: str, value: Any, rules: Sequence[StackRule], last: Sequence[Mapping[str, int]]
) -> dict[str, Any]:
    """`{key: value}`, or its rows under their per-layer keys where a rule makes `key` a
    stacked key whose rows the other side holds (up to `last[rule][rest]`)."""
    shape = tuple(getattr(value, "shape", ()))
    for rule, rows in zip(rules, last, strict=True):
        rest = rule.rest(key)
        if rest is not None and rest in rows and len(shape) >= 1 and shape[0] > rows[rest]:
            array = read_whole(value)
            return {rule.per_layer(i, rest): array[i] for i in range(shape[0])}
    return {key: value}


def rows_held(key: str, keys: Container[str], rules: Sequence[StackRule]) -> list[str]:
    """The per-layer keys that hold the rows of the stacked `key` in `keys`: rows 0, 1, ...
    up to the first row `keys` lacks, under the first rule that makes `key` a stacked key
    and finds its row 0 there; empty where none does."""
    for rule in rules:
        rest = rule.rest(key)
        if rest is None or rule.per_layer(0, rest) not in keys:
            continue
        held, i = [], 0
        while (row := rule.per_layer(i, rest)) in keys:
            held.append(row)
            i += 1
        return held
    return []


def join_rows(
    side: Mapping[str, Any], other: Mapping[str, Any], rules: Sequence[StackRule]
) -> dict[str, Any]:
    """`side` with the per-layer keys that are every row of a stacked key of `other` joined
    into that key (stacked on a leading axis, where the first of them stood): the goldens
    pinned after the layers were stacked, compared with a tree that has them per layer
    again, under the goldens' own keys and classes."""
    if not rules:
        return dict(side)
    joined: dict[str, list[str]] = {}
    for key, value in other.items():
        if key in side:
            continue
        held = rows_held(key, side, rules)
        shape = tuple(getattr(value, "shape", ()))
        if held and shape and shape[0] == len(held):
            joined[held[0]] = [key, *held]
    gone = {row for rows in joined.values() for row in rows[1:]}
    out: dict[str, Any] = {}
    for key, value in side.items():
        if key in joined:
            stacked, *rows = joined[key]
            out[stacked] = np.stack([read_whole(side[r]) for r in rows])
        elif key not in gone:
            out[key] = value
    return out


def unstack(
    actual: Mapping[str, Any], expected: Mapping[str, Any], rules: Sequence[StackRule]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both flat sides of a comparison with every stacked key split into the per-layer keys
    the other side holds (module docstring), in its place; without rules, as they are."""
    return split_stacked(actual, expected, rules), split_stacked(expected, actual, rules)


def stacking_offer(
    missing: Sequence[str], new: Mapping[str, tuple[int, ...]]
) -> dict[str, tuple[str, str, int]]:
    """The missing keys that are rows of new keys, stacked on a leading axis: missing key
    -> `(template, new key, row)`, where every row of that new key is a missing key.

    **Arguments:** `missing` (keys in the expected side only), `new` (keys in the actual
    side only, with their shapes).
    """
    found: dict[str, dict[int, str]] = {}
    template_of: dict[str, str] = {}
    for key in missing:
        parts = key.split(".")
        for j, part in enumerate(parts):
            if not part.isdigit() or j == 0:
                continue
            stacked = ".".join(parts[:j] + parts[j + 1 :])
            if stacked in new:
                found.setdefault(stacked, {})[int(part)] = key
                template_of[stacked] = ".".join(parts[:j]) + "." + _INDEX
                break
    out: dict[str, tuple[str, str, int]] = {}
    for stacked, rows in found.items():
        shape = new[stacked]
        if shape and shape[0] == len(rows) and sorted(rows) == list(range(shape[0])):
            out |= {k: (template_of[stacked], stacked, i) for i, k in rows.items()}
    return out
