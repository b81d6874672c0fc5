"""The guide rendered from a walk (`render`), and compared with the committed one
(`difference`).

**Figures.** `<!-- guide:figure NAME REGEX -->FIGURE<!-- /guide:figure -->`, inline in
prose, is a figure quoted from what run block NAME printed (group 1 of REGEX's first match
there), rewritten from every fresh run; so the prose's numbers are its output's, and a
committed figure that disagrees with the output fails `--check` as a changed output line
does.

**Processors.** Figures (values, ulps, spreads) are XLA's on the processor that ran the
walk: kernels differ between processors, so their last digits do. `--write` records that
processor in a `<!-- guide:host ... -->` line under the title (`with_host`); `--check` on
the same processor compares everything, on another every word, command, key and verdict
but no number (`masked`).

Imports parity only in `this_host`.
"""

from __future__ import annotations

import difflib
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from guide.parse import PROMPT, Block, GuideError
from guide.walk import Walk

__all__ = [
    "FIGURE",
    "HOST_MARKER",
    "difference",
    "fill_figures",
    "masked",
    "render",
    "this_host",
    "with_host",
    "write_atomically",
    "written_on",
]

#: A figure the prose quotes from a run block's output: `<!-- guide:figure BLOCK REGEX -->`
#: then the figure, then `<!-- /guide:figure -->` (both invisible once rendered). `render`
#: puts group 1 of REGEX's first match in what BLOCK printed in its place.
FIGURE = re.compile(r"<!-- guide:figure (\S+) (.+?) -->(.*?)<!-- /guide:figure -->")


def fill_figures(text: str, done: Walk) -> str:
    """`text` with every figure its prose quotes (`FIGURE`) taken from what the named run
    block printed in `done`: the prose cannot disagree with its own output, on any
    processor. A figure whose pattern matches nothing, or names a block that printed
    nothing, is a `GuideError`."""
    printed: dict[str, list[str]] = {}
    for step in done.steps:
        printed.setdefault(step.block, []).extend(step.shown)

    def fill(m: re.Match[str]) -> str:
        block, pattern = m.group(1), m.group(2)
        found = re.search(pattern, "\n".join(printed.get(block, ())), re.MULTILINE)
        if found is None:
            raise GuideError(
                f"the prose quotes a figure /{pattern}/ from run block {block!r}, which "
                "printed no such line; fix the pattern or the prose"
            )
        return f"<!-- guide:figure {block} {pattern} -->{found.group(1)}<!-- /guide:figure -->"

    return FIGURE.sub(fill, text)


def render(text: str, blocks: Sequence[Block], done: Walk) -> str:
    """The guide `text` with each run block's body replaced by its commands and what they
    printed (normalised), and each figure its prose quotes taken from that output
    (`fill_figures`)."""
    lines = text.split("\n")
    for block in sorted((b for b in blocks if b.kind == "run"), key=lambda b: -b.first):
        body: list[str] = []
        for step in (s for s in done.steps if s.block == block.arg):
            body.append(PROMPT + step.command)
            body.extend(step.shown)
        lines[block.first : block.stop] = [block.indent + ln if ln else ln for ln in body]
    return fill_figures("\n".join(lines), done)


#: The marker naming the processor whose run wrote the guide's console blocks.
HOST_MARKER = re.compile(r"^<!-- guide:host (.*) -->$", re.MULTILINE)
#: A number as the commands print it (not a digit inside a key such as `acts.1`).
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w])")


def this_host() -> str:
    """The processor of this machine as provenance records it (vendor, family, model and
    vector instruction sets): what XLA's kernels, and so the printed figures, depend on."""
    from parity.store._provenance import collect_provenance

    return str(collect_provenance().cpu)


def written_on(text: str) -> str | None:
    """The processor the guide's `<!-- guide:host ... -->` marker names, if any."""
    found = HOST_MARKER.search(text)
    return found.group(1) if found else None


def with_host(text: str, host: str) -> str:
    """`text` with its host marker naming `host` (added after the title if missing)."""
    line = f"<!-- guide:host {host} -->"
    if HOST_MARKER.search(text):
        return HOST_MARKER.sub(lambda _: line, text, count=1)
    title, _, rest = text.partition("\n")
    return f"{title}\n{line}\n{rest}"


def masked(text: str) -> str:
    """`text` with every printed number `<n>` and runs of spaces as one (table columns
    widen with their numbers): what a run on another processor must still print alike."""
    out = []
    for line in text.splitlines(keepends=True):
        out.append(re.sub(r" {2,}", " ", _NUMBER.sub("<n>", line)))
    return "".join(out)


def difference(committed: str, fresh: str, *, numbers: bool = True) -> str:
    """A unified diff from the committed guide to the freshly rendered one ('' if equal).

    With `numbers` False (a run on another processor than the one that wrote the guide:
    XLA's kernels, and so the last digits of every figure, differ between processors),
    numbers are left out of the comparison; commands, words, keys and verdicts are not."""
    if not numbers:
        committed, fresh = masked(committed), masked(fresh)
    return "".join(
        difflib.unified_diff(
            committed.splitlines(keepends=True),
            fresh.splitlines(keepends=True),
            "docs/adopting.md (committed)",
            "docs/adopting.md (fresh run)",
        )
    )


def write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
