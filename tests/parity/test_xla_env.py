"""`parity._xla_env`: whether jax has started its backends, asked without importing jax, so
the flags it names can still be set (or, once started, are refused as too late)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_backend_counts_as_started_only_once_jax_has_made_its_devices() -> None:
    script = (
        "import json, sys\n"
        "from parity._xla_env import jax_backend_started\n"
        "seen = [jax_backend_started(), 'jax' in sys.modules]\n"
        "import jax\n"
        "seen.append(jax_backend_started())\n"
        "jax.devices()\n"
        "seen.append(jax_backend_started())\n"
        "print(json.dumps(seen))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # asking imports no jax; importing jax starts nothing; asking for devices does
    assert json.loads(proc.stdout.splitlines()[-1]) == [False, False, False, True]
