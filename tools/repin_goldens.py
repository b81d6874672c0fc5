#!/usr/bin/env python
"""Repin the goldens at a git base commit: a thin entry to `parity repin`.

    python tools/repin_goldens.py --base SHA [--goldens DIR] [--groups a,b] [--keep-worktree]
    python tools/repin_goldens.py --recover [--goldens DIR]

Every flag is `parity repin`'s (`parity repin --help`), read with this repository's
`[tool.parity]` (goldens/, tests/equivalence/producers.py, src, 1 simulated CPU device,
the XLA ISA capped at AVX2): the producers (current tree) run in a fresh process against
the code of a detached worktree at SHA in a temporary folder; your working tree, index
and branches are not touched. The new files replace the old ones only once every group
has been produced; a repin killed at any moment (even SIGKILL) leaves the old goldens or
the complete new ones, and the next repin, or `--recover`, finishes its replace (see
src/parity/store/_staging.py). Exit codes are `parity repin`'s: 0 pinned, 2 repinning
failed (old goldens untouched), 130 on Ctrl-C.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    from parity._cli import main as parity_main

    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return parity_main(["repin", "--help"])
    if not Path.cwd().resolve().is_relative_to(ROOT):
        os.chdir(ROOT)  # this repository's [tool.parity], wherever the tool is started
    try:
        return parity_main(["repin", *args])
    except KeyboardInterrupt:
        print("repin interrupted; old goldens untouched, worktree removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
