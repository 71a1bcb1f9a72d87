"""One federated simulation over several processes or hosts, with ``jax.distributed``.

Contract: :func:`process_group` reads the coordinator address, the number of processes and this
process's id from arguments or, for those not given, from the environment (``JAX_COORDINATOR_
ADDRESS``, which JAX itself reads, and ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``, which aisim
reads), and checks them. :func:`initialize` starts ``jax.distributed`` with them; it must run
before JAX runs anything in the process. Afterwards ``jax.devices()`` lists the devices of every
process, and :func:`fl.build.build` shards the round's client axis over all of them (one mesh
over ``jax.devices()``, the inputs replicated on every device): every process loads the same
data, runs the same jitted rounds, and holds the same global model, so the metrics are those of
one process with as many devices. Only process 0 writes files (:func:`is_writer`). On CPUs the
processes exchange the round's sums with gloo.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Mapping

import jax
import numpy as np
from jax._src import xla_bridge
from jax.extend import backend as jax_backend  # not `import jax.…`: `jax` stays a global name
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from simbase.errors import AisimError, bad_value

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """Where this process belongs: ``coordinator`` (``HOST:PORT`` of process 0's service), the
    number of processes, and this process's id (``0 .. num_processes - 1``)."""

    coordinator: str
    num_processes: int
    process_id: int


def _int_from_env(name: str, field: str, environ: Mapping[str, str]) -> int | None:
    raw = environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise bad_value(f"environment {name}", field, raw, "an integer") from None


def process_group(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> ProcessGroup | None:
    """The checked process group, or ``None`` for a single process (nothing given anywhere).

    Raises:
      AisimError: ``field`` ``coordinator``, ``num_processes`` or ``process_id``: missing when
        another is given, or out of range.
    """
    env = os.environ if environ is None else environ
    coordinator = coordinator or env.get(ENV_COORDINATOR) or None
    if num_processes is None:
        num_processes = _int_from_env(ENV_NUM_PROCESSES, "num_processes", env)
    if process_id is None:
        process_id = _int_from_env(ENV_PROCESS_ID, "process_id", env)
    given = {"coordinator": coordinator, "num_processes": num_processes, "process_id": process_id}
    if all(v is None for v in given.values()):
        return None
    for field, v in given.items():
        if v is None:
            others = ", ".join(f for f, w in given.items() if w is not None)
            raise bad_value(
                None, field, None, f"a value when {others} is given (or {_env(field)} set)"
            )
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise bad_value(None, "coordinator", coordinator, "HOST:PORT, such as 10.0.0.1:1234")
    if not num_processes >= 1:
        raise bad_value(None, "num_processes", num_processes, "an integer >= 1")
    if not 0 <= process_id < num_processes:
        raise bad_value(None, "process_id", process_id, f"0..{num_processes - 1}")
    return ProcessGroup(coordinator, num_processes, process_id)


def _env(field: str) -> str:
    return {
        "coordinator": ENV_COORDINATOR,
        "num_processes": ENV_NUM_PROCESSES,
        "process_id": ENV_PROCESS_ID,
    }[field]


def initialize(group: ProcessGroup, timeout_s: int = 300, restart_backend: bool = False) -> None:
    """Joins ``group`` (``jax.distributed.initialize``); waits up to ``timeout_s`` for the others.

    Args:
      group: from :func:`process_group`.
      timeout_s: how long to wait for every process to join.
      restart_backend: if JAX has already started its backend in this process, drop it first
        (``jax.extend.backend.clear_backends``), so that the distributed one replaces it. Arrays
        made before become unusable: only for a process that has made none it will use again
        (the command line, where importing ``perfmodel`` builds a few constants).

    Raises:
      AisimError: when JAX has already run something in this process and ``restart_backend`` is
        false, or the coordinator cannot be reached in time.
    """
    if restart_backend and xla_bridge.backends_are_initialized():
        jax_backend.clear_backends()
    if xla_bridge.backends_are_initialized():
        raise AisimError(
            "jax.distributed must start before JAX runs anything, and this process has already "
            "created arrays (a module that builds JAX arrays at import time?)",
            usage=False,
        )
    try:
        jax.distributed.initialize(
            group.coordinator,
            group.num_processes,
            group.process_id,
            initialization_timeout=timeout_s,
        )
        # Connect the processes now (one all-reduce over every device), with gloo's connection
        # message sent to stderr: stdout is for the run's results (--json).
        with _stdout_to_stderr():
            _all_reduce_ones()
    except (RuntimeError, ValueError) as e:
        raise AisimError(
            f"jax.distributed at {group.coordinator} (process {group.process_id} of "
            f"{group.num_processes}): {str(e).splitlines()[0]}",
            usage=False,
        ) from None


def _all_reduce_ones() -> None:
    mesh = Mesh(np.array(jax.devices()), ("all",))
    n = len(jax.devices())
    x = jax.make_array_from_callback(
        (n,), NamedSharding(mesh, PartitionSpec("all")), lambda idx: np.ones(n, np.float32)[idx]
    )
    total = jax.jit(jax.numpy.sum, out_shardings=NamedSharding(mesh, PartitionSpec()))(x)
    total.block_until_ready()


@contextlib.contextmanager
def _stdout_to_stderr():
    """File descriptor 1 pointed at 2 (C++ libraries write there, not to ``sys.stdout``)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def is_writer() -> bool:
    """Whether this process writes the run's files and prints its results (process 0)."""
    return jax.process_index() == 0


def replicate(tree, sharding: jax.sharding.Sharding):
    """``tree`` copied onto every device of ``sharding`` (which may span processes): each process
    passes the same values and contributes its own devices' copies. ``jax.device_put`` cannot do
    this for arrays already committed to one local device, such as a jitted ``init``'s output."""

    def put(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            data = put(jax.random.key_data(x))
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

    return jax.tree.map(put, tree)
