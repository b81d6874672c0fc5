"""Reports of a `Comparison`: a terminal table, JSON for machines, an HTML page with plots.

The table gives, per tolerance class, how many arrays passed and the worst figures, then
where the two runs part ways (the first key that is not bitwise equal, the first that
breaks its class), then every failing key with its reason. The HTML page adds, per class,
a plot of each key's error along the forward order against the allowed band.

`summary` (what every report shares), `text`, `jsondoc` and `html` (the three forms) and
`session` (the checks of one session reported as one, for `parity check` and the pytest
plugin). It may import numpy and `parity.judge`, the layer below it; `rich` (colour on a
terminal) and `matplotlib` (plots) only lazily; never jax, h5py or decomp, nor its sibling
`parity.store` or a layer above it (the core, `parity.run`, the faces):
`tests/parity/test_import_boundaries.py` holds it to that. This package re-exports the
public names: the table's (`summary`, `text`) load with it; those of `jsondoc`, `html` and
`session` load their module on first use, and the session loads the two writers only to
write, so that a command that prints only the table (`parity diff` without `--json` or
`--report`) loads neither writer (`tests/parity/test_cli.py`).
"""

import importlib
from typing import TYPE_CHECKING, Any

from parity.report.summary import ClassSummary, summarize
from parity.report.text import format_table, print_report, text_table

if TYPE_CHECKING:
    from parity.report.html import write_html
    from parity.report.jsondoc import JSON_SCHEMA, to_json, write_json
    from parity.report.session import ReportSession, merged_findings

#: The names that load their module on first use, name -> the module that defines it (the
#: `if TYPE_CHECKING:` imports above say the same for type checkers).
_LAZY = {
    "write_html": "parity.report.html",
    "JSON_SCHEMA": "parity.report.jsondoc",
    "to_json": "parity.report.jsondoc",
    "write_json": "parity.report.jsondoc",
    "ReportSession": "parity.report.session",
    "merged_findings": "parity.report.session",
}

__all__ = [
    "JSON_SCHEMA",
    "ClassSummary",
    "ReportSession",
    "format_table",
    "merged_findings",
    "print_report",
    "summarize",
    "text_table",
    "to_json",
    "write_html",
    "write_json",
]


def __getattr__(name: str) -> Any:
    """A name of `_LAZY`, its module imported on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'parity.report' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
