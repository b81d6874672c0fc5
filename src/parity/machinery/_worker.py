"""The worker's half of a run over several processes (docs/design.md, "Multi-process
runs"; the launcher's half is `parity.machinery._processes`): a worker finds its `Place` in
the run (`worker_place`, from the environment the launcher gave it), starts the distributed
runtime before anything touches jax's backends (`initialize`), brings arrays sharded over
every process to the host (`to_host`) and makes every process reach process 0's verdict
(`agree`).

Nothing here imports jax at module level, nor anything of parity but its errors.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ENV_COORDINATOR",
    "ENV_LAUNCHER",
    "ENV_PROCESSES",
    "ENV_PROCESS_ID",
    "Place",
    "agree",
    "initialize",
    "sharded_over_processes",
    "to_host",
    "worker_place",
]

#: Environment variables that tell a worker its place: process id, count, coordinator.
ENV_PROCESS_ID = "PARITY_PROCESS_ID"
ENV_PROCESSES = "PARITY_PROCESSES"
ENV_COORDINATOR = "PARITY_COORDINATOR"
#: The launcher's pid: a worker asks the kernel to kill it when the launcher dies.
ENV_LAUNCHER = "PARITY_LAUNCHER_PID"


@dataclass(frozen=True, kw_only=True)
class Place:
    """A process's place in a run of several, one JAX distributed run: `process_id` (0 is
    the one that reads the goldens and saves), `processes` (how many) and `coordinator`
    (process 0's `HOST:PORT`). A worker `run_workers` started finds its own
    (`worker_place`); a host of a run spread over a cluster is given it (`parity check
    --coordinator HOST:PORT --process-id I`)."""

    process_id: int
    processes: int
    coordinator: str


def worker_place(environ: Mapping[str, str] | None = None) -> Place | None:
    """This process's `Place` when it is a worker that `run_workers` started, else None."""
    env = os.environ if environ is None else environ
    if ENV_PROCESS_ID not in env:
        return None
    return Place(
        process_id=int(env[ENV_PROCESS_ID]),
        processes=int(env[ENV_PROCESSES]),
        coordinator=env[ENV_COORDINATOR],
    )


def _die_with_launcher() -> None:
    """Ask Linux to SIGKILL this worker when the launcher that started it dies (a launcher
    killed with SIGKILL runs no cleanup); exit at once if it died already."""
    launcher = int(os.environ.get(ENV_LAUNCHER, "0") or 0)
    if not launcher:
        return
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != launcher:
        os._exit(1)


def initialize(coordinator: str, processes: int, process_id: int) -> None:
    """Join the distributed run: CPU collectives through gloo, then
    `jax.distributed.initialize`. Must run before jax starts its backends (the device
    count of `XLA_FLAGS` is read then too); raises a `RuntimeError` saying so otherwise.
    A worker that `run_workers` started dies with its launcher from here on. With more
    than one process it also starts jax's backends and runs one sum over every device (see
    `_open_communicator`), so configure jax (compilation cache and the like) before."""
    from parity._xla_env import jax_backend_started

    _die_with_launcher()
    if jax_backend_started():
        raise RuntimeError(
            "jax started its backends before the distributed runtime was initialised; "
            "nothing may create a jax array before parity.machinery._worker.initialize runs"
        )
    import jax

    # Cross-process reductions on CPU need a collectives implementation; set before
    # initialize, which builds the CPU client with it.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # jax's runtime takes SIGTERM for its preemption notice (a C handler that records the
    # signal and lets the process run on): a worker the launcher stops would then live out
    # the whole kill grace, blocked in a collective its failed peer never joins. The
    # process's own disposition is put back, so SIGTERM stops a worker as it stops any
    # process.
    main = threading.current_thread() is threading.main_thread()
    term = signal.getsignal(signal.SIGTERM) if main else None
    jax.distributed.initialize(
        coordinator_address=coordinator, num_processes=processes, process_id=process_id
    )
    if term is not None:  # None: off the main thread, or a handler from outside Python
        signal.signal(signal.SIGTERM, term)
    if processes > 1:
        _open_communicator()


def _open_communicator() -> None:
    """Build gloo's communicators now: the one over every device of the run (one tiny sum)
    and the one over the first device of each process (what `multihost_utils`' broadcasts
    and barriers use, `agree`'s verdict among them).

    gloo builds the communicator of a set of devices at the first collective over them and
    waits a fixed 30 s there for every process. Started later, by the first program of a
    producer, that wait fails whenever one process finishes compiling the program more than
    30 s after another (a large program, processes sharing few cores). Here the processes
    have just met at the runtime's start-up, so they arrive together. A communicator, once
    built, serves every later program over the same devices however far apart the
    processes reach it."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()), ("all",))
    ones = jax.make_array_from_process_local_data(
        NamedSharding(mesh, PartitionSpec("all")),
        np.ones(jax.local_device_count(), np.int32),
        (jax.device_count(),),
    )
    sum_all = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec()))
    total = int(np.asarray(sum_all(ones)))
    if total != jax.device_count():
        raise RuntimeError(
            f"the run's first sum over its {jax.device_count()} devices gave {total}: the "
            "processes do not see the same devices"
        )
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("parity: the processes are together")


def sharded_over_processes(value: Any) -> bool:
    """Whether `value` is a jax array split over several processes, each holding only
    part of it: the work that made it was divided between them. A numpy value or a fully
    replicated array is one every process computed in full."""
    jax = sys.modules.get("jax")
    return (
        jax is not None
        and isinstance(value, jax.Array)
        and not value.is_fully_addressable
        and not value.is_fully_replicated
    )


def to_host(value: Any) -> Any:
    """`value` as a host (numpy) array: a jax array sharded over several processes is
    gathered (`multihost_utils.process_allgather`, a collective every process must call
    in the same order); anything else goes through `np.asarray`."""
    import numpy as np

    if sharded_over_processes(value):
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(value, tiled=True))
    return np.asarray(value)


def agree(flag: bool) -> bool:
    """Process 0's `flag`, on every process (a collective every process must call)."""
    import jax

    if jax.process_count() == 1:
        return flag
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(multihost_utils.broadcast_one_to_all(np.int32(flag)))
