"""Running producers: the code of a commit, in fresh processes, and what is built on that.

`config` (`[tool.parity]`), `devices` (simulated device counts and the ISA cap, set in
`XLA_FLAGS`), `signals` (SIGINT/SIGTERM that reach the main thread) and `worktree` (git)
are the ground; `processes` holds the one process supervisor and a multi-process run's
workers, `launcher` starts the producer process (`_producer_runner`, started by path) under
it, `repin` pins what it saved, `produced` produces and checks, `baseline` re-produces a
golden group at its base commit here (its baseline); `bisection` searches on top
(measuring the environment's noise is `parity.calibration`'s, which sits above this
layer). It may import numpy, the layers below
it (`parity.judge`, `parity.store`, `parity.report`, the core: `parity.check`,
`parity.calibrated`, `parity.results`, and the leaves `parity.xla_env`,
`parity.compile_stats`); jax only lazily, inside a function
that runs once jax is wanted; never decomp, nor the faces above it (`parity.commands`,
`parity.pytest_plugin`, `parity.cli`, `parity.assertions`):
`tests/parity/test_import_boundaries.py` holds it to that. Nothing is re-exported: import
each module by its name.
"""
