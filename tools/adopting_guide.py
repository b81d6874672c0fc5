#!/usr/bin/env python
"""docs/adopting.md as an executable document: its console blocks are what their commands
print, on a fresh throwaway project built from the guide's own file blocks.

    python tools/adopting_guide.py --check   # exit 1 with a unified diff if the guide drifted
    python tools/adopting_guide.py --write   # rewrite the console blocks from a fresh run
    python tools/adopting_guide.py --check --keep DIR   # leave the project in DIR/tinymlp

The parts live in tools/guide/: the markers (`guide.parse`: `guide:file`, `guide:edit`,
`guide:run`, `guide:install`), the walk and the environment its commands run in
(`guide.walk`), what is normalised in their output (`guide.normalise`), the figures the
prose quotes from that output and the comparison on another processor (`guide.render`),
and the install section's agreement with pyproject.toml and README.md (`guide.install`).

**One source for the files: the guide.** The tool reads the file contents from the guide's
blocks rather than writing them into it, so the guide reads as prose around code in the
order a user meets it, an edit shows only the function that changes (the `lax.scan`
refactor, the bug, the new class map), and whoever edits a block in the guide changes what
runs: there is no second copy of tinymlp to keep in step. Commands come from the guide as
well, so `--write` only ever replaces output lines and the figures quoted from them.

Exit 0: the guide matches (`--check`) or was rewritten (`--write`); 1: it differs, an
install sentence disagrees with pyproject.toml or README.md, or the commands left something
in their TMPDIR; 2: the walk itself failed (a command failed where the guide does not show
it, a marker is malformed).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

from guide import (
    GUIDE,
    ROOT,
    GuideError,
    difference,
    install_problems,
    parse,
    render,
    this_host,
    walk,
    with_host,
    write_atomically,
    written_on,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="docs/adopting.md's console blocks, checked against or rewritten from a "
        "fresh run of their commands on a throwaway project"
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff if it drifted")
    mode.add_argument("--write", action="store_true", help="rewrite the console blocks")
    parser.add_argument(
        "--keep", metavar="DIR", type=Path, help="walk in DIR (empty or new) and leave it"
    )
    args = parser.parse_args(argv)

    committed = GUIDE.read_text()
    try:
        blocks = parse(committed)
        problems = install_problems(
            committed,
            (ROOT / "README.md").read_text(),
            tomllib.loads((ROOT / "pyproject.toml").read_text()),
        )
        if problems:
            for p in problems:
                print(f"adopting_guide: {p}", file=sys.stderr)
            return 1
        root = args.keep or Path(tempfile.mkdtemp(prefix="adopting-guide-"))
        root.mkdir(parents=True, exist_ok=True)
        try:
            done = walk(blocks, root.resolve(), echo=lambda s: print(s, file=sys.stderr))
            left = sorted(p.name for p in done.tmp.iterdir())
        finally:
            if args.keep is None:
                shutil.rmtree(root, ignore_errors=True)
    except GuideError as e:
        print(f"adopting_guide: {e}", file=sys.stderr)
        return 2
    if left:
        print(f"adopting_guide: the commands left {left} in their TMPDIR", file=sys.stderr)
        return 1
    host = this_host()
    # Only a rewrite names this processor: a check on another one keeps the committed host
    # line, as tests/tools/test_adopting_guide.py does, and compares no figure.
    rendered = render(committed, blocks, done)
    fresh = with_host(rendered, host) if args.write else rendered
    same = written_on(committed) == host
    diff = difference(committed, fresh, numbers=same or args.write)
    if not same and not args.write:
        print(
            f"adopting_guide: written on another processor ({written_on(committed)}), so its "
            "figures are not compared here; commands, words, keys and verdicts are",
            file=sys.stderr,
        )
    if args.write:
        if diff:
            write_atomically(GUIDE, fresh)
        state = "rewritten" if diff else "unchanged"
        print(f"docs/adopting.md: {state} ({len(done.steps)} commands)")
        return 0
    if diff:
        sys.stdout.write(diff)
        print(
            "adopting_guide: docs/adopting.md differs from a fresh run; if the new output is "
            "right, run python tools/adopting_guide.py --write and fix the prose around it",
            file=sys.stderr,
        )
        return 1
    print(f"docs/adopting.md matches a fresh run ({len(done.steps)} commands)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
