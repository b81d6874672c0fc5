"""Localisation: the first operation of a new program that computes what an old program
never did, at the user's source line (docs/design.md, "Where it diverged").

`record` (a function's program run equation by equation, every value kept, scans unrolled:
`Recording`, `Value`; `record_programs` for the programs a producer dispatched), `programs`
(those programs, kept while the producer runs: `capture`), `recording` (the recording as
plain data, with per-value fingerprints, serialisable to numpy arrays), `align` (matching
the new program's values to the old program's by value, the matching tolerance derived from
a class, the origin rule: `Alignment`, `Origin`), `localisation` (what a search for the
origin found: `Localisation`) and `api` (`localise` for two live functions, `locate` for two
recordings, `prove_and_locate` for a failing check), `settling` (the one door every face
settles a failing check through: `settle_by` with its `Sides`, `LiveSides` for two live
functions), `proof` (a key proved op by op: `Proof`, `prove`, `settle`). It sits over the
judge: it imports numpy and `parity.judge`; jax only inside functions, once the caller has
imported it; never h5py, decomp or another part of parity
(`tests/parity/test_import_boundaries.py`).
"""

from parity.origin._align import (
    Alignment as Alignment,
    align as align,
    matching_tolerance as matching_tolerance,
)
from parity.origin._api import (
    localise as localise,
    locate as locate,
    prove_and_locate as prove_and_locate,
)
from parity.origin._localisation import Localisation as Localisation
from parity.origin._origin import Origin as Origin
from parity.origin._proof import (
    Proof as Proof,
    prove as prove,
    settle as settle,
)
from parity.origin._record import (
    LocaliseError as LocaliseError,
    record as record,
)
from parity.origin._recording import (
    Recording as Recording,
    Value as Value,
)
from parity.origin._settling import (
    LiveSides as LiveSides,
    NotRecorded as NotRecorded,
    Pair as Pair,
    Rules as Rules,
    Sides as Sides,
    settle_by as settle_by,
)
