"""Reports of a `Comparison`: a terminal table, JSON for machines, an HTML page with plots.

The table gives, per tolerance class, how many arrays passed and the worst figures, then
where the two runs part ways (the first key that is not bitwise equal, the first that
breaks its class), then every failing key with its reason. The HTML page adds, per class,
a plot of each key's error along the forward order against the allowed band.

`summary` (what every report shares), `text`, `jsondoc` and `html` (the three forms) and
`session` (the checks of one session reported as one, for `parity check` and the pytest
plugin). It may import numpy and `parity.judge`, the layer below it; `rich` (colour on a
terminal) and `matplotlib` (plots) only lazily; never jax, h5py or decomp, nor its sibling
`parity.store` or a layer above it (the core, `parity.run`, the faces):
`tests/parity/test_import_boundaries.py` holds it to that. This package re-exports the
public names, listed once in `__init__.pyi` beside this file (read by
`lazy_loader.attach_stub`, as `parity`'s are): each loads its module on first use, and the
session loads the two writers only to write, so that a command that prints only the table
(`parity diff` without `--json` or `--report`) loads neither writer
(`tests/parity/test_cli.py`).
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
