# ruff: noqa: I001
"""`parity.report`'s public names, written once: type checkers read this stub in place of
`__init__.py`, which hands it to `lazy_loader.attach_stub` (as `parity`'s own
`__init__.pyi`), so each name loads its module on first use."""

# the table: per-class summaries and the text forms
from ._summary import ClassSummary as ClassSummary, summarize as summarize
from ._text import (
    format_table as format_table,
    print_report as print_report,
    text_table as text_table,
)

# the writers, loaded only to write
from ._html import write_html as write_html
from ._jsondoc import (
    JSON_SCHEMA as JSON_SCHEMA,
    to_json as to_json,
    write_json as write_json,
)

# the checks of one session reported as one
from ._session import ReportSession as ReportSession, merged_findings as merged_findings

__all__: list[str]
