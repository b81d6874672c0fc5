"""The `calibrated` class in a check: the harmless noise between environments that a golden
file records, read back and bound on each key's rule (docs/design.md, "Tolerance from
measured noise"). Measuring and recording that noise (`parity calibrate`) is
`parity.calibration`'s, a floor above `parity.run`.

- `spreads`: the per-key spreads a golden file records, as data (`Spreads`), and which
  columns bound a check in another environment; it imports nothing of parity.
- `bounds`: each key's recorded spread bound on its rule (`bind_calibrated`), and, where the
  environment differs from the pin's, each failing key judged again under its calibrated
  bound there (`calibrated_comparison`).

A floor of the core, over `parity._results`: it may import numpy, `parity.judge`,
`parity._results` and the leaves below them; never `parity.check` (which reads it), nor
anything that runs producers (`parity.run`,
`parity.calibration`) or a face above them. The `Calibrated` rule itself (a multiple of a
measured spread) is a rule like the others and lives with them in
`parity.judge._measured_rules`. This package's `__init__` imports nothing. Nothing here
imports jax or h5py; `tests/parity/test_import_boundaries.py` holds it to all of that.
"""
