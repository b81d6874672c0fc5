"""The workflows that run producers: the code of a commit, in fresh processes (through
`parity.machinery`, the process machinery below), and what is built on that.

`produced` produces and checks, `tree` checks the current tree from a typed request
(what `parity check` does once its flags are read), `repin` pins what a run saved
(`goldens`: the files it writes), `baseline` re-produces a golden group at its base commit
here (its baseline), `recordings` keeps what a recording run made, `origins` settles a
failing check op by op (proves and names its origin), `bisection` searches on top
(measuring the environment's noise is `parity.calibration`'s, which sits above this
layer). It may import numpy, the layers below it (`parity.machinery`, `parity.judge`,
`parity.store`, `parity.report`, the core: `parity.check`, `parity.calibrated`,
`parity._results`, and the leaves); jax only lazily, inside a function that runs once jax
is wanted; never decomp, nor the faces above it (`parity.commands`,
`parity.pytest_plugin`, `parity._cli`, `parity._assertions`):
`tests/parity/test_import_boundaries.py` holds it to that. Nothing is re-exported: its
modules are private (`_tree`, ...), imported by name by the faces, never by a user.
"""
