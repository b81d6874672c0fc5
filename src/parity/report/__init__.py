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
public names.
"""

from parity.report.html import write_html
from parity.report.jsondoc import JSON_SCHEMA, to_json, write_json
from parity.report.session import ReportSession, merged_findings
from parity.report.summary import ClassSummary, summarize
from parity.report.text import format_table, print_report, text_table

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
