"""The check: one package, one flow of typed stages from what a check is asked to its
verdict (docs/design.md, "One pass"). Every face enters at one door, `flow`
(`check_groups`, and `check_group`, `check_file`, `check_live` over the same stages).

- `request`: what a check is asked (`CheckRequest`, built by keyword), the options each
  door takes (`CheckOptions`, `LiveOptions`, ...), the two class registries
  (`Registries`), and what a face hands the check to settle its failures (`Settler`) and
  to re-produce its baselines (`BaselineSource`, returning a `Baseline`);
- `goldens`: the golden folder (`GoldenDir`);
- `first`: the first stage, the tree compared with its goldens once (`first_verdict`,
  making a `FirstVerdict`), and the one comparison every check makes (`compare_flat`);
- `against_baseline`: the second, the baselines the first verdicts want, prepared at once,
  and each verdict judged against its reference, its baseline or else the goldens
  (`against_baseline`, making a `BaseJudgement`; `against_baselines` for several);
- `conclusion`: the third, the `CheckResult` with its header and how exact it is
  (`conclude`);
- `flow`: the door, running the stages in order and, last, the face's `Settler`.

A floor of the core, over `parity.calibrated` and `parity._results`: it may import numpy,
the judge, the store, the origin's typed values, `parity._environment`, `parity.calibrated`,
`parity._results` and the leaves; never anything that runs producers (`parity.machinery`,
`parity.run`, `parity.calibration`, which hand it a `BaselineSource` or a `Settler`
instead) nor a face above them. Nothing here imports jax;
`tests/parity/test_import_boundaries.py` holds it to all of that. The names below are the
package's surface; each is defined in the module named beside it.
"""

from parity.check._against_baseline import (
    BASELINE as BASELINE,
    BASELINE_OFF as BASELINE_OFF,
    BaseJudgement as BaseJudgement,
    against_baseline as against_baseline,
    against_baselines as against_baselines,
    prepare_baselines as prepare_baselines,
)
from parity.check._conclusion import conclude as conclude
from parity.check._first import (
    FirstVerdict as FirstVerdict,
    compare_flat as compare_flat,
    first_verdict as first_verdict,
)
from parity.check._flow import (
    BARE_KEY as BARE_KEY,
    check_file as check_file,
    check_group as check_group,
    check_groups as check_groups,
    check_live as check_live,
)
from parity.check._goldens import (
    REPIN_HINT as REPIN_HINT,
    GoldenDir as GoldenDir,
)
from parity.check._request import (
    Baseline as Baseline,
    BaselineSource as BaselineSource,
    BatchBaselineSource as BatchBaselineSource,
    CheckOptions as CheckOptions,
    CheckRequest as CheckRequest,
    FileOptions as FileOptions,
    GroupOptions as GroupOptions,
    LiveOptions as LiveOptions,
    Registries as Registries,
    Settler as Settler,
)
