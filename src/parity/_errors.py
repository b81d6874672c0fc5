"""The root of every error a user of parity can meet: `ParityError`.

Each error parity raises for input it cannot use (a golden file, a class name, a
configuration, a commit, a producer that cannot run) is a `ParityError`, besides the
built-in class it has always been (a `KeyError` for an unknown class name, a `ValueError`
for a program that cannot be recorded, ...), so a caller can catch either. Its message says
what is wrong and what to do; the command line prints it as one line (`ParityError.line`)
and exits with its `exit_code` (2: input parity cannot use). One is no error in its input:
`parity.NotEquivalent`, `assert_equivalent`'s failure, an `AssertionError` carrying its
comparison (exit code 1, as a failing check). This module imports nothing of parity: every
layer may raise one.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["ParityError"]


class ParityError(Exception):
    """Input parity cannot use, or a run it cannot complete, said in one line.

    **Class attributes:** `exit_code`, the command line's exit status for it (2).

    **Example:**

    ```python
    try:
        parity.check_group(outputs, "forward", goldens="goldens")
    except parity.ParityError as e:
        print(e.line)  # one line: what is wrong and what to do
    ```
    """

    exit_code: ClassVar[int] = 2

    @property
    def line(self) -> str:
        """The message on one line, as the command line prints it."""
        return " ".join(str(self).split())
