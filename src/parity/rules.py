"""The old path of `parity.judge.rules`, kept while `tests/decomp` imports from it.

New code imports `parity.judge.rules`; remove this module once nothing outside `src/parity`
names the old path (issue 23).
"""

from parity.judge.rules import *  # noqa: F403
from parity.judge.rules import __all__ as __all__
