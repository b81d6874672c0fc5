"""parity: differential equivalence testing for JAX model refactors.

`parity.assert_equivalent(actual, expected, class_map=...)` compares any two pytrees;
`parity.check_group` / `parity.check_live` are the core that the CLI and the pytest plugin
share; `parity.localise(new_fn, old_fn, *args)` names the first operation of a new program
that computes what the old one never did, at its source line. Tolerance classes as data
(rules as objects, `parity.judge._fixed_rules` and `parity.judge._measured_rules`),
comparison of arrays and pytrees with a finding per key and the first divergence named, an
HDF5 golden store with provenance and checksums, repin at a git base commit, compile
statistics, reports, a CLI (`python -m parity`) and a pytest plugin.

The public names are listed once, in `__init__.pyi` beside this file: type checkers read
that stub, and `lazy_loader.attach_stub` reads the same imports here to give this package
its `__getattr__`, `__dir__` and `__all__`, so that each name loads its module on first use.
`import parity` thus imports neither jax, h5py, matplotlib nor rich (the pytest plugin loads
with every pytest session, and `parity --help` stays quick).
"""

import lazy_loader

#: This package's version, for a source tree run without installing it (`parity --version`
#: prefers the installed distribution's); kept equal to pyproject.toml's by a test.
__version__ = "0.1.0"

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
