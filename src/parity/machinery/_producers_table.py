"""The producers file's table (`ProducersTable`): its `CLASS_MAP`, `STACK` and `RENAME`,
read from the module in one place (`ProducersTable.of_module`, in the producer process,
`parity.machinery._producer_runner`) and crossed to the harness as JSON at one edge
(`to_json_dict` there, `from_json_dict` here): in every group's manifest
(`parity.machinery._runner_output.RunnerOutput.table`) and, where no group runs
(`--class-map-only`), alone in `OUT/table.json` (`read`). `parity check`, `repin
--classes-only` and the pytest plugin all read it so; a second reader of the module's
names would one day read a key differently. Nothing here imports jax.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

__all__ = ["TABLE_FILE", "ProducersTable", "RenameRule"]

#: What a `--class-map-only` run writes into its output folder: the table alone.
TABLE_FILE = "table.json"

#: A rename rule as the producers write it: `"old=new"`, or the pair `("old", "new")`
#: (`parity.judge._renames.parse_renames` reads both).
RenameRule = str | tuple[str, ...]


def _rules(module: Any, name: str) -> tuple[Any, ...]:
    """The module's list `name` (none where it defines none); a single string is one rule,
    not a sequence of characters."""
    value = getattr(module, name, ())
    return (value,) if isinstance(value, str) else tuple(value)


def _pairs(rules: Any) -> tuple[tuple[str, str], ...]:
    """`(pattern, class)` rules as tuples. A rule that is not a pair is refused where it is
    used (`class_problem`, the class map's own parser), in its words, not here as an
    unpacking error."""
    return cast("tuple[tuple[str, str], ...]", tuple(tuple(rule) for rule in rules))


def _rename(rule: Any) -> RenameRule:
    return rule if isinstance(rule, str) else tuple(str(part) for part in rule)


@dataclass(frozen=True)
class ProducersTable:
    """What a producers file declares besides its `GROUPS`.

    **Fields:**

    - `class_map`: its `CLASS_MAP`, `(pattern, class)` rules, pinned into the goldens by a
      repin (`parity.judge._tolerance.ClassMap`).
    - `stack`: its `STACK`, stack rules (`"params.blocks.{i}"`, `parity.judge._stacking`):
      a stacked key compared row by row with the per-layer goldens it replaces.
    - `rename`: its `RENAME`, rename rules (`parity.judge._renames`): a moved key compared
      with the golden key it replaces.
    """

    class_map: tuple[tuple[str, str], ...] = ()
    stack: tuple[str, ...] = ()
    rename: tuple[RenameRule, ...] = ()

    @classmethod
    def of_module(cls, module: Any) -> ProducersTable:
        """The table of an imported producers module (its names absent: empty rules).

        **Returns:** a `ProducersTable`.
        """
        return cls(
            class_map=_pairs(_rules(module, "CLASS_MAP")),
            stack=tuple(str(rule) for rule in _rules(module, "STACK")),
            rename=tuple(_rename(rule) for rule in _rules(module, "RENAME")),
        )

    def given(
        self,
        *,
        stack: Sequence[str] | str | None = None,
        rename: Sequence[str | Sequence[str]] | str | None = None,
    ) -> ProducersTable:
        """This table with a caller's own `stack` or `rename` rules (a check's options, in
        the forms `parity.check.check_group` takes) in place of the producers': an explicit
        rule wins, in `parity check` (`parity.run._produced.check_produced`) and the pytest
        plugin alike; None keeps the producers'.

        **Returns:** a `ProducersTable`.
        """
        stacks, renames = self.stack, self.rename
        if stack is not None:
            stacks = (stack,) if isinstance(stack, str) else tuple(str(r) for r in stack)
        if rename is not None:
            renames = (rename,) if isinstance(rename, str) else tuple(_rename(r) for r in rename)
        return replace(self, stack=stacks, rename=renames)

    def to_json_dict(self) -> dict[str, Any]:
        """As JSON (lists for tuples): the manifest's keys `class_map`, `stack`, `rename`."""
        return {
            "class_map": [list(rule) for rule in self.class_map],
            "stack": list(self.stack),
            "rename": [r if isinstance(r, str) else list(r) for r in self.rename],
        }

    @classmethod
    def from_json_dict(cls, doc: Mapping[str, Any]) -> ProducersTable:
        """The table `to_json_dict` wrote (a key absent: no rules of that kind).

        **Returns:** a `ProducersTable`.
        """
        return cls(
            class_map=_pairs(doc.get("class_map", ())),
            stack=tuple(str(rule) for rule in doc.get("stack", ())),
            rename=tuple(_rename(rule) for rule in doc.get("rename", ())),
        )

    def write(self, folder: Path) -> None:
        """Write the table alone to `folder/TABLE_FILE` (a run that runs no group)."""
        (folder / TABLE_FILE).write_text(json.dumps(self.to_json_dict()))

    @classmethod
    def read(cls, folder: Path) -> ProducersTable:
        """The table `write` left in `folder`.

        **Returns:** a `ProducersTable`. Raises `OSError` where there is none.
        """
        return cls.from_json_dict(json.loads((folder / TABLE_FILE).read_text()))
