"""The process machinery: what runs the producers, apart from the workflows that use it
(`parity.run`).

`config` (`[tool.parity]`), `devices` (simulated device counts and the ISA cap, set in
`XLA_FLAGS`), `jax_cache` (the machine's compilation cache), `signals` (SIGINT/SIGTERM
that reach the main thread), `worktree` (git, temporary worktrees) and `logs` (where a
run's output and a recording's traceback are kept) are the ground; `processes` holds the
one process supervisor and a multi-process run's workers, `launcher` starts the producer
process (`_producer_runner`, started by path) under it, described by one `ProducerRun`;
`producers_table` is the producers file's `CLASS_MAP`, `STACK` and `RENAME`, read there
once; `compile_count` counts what XLA compiles. It may import numpy and the
layers below it (the judge, the store, the reports, the origin, the core up to
`parity.check`, the leaves); jax only lazily, inside a function that runs once jax is
wanted; never decomp, nor the workflows or the faces above it (`parity.run`,
`parity.calibration`, `parity.commands`, `parity.pytest_plugin`, `parity._cli`,
`parity._assertions`): `tests/parity/test_import_boundaries.py` holds it to that. Nothing is
re-exported: its modules are private (`_launcher`, ...), imported by name by the layers
above it, never by a user.
"""
