"""Calibration, in one room: how large the harmless noise between environments is, recorded
with the goldens, and how a check reads it (docs/design.md, "Tolerance from measured noise").

Two halves, at two heights of parity's layers:

What a check reads (the core may import these; they import nothing that runs producers):

- `spreads`: the per-key spreads a golden file records, as data (`Spreads`), and which
  columns bound a check in another environment. A leaf: nothing of parity.
- `bounds`: the `calibrated` class in a check: each key's recorded spread bound on its rule,
  and, where the environment differs from the pin's, each failing key judged again under
  its calibrated bound there (`judge_environment`). Core, over `parity.results`.

What `parity calibrate` does (above `parity.run`, whose runner it drives):

- `perturbations`: the benign changes of environment it runs the producers under (ISA caps
  the host supports, device counts, process layouts, a repeat), never of code;
- `calibrate`: runs them, each in a fresh process, and holds the result (`Calibration`);
- `measure`: per key, the largest spread over the perturbations against its class's bound;
  per class, the verdict (ok, below noise, blunt);
- `record`: writes a measurement into each golden file's provenance, merged with the
  columns recorded before.

The `Calibrated` rule itself (a multiple of a measured spread) is a rule like the others and
lives with them in `parity.judge.derived_rules`; the command line is
`parity.commands.calibrate`. This package's `__init__` imports nothing, so that reading
`spreads` does not load the measuring half; `tests/parity/test_import_boundaries.py` holds
each module to its height. Nothing here imports jax.
"""
