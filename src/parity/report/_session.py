"""The checks of one session (a `parity check` run, a pytest session) reported as one: the
merged findings, the table, the JSON document and the report folder. `parity check` and the
pytest plugin both build one and print or write what it gives; `parity diff` builds one of
its single comparison (`ReportSession.whole`). The JSON and HTML writers load only when a
session writes them, so that a command that prints the table alone loads neither."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity.judge._compare import Comparison
from parity.report._summary import Checks
from parity.report._text import format_table

if TYPE_CHECKING:
    from parity._results import CheckResult

__all__ = ["CHECK_FIELDS", "ReportSession", "merged_findings"]

#: What the JSON document adds to each check's entry, from its `CheckResult`.
CHECK_FIELDS = (
    "group",
    "passed",
    "produce_s",
    "load_s",
    "compare_s",
    "saved",
    "origin",
    "origin_line",
)


def _jsonable(r: CheckResult, name: str) -> Any:
    """A result's field as its JSON entry carries it (the origin: its fields flat)."""
    if name == "origin":
        return None if r.origin is None else r.origin.json_origin()
    return getattr(r, name)


def merged_findings(results: Sequence[CheckResult]) -> Comparison:
    """Every finding of the session, keyed `<check>/<key>`: groups can share keys (two
    train groups pin the same leaves), and a key means nothing without its check; not
    exact where a check is not, each such check named."""
    return Comparison(
        tuple(
            dataclasses.replace(f, key=f"{r.name}/{f.key}")
            for r in results
            for f in r.comparison.findings
        ),
        inexact="; ".join(
            f"{r.name}: {r.comparison.inexact}" for r in results if r.comparison.inexact
        ),
    )


@dataclasses.dataclass(frozen=True)
class ReportSession:
    """The checks of one session, in the order they ran, and the header of their report.

    **Fields:** `results` (the `CheckResult`s), `header` (the report's header lines),
    `merged` (`merged_findings(results)`, worked out once) and `per_check` (whether the
    report names a first divergence per check; `False` for a session of one comparison
    reported whole, `whole`).
    """

    results: tuple[CheckResult, ...]
    header: dict[str, str]
    merged: Comparison
    per_check: bool = True

    @classmethod
    def of(cls, results: Sequence[CheckResult], header: dict[str, str]) -> ReportSession:
        """The session of `results` (in the order they ran) under `header`."""
        return cls(tuple(results), header, merged_findings(results))

    @classmethod
    def whole(cls, comparison: Comparison, header: dict[str, str]) -> ReportSession:
        """The session of one comparison under `header`, reported whole: its keys as they
        are, its first divergence over all of them, no check entries (`parity diff`)."""
        return cls((), header, comparison, per_check=False)

    @property
    def checks(self) -> list[tuple[str, Comparison]]:
        """(name, comparison) of each check, in the order they ran."""
        return [(r.name, r.comparison) for r in self.results]

    @property
    def _by_check(self) -> Checks | None:
        """What the writers take as `checks`: each check's comparison, or `None` for a
        comparison reported whole."""
        return self.checks if self.per_check else None

    @property
    def origins(self) -> dict[str, str]:
        """Check name -> its `origin:` line, for the checks that have one."""
        return {r.name: r.origin_line for r in self.results if r.origin_line}

    def table(self, *, failing_checks_only: bool = False, failures: bool = True) -> str:
        """`format_table` of the merged findings, a first divergence (and an `origin:`
        line where there is one) per check."""
        return format_table(
            self.merged,
            header=self.header,
            checks=self._by_check,
            failing_checks_only=failing_checks_only,
            failures=failures,
            origins=self.origins,
        )

    def to_json(self, fields: Sequence[str] = CHECK_FIELDS) -> dict[str, Any]:
        """`to_json` of the merged findings, each check's entry with `fields` of its result."""
        from parity.report._jsondoc import to_json

        doc = to_json(self.merged, header=self.header, checks=self._by_check)
        if self.per_check:
            for entry, r in zip(doc["checks"], self.results, strict=True):
                entry |= {name: _jsonable(r, name) for name in fields}
        return doc

    def write_json(self, path: Path, doc: dict[str, Any]) -> None:
        """Write `doc` (from `to_json`) to `path`: indented, keys sorted; a comparison
        reported whole as `parity.report.write_json` writes one (strict, in its order)."""
        if self.per_check:
            path.write_text(json.dumps(doc, indent=1, sort_keys=True))
        else:
            from parity.report._jsondoc import json_text

            path.write_text(json_text(doc), encoding="utf-8")

    def write_folder(
        self,
        folder: Path,
        *,
        title: str | None = None,
        fields: Sequence[str] = CHECK_FIELDS,
        complete: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """Write `report.txt`, `index.html` (titled `title`, else `write_html`'s default) and
        `report.json` into `folder`, made if missing.

        **Arguments:**

        - `folder`: the report folder.
        - `title`: the HTML page's title.
        - `fields`: what each check's JSON entry takes from its result.
        - `complete`: called with the JSON document before it is written, to add to it
          (the plugin's timing, which includes writing the text and the page).
        """
        from parity.report._html import write_html

        folder.mkdir(parents=True, exist_ok=True)
        (folder / "report.txt").write_text(self.table() + "\n")
        html_title = {} if title is None else {"title": title}
        origins = {r.name: r.origin for r in self.results if r.origin is not None}
        write_html(
            folder,
            self.merged,
            header=self.header,
            checks=self._by_check,
            origins=origins,
            **html_title,
        )
        doc = self.to_json(fields)
        if complete is not None:
            complete(doc)
        self.write_json(folder / "report.json", doc)
