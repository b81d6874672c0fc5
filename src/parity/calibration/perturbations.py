"""The benign perturbations `parity calibrate` runs the producers under: each XLA CPU ISA cap
the host supports, other simulated device counts, process layouts, the same environment
again. Each is a change of environment, never of code."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from parity.judge.floats import count
from parity.run.config import ParityConfig

__all__ = [
    "DEVICE_COUNTS",
    "ISA_CAPS",
    "PROCESS_LAYOUT",
    "CalibrationError",
    "Perturbation",
    "host_isa_caps",
    "perturbations",
]

#: XLA CPU ISA caps (`--xla_cpu_max_isa`), lowest first, with the /proc/cpuinfo flag each
#: one needs.
ISA_CAPS: tuple[tuple[str, str], ...] = (
    ("SSE4_2", "sse4_2"),
    ("AVX", "avx"),
    ("AVX2", "avx2"),
    ("AVX512", "avx512f"),
    ("AVX512_VNNI", "avx512_vnni"),
    ("AVX512_BF16", "avx512_bf16"),
)
#: Simulated device counts the `devices` perturbation tries.
DEVICE_COUNTS = (1, 2, 4)
#: The layout a bare `processes` perturbs to: 2 processes of 2 devices each, the layout
#: docs/adopting.md checks and every message that suggests `--perturb processes` means.
PROCESS_LAYOUT = "2x2"


class CalibrationError(Exception):
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
            add(Perturbation(f"processes={int(procs)}x{int(devs)}", pinned.isa, int(devs),
                             int(procs)))  # fmt: skip
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
