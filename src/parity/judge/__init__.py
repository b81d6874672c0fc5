"""The judge: how two arrays, or two pytrees of them, are compared and what a verdict means.

`ulp` (the float dtypes parity knows and the ulp line), `rule_base`, `fixed_rules`,
`measured_rules` and `registry` (what every rule shares, the rules with a fixed tolerance,
the rules whose bound is measured or propagated: by calibration, from a reduction's length,
a budget; every rule by its kind), `classes`
(tolerance classes as data, the registry), `tolerance` (class names looked up, class maps),
`trees` (pytrees to `{key: array}`), `dataflow` (the order a function's program computes
its outputs in, read from its jaxpr), `chunks` (the chunk plan and array sources, for
comparison in bounded memory), `compare` (one array to a `Finding`, many to a `Comparison`
with the first divergence; `findings` holds both, `tally` the per-chunk reductions),
`floats` (an expected array's scale, non-finite floats in JSON, counts in messages) and
`mldtypes` (ml_dtypes, imported only when an array of them is met). It is the lowest layer
but the leaves: it may import numpy, `parity._errors` (its errors are `ParityError`s) and,
lazily, ml_dtypes; jax only inside `trees` and `dataflow`, and only once the caller has
imported it; never h5py, decomp or another part of parity
(`tests/parity/test_import_boundaries.py` holds it to that).
"""
