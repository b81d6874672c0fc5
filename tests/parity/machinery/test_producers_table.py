"""The producers file's table is read in one place (issue 72): `ProducersTable.of_module`
in the producer process, crossed as JSON whole, and a check's own rules given over it by
one rule for every face (an explicit `stack=` or `rename=` replaces the producers')."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from parity.machinery._producers_table import ProducersTable
from parity.machinery._runner_output import RunnerOutput
from parity.run._produced import Produced


def test_the_table_is_read_from_the_module_and_crosses_json_whole(tmp_path: Path) -> None:
    module = SimpleNamespace(
        GROUPS={},
        CLASS_MAP=[("taps.*", "fp32_reassoc")],
        STACK="params.blocks.{i}",  # one rule, not a sequence of characters
        RENAME=[("params.encoder", "params.backbone"), "head=lm_head"],
    )
    table = ProducersTable.of_module(module)
    assert table == ProducersTable(
        class_map=(("taps.*", "fp32_reassoc"),),
        stack=("params.blocks.{i}",),
        rename=(("params.encoder", "params.backbone"), "head=lm_head"),
    )
    assert ProducersTable.from_json_dict(json.loads(json.dumps(table.to_json_dict()))) == table
    table.write(tmp_path)
    assert ProducersTable.read(tmp_path) == table
    assert ProducersTable.of_module(SimpleNamespace(GROUPS={})) == ProducersTable()


def test_a_check_s_own_rules_replace_the_producers_and_none_keeps_them() -> None:
    table = ProducersTable(stack=("blocks.{i}",), rename=("a=b",))
    assert table.given() == table
    assert table.given(stack="layers.{i}").stack == ("layers.{i}",)
    assert table.given(stack="layers.{i}").rename == ("a=b",)
    assert table.given(rename=[["x", "y"]]).rename == (("x", "y"),)
    assert table.given(stack=[]).stack == ()  # said empty: no stacking


def test_a_run_s_table_is_the_same_for_every_group() -> None:
    from parity.store import Provenance

    table = ProducersTable(stack=("blocks.{i}",))
    runs = {g: RunnerOutput({}, Provenance(), table=table) for g in ("a", "b")}
    assert Produced(runs, 0.0, "").table == table
    assert Produced({}, 0.0, "").table == ProducersTable()
