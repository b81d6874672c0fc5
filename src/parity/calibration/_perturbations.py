"""The benign perturbations `parity calibrate` runs the producers under: each XLA CPU ISA cap
the host supports, other simulated device counts, process layouts, the same environment
again. Each is a change of environment, never of code.

Not every perturbation exists on every backend (docs/design.md, "On any backend"):
`available` keeps those this machine can run and says in one line why it skips each other
one: an ISA cap off a CPU (only XLA's CPU compiler reads it), a device count an accelerator
does not have (only a CPU's devices are simulated), processes where `jax.distributed` cannot
start (no TCP socket). `Here` is what it decides by: the backend jax picks on this machine,
asked of a fresh process (`backend_here`), so that this one never holds an accelerator its
producer processes need."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from parity._errors import ParityError
from parity._xla_env import ISA_CAPS
from parity.judge._floats import count
from parity.machinery._config import ParityConfig

__all__ = [
    "DEVICE_COUNTS",
    "ISA_CAPS",
    "PROCESS_LAYOUT",
    "CalibrationError",
    "Here",
    "Perturbation",
    "available",
    "backend_here",
    "host_isa_caps",
    "perturbations",
]

#: Simulated device counts the `devices` perturbation tries.
DEVICE_COUNTS = (1, 2, 4)
#: The layout a bare `processes` perturbs to: 2 processes of 2 devices each, the layout
#: docs/adopting.md checks and every message that suggests `--perturb processes` means.
PROCESS_LAYOUT = "2x2"


class CalibrationError(ParityError):
    """Calibration cannot run as asked (an unknown perturbation, an ISA cap the host lacks,
    a group without a golden file); the message is one line saying what to do."""


def host_isa_caps(flags: Iterable[str] | None = None) -> list[str]:
    """The ISA caps of `ISA_CAPS` this host supports, lowest first.

    **Arguments:**

    - `flags`: the processor's flags; default the first processor's in /proc/cpuinfo.

    **Returns:** the caps whose flag is present (empty where /proc/cpuinfo is unreadable).
    """
    if flags is None:
        found: set[str] = set()
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if line.lower().startswith("flags"):
                        found = set(line.partition(":")[2].split())
                        break
        except OSError:
            found = set()
        flags = found
    have = set(flags)
    return [cap for cap, flag in ISA_CAPS if flag in have]


@dataclass(frozen=True)
class Perturbation:
    """One environment to produce in.

    **Fields:** `label` (as reports show it: `isa=SSE4_2`, `devices=4`, `processes=2x2`,
    `repeat`), `isa` (the ISA cap, `None` for none), `devices` (simulated CPU devices per
    process) and `processes` (processes of one distributed run).
    """

    label: str
    isa: str | None
    devices: int
    processes: int = 1

    @property
    def kind(self) -> str:
        """The dimension it perturbs: `isa`, `devices`, `processes` or `repeat`."""
        return self.label.partition("=")[0]


def perturbations(
    spec: Sequence[str], pinned: ParityConfig, *, host_caps: Sequence[str] | None = None
) -> list[Perturbation]:
    """The environments a `--perturb` list names, the pinned one left out.

    **Arguments:**

    - `spec`: items `isa` (every cap of `host_caps` but the pinned one), `isa=CAP` (one
      cap, which the host must support), `devices` (`DEVICE_COUNTS` but the pinned one),
      `devices=N`, `processes` (`PROCESS_LAYOUT`: 2 processes of 2 devices), `processes=PxD`
      (P processes of D devices), `repeat` (the pinned environment again: run-to-run
      determinism).
    - `pinned`: the configuration the goldens were pinned in (ISA cap, devices).
    - `host_caps`: the caps this host supports (default `host_isa_caps()`).

    **Returns:** the perturbations in the order given, without repeats. Raises
    `CalibrationError` for an unknown item or a cap the host lacks.
    """
    caps = list(host_isa_caps() if host_caps is None else host_caps)
    out: list[Perturbation] = []

    def add(p: Perturbation) -> None:
        if p not in out:
            out.append(p)

    for item in spec:
        name, eq, value = item.strip().partition("=")
        if name == "isa" and not eq:
            for cap in caps:
                if cap != pinned.isa:
                    add(Perturbation(f"isa={cap}", cap, pinned.devices))
        elif name == "isa":
            if value not in caps:
                raise CalibrationError(
                    f"--perturb {item}: this host supports the ISA caps {caps or 'none known'} "
                    f"(from /proc/cpuinfo); pick one of them"
                )
            add(Perturbation(f"isa={value}", value, pinned.devices))
        elif name == "devices" and not eq:
            for n in DEVICE_COUNTS:
                if n != pinned.devices:
                    add(Perturbation(f"devices={n}", pinned.isa, n))
        elif name == "devices":
            if not value.isdigit() or int(value) < 1:
                raise CalibrationError(f"--perturb {item}: the device count must be an int >= 1")
            add(Perturbation(f"devices={int(value)}", pinned.isa, int(value)))
        elif name == "processes":
            procs, _, devs = (value or PROCESS_LAYOUT).partition("x")
            if not (procs.isdigit() and devs.isdigit() and int(procs) >= 2 and int(devs) >= 1):
                raise CalibrationError(
                    f"--perturb {item}: a process layout is PxD with P >= 2 processes of D >= 1 "
                    "devices each, for example processes=2x2"
                )
            add(
                Perturbation(
                    f"processes={int(procs)}x{int(devs)}", pinned.isa, int(devs), int(procs)
                )
            )
        elif name == "repeat" and not eq:
            add(Perturbation("repeat", pinned.isa, pinned.devices))
        else:
            raise CalibrationError(
                f"unknown perturbation {item!r}; expected isa, isa=CAP, devices, devices=N, "
                "processes, processes=PxD or repeat, comma-separated"
            )
    if not out:
        raise CalibrationError(
            f"--perturb {','.join(spec)} leaves nothing to run besides the pinned environment "
            f"(isa {pinned.isa}, {count(pinned.devices, 'device')}); add devices or repeat"
        )
    return out


@dataclass(frozen=True)
class Here:
    """The backend jax picks on this machine, and whether processes can meet.

    **Fields:** `backend` (`cpu`, `gpu`, `tpu`), `devices` (its device count; for a CPU the
    simulated count is whatever a run asks for), `device_kind` (e.g. `TPU v5 lite`) and
    `sockets` (whether a TCP socket can be opened: `jax.distributed` needs one).
    """

    backend: str = "cpu"
    devices: int = 1
    device_kind: str = "cpu"
    sockets: bool = True

    def __str__(self) -> str:
        if self.backend == "cpu":
            return "cpu"
        return f"{self.backend} ({self.device_kind}, {self.devices} device(s))"


_PROBE = (
    "import json, jax; d = jax.devices(); "
    "print(json.dumps([jax.default_backend(), len(d), str(d[0].device_kind)]))"
)


def _sockets() -> bool:
    from parity.machinery._processes import NoSockets, free_port

    try:
        free_port()
    except NoSockets:
        return False
    return True


def backend_here(*, timeout: float = 300.0) -> Here:
    """The backend jax picks on this machine: `cpu` without asking where `JAX_PLATFORMS`
    names the CPU first; else asked of a fresh process (a second or two on a CPU, some 15 s
    on a TPU), so that this process never holds the accelerator. Where that process fails,
    a CPU (nothing is skipped that a CPU could run)."""
    sockets = _sockets()
    platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms.split(",")[0] == "cpu":
        return Here(sockets=sockets)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout
        )
        backend, devices, kind = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return Here(sockets=sockets)
    return Here(str(backend), int(devices), str(kind), sockets)


def available(perturbs: Sequence[Perturbation], here: Here) -> tuple[list[Perturbation], list[str]]:
    """The perturbations this machine can run, and one line for each it skips.

    **Arguments:**

    - `perturbs`: the perturbations asked for (`perturbations`).
    - `here`: this machine's backend (`backend_here`).

    **Returns:** `(kept, skipped)`, `kept` in the order given.
    """
    kept: list[Perturbation] = []
    skipped: list[str] = []
    for p in perturbs:
        why = ""
        if p.kind == "isa" and here.backend != "cpu":
            why = f"an ISA cap is read by XLA's CPU compiler only, and this backend is {here}"
        elif (
            p.kind in ("devices", "processes")
            and here.backend != "cpu"
            and (p.devices * p.processes != here.devices)
        ):
            why = (
                f"it needs {p.devices * p.processes} device(s), and this backend is {here}; "
                "only a CPU's devices are simulated"
            )
        elif p.kind == "processes" and not here.sockets:
            why = (
                "this machine allows no TCP socket, so jax.distributed cannot start (a run "
                "of several processes is not possible here)"
            )
        if why:
            skipped.append(f"{p.label}: skipped: {why}")
        else:
            kept.append(p)
    return kept, skipped
