"""The old path of `parity.judge.tolerance`, kept while `tests/decomp` imports from it.

New code imports `parity.judge.tolerance`; remove this module once nothing outside
`src/parity` names the old path (issue 23).
"""

from parity.judge.tolerance import *  # noqa: F403
from parity.judge.tolerance import __all__ as __all__
