"""Keys renamed as one: a refactor that moves a module (`encoder` becomes `backbone`)
renames every key under it, and no number moved.

A rename rule `"encoder=backbone"` (or the pair `("encoder", "backbone")`) says that the
tree's key `backbone.<rest>` is the expected side's `encoder.<rest>`. `renamed` gives such a
key of the tree its expected name where the expected side holds that name and the tree does
not, so it is judged under that key's class and named by it. Where no rule is declared,
`renaming_offer` recognises a missing key that a new key of the same shape and dtype, with
the same trailing segments, seems to replace, and says the rule that would compare them; a
key that is truly gone finds no such key and stays a failure.

Plain Python: no array is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Rename", "parse_renames", "renamed", "renaming_offer"]


@dataclass(frozen=True)
class Rename:
    """One rename rule. **Fields:** `old` (the expected side's key prefix) and `new` (the
    tree's)."""

    old: str
    new: str

    def expected_name(self, key: str) -> str | None:
        """The expected side's name of the tree's `key` under this rule, else None."""
        return _moved(key, self.new, self.old)

    def new_name(self, key: str) -> str | None:
        """The tree's name of the expected side's `key` under this rule, else None."""
        return _moved(key, self.old, self.new)


def _moved(key: str, prefix: str, to: str) -> str | None:
    """`key` with its leading `prefix` (whole segments) replaced by `to`, else None."""
    if key == prefix or key.startswith(prefix + "."):
        return to + key[len(prefix) :]
    return None


def parse_renames(rules: Sequence[str | Sequence[str]] | str | None) -> tuple[Rename, ...]:
    """The rules of `rules` (`"old=new"` strings or `(old, new)` pairs; None: none); a
    `ValueError` says the expected form."""
    if rules is None:
        return ()
    if isinstance(rules, str):
        rules = [rules]
    out = []
    for rule in rules:
        old, new = rule.split("=", 1) if isinstance(rule, str) and "=" in rule else (None, None)
        if not isinstance(rule, str) and len(rule) == 2:
            old, new = rule
        if not old or not new or old.strip() != old or new.strip() != new:
            raise ValueError(
                f"rename rule {rule!r}: expected 'old=new' (or the pair ('old', 'new')): the "
                "expected side's key prefix, then the tree's, such as 'encoder=backbone'"
            )
        out.append(Rename(old, new))
    return tuple(out)


def renamed(
    tree: Mapping[str, Any], expected: Mapping[str, Any], rules: Sequence[Rename]
) -> dict[str, Any]:
    """`tree` with each key a rule renames given its expected name, where `expected` holds
    that name and `tree` does not, in its place."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        names = (r.expected_name(key) for r in rules) if key not in expected else ()
        old = next((n for n in names if n is not None and n in expected and n not in tree), key)
        out[old] = value
    return out


def renaming_offer(
    missing: Mapping[str, tuple[tuple[int, ...], str]],
    new: Mapping[str, tuple[tuple[int, ...], str]],
) -> dict[str, tuple[str, str, str]]:
    """The missing keys a new key seems to replace: missing key -> `(old prefix, new
    prefix, new key)`, where exactly one new key of the same shape and dtype shares the
    longest run of trailing segments with it (one at least, never the whole key), and the
    prefixes differ.

    **Arguments:** `missing` (each key in the expected side only -> its `(shape, dtype)`),
    `new` (each key in the actual side only -> its `(shape, dtype)`).
    """
    out: dict[str, tuple[str, str, str]] = {}
    for key, form in missing.items():
        parts = key.split(".")
        best, found = 0, []
        for other, other_form in new.items():
            if other_form != form:
                continue
            theirs = other.split(".")
            n = 0
            while n < min(len(parts), len(theirs)) - 1 and parts[-1 - n] == theirs[-1 - n]:
                n += 1
            if n == 0:
                continue
            if n > best:
                best, found = n, [other]
            elif n == best:
                found.append(other)
        if len(found) == 1:
            other = found[0]
            old_prefix = ".".join(parts[: len(parts) - best])
            new_prefix = ".".join(other.split(".")[: len(other.split(".")) - best])
            if old_prefix != new_prefix:
                out[key] = (old_prefix, new_prefix, other)
    return out
