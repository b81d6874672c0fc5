"""Measuring the noise (`parity calibrate`): how large the harmless noise between
environments is, measured by running the producers and recorded with the goldens
(docs/design.md, "Tolerance from measured noise").

- `perturbations`: the benign changes of environment it runs the producers under (ISA caps
  the host supports, device counts, process layouts, a repeat), never of code;
- `calibrate`: runs them, each in a fresh process, and holds the result (`Calibration`);
- `measure`: per key, the largest spread over the perturbations against its class's bound;
  per class, the verdict (ok, below noise, blunt);
- `write`: writes a measurement into each golden file's provenance, merged with the
  columns recorded before.

How a check reads what is recorded (the `calibrated` class) is `parity.calibrated`'s, in the
core below. This room sits above `parity.run`, whose producer runs it drives: it may import numpy,
every layer below it (`parity.judge`, `parity.store`, `parity.report`, the core with
`parity.calibrated` and `parity.check`, `parity.run`); never decomp, nor the faces above it
(`parity.commands`, whose `calibrate` is its command line, `parity.pytest_plugin`,
`parity._cli`, `parity._assertions`). This package's `__init__` imports nothing. Nothing here
imports jax; `tests/parity/test_import_boundaries.py` holds each module to that.
"""
