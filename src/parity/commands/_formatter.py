"""`Formatter`, the help formatter of every `parity` parser.

argparse builds a formatter for every argument it adds (to check its metavar), and its
`HelpFormatter` imports `shutil` for the terminal's width, and with it the compression
modules (~1.7 ms of a small `parity diff`, measured with `tools/bench_startup.py`).
`Formatter` is argparse's `RawDescriptionHelpFormatter` (descriptions kept as written)
with the width read as `shutil.get_terminal_size` reads it, by `columns`.
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["Formatter", "columns"]


def columns() -> int:
    """The terminal's width as `shutil.get_terminal_size` reads it: `COLUMNS` where it is a
    positive number, else the width of the terminal on standard output, else 80."""
    try:
        width = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        width = 0
    if width <= 0:
        try:
            width = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            width = 0
    return width or 80


class Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's `RawDescriptionHelpFormatter`, its default width (the terminal's, less 2,
    as argparse computes it) read by `columns`."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        width = columns() - 2 if width is None else width
        super().__init__(prog, indent_increment, max_help_position, width)
