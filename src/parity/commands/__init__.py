"""The subcommands of `parity`, one module each, and what they share (`common`, `files`,
`formatter`: the help formatter of every parser, `parity._cli`'s too).

`diff` and `show` read HDF5 files (`parity.store`) and compare them (`parity.judge`);
`repin`, `check`, `bisect` and `calibrate` run producers (`parity.run._repin`,
`parity.run._produced`, `parity.run._bisection`, `parity.calibration._calibrate`), configured by
`[tool.parity]` (`parity.machinery._config`); each key can be overridden by the flag of the same
name (`--goldens`, `--producers`, `--src`, `--isa`, `--devices`, `--processes`, `--drift`).
A flag means one thing on every subcommand (docs/design.md, "Vocabulary"): `common`
defines the shared ones once (`--goldens`, `--json`, `--report`, `--class`, `--override`,
`--drift`, ...). Each
module adds its subparser (`add_parser(sub, help)`, `help` its line in `parity --help`,
declared with the module's name in `parity._cli.COMMANDS`) to the one argparse tree that
`parity._cli.build_parser` builds, and runs its command (`run(args, out)`); `parity._cli.main`
imports the module of the command it runs and no other. Every input error is a
`common.CLIError`, printed by `parity._cli.main` as one `parity: error: ...` line with exit
code 2. Importing any of these modules imports no jax; the commands that run producers
import what they need when they run, so that `parity diff` and `parity show` load neither
those nor the baseline (`tests/parity/test_cli.py` holds them to that). A face: it may
import every layer below it (`parity.judge`, `parity.store`, `parity.report`, the core,
`parity.run`, `parity.calibration`), never a sibling face (`parity.pytest_plugin`,
`parity._assertions`) nor `parity._cli` above it (`tests/parity/test_import_boundaries.py`
holds it to that).
"""
