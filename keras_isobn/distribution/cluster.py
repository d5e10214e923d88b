"""Processes that train together (JAX): joining a cluster, ranks, barriers."""

import os

import keras

from keras_isobn.distribution.backend_support import (
    check_multi_process_backend,
)

__all__ = [
    "ENVIRONMENT",
    "barrier",
    "cluster_environment",
    "initialize_cluster",
    "is_chief",
    "join_cluster",
    "process_count",
    "process_index",
]

# The variables that describe a cluster, as `keras.distribution` reads them.
ENVIRONMENT = (
    "KERAS_DISTRIBUTION_JOB_ADDRESSES",
    "KERAS_DISTRIBUTION_NUM_PROCESSES",
    "KERAS_DISTRIBUTION_PROCESS_ID",
)
_CLUSTER = {}


def cluster_environment():
    """The cluster that the `KERAS_DISTRIBUTION_*` variables describe.

    A cluster manager (or `python -m keras_isobn.launch`) sets, for every
    process, `KERAS_DISTRIBUTION_JOB_ADDRESSES` (the coordinator's
    `host:port` first, as `keras.distribution.initialize` reads it),
    `KERAS_DISTRIBUTION_NUM_PROCESSES` and `KERAS_DISTRIBUTION_PROCESS_ID`.

    Returns:
        `None` if none of the variables is set, else a dict of
        `job_addresses`, `num_processes` and `process_id`, the arguments of
        `initialize_cluster()`.

    Raises:
        ValueError: if only some of them are set, or malformed.
    """
    values = {name: os.environ.get(name) for name in ENVIRONMENT}
    if all(value is None for value in values.values()):
        return None
    try:
        environment = {
            "job_addresses": values[ENVIRONMENT[0]] or None,
            "num_processes": int(values[ENVIRONMENT[1]]),
            "process_id": int(values[ENVIRONMENT[2]]),
        }
        if not 0 <= environment["process_id"] < environment["num_processes"]:
            raise ValueError("process id out of range")
    except (TypeError, ValueError):
        raise ValueError(
            "A cluster needs all of "
            f"{', '.join(ENVIRONMENT)}, with 0 <= process id < number of "
            f"processes. Received: {values}"
        ) from None
    return environment


def initialize_cluster(job_addresses=None, num_processes=None, process_id=None):
    """Joins this process to a cluster of processes that train together.

    Call it in every process, first thing (before anything is computed),
    then build and fit the model in `data_parallel_scope("multi_worker")`.
    On CPUs it selects JAX's gloo collectives, then calls
    `keras.distribution.initialize()`, which connects to the coordinator
    (process 0) and seeds Keras's random generator the same everywhere.
    A second call does nothing.

    Args:
        job_addresses: `"host:port"` of the coordinator (process 0), or a
            comma-separated list of every process's address with it first.
            Defaults to `KERAS_DISTRIBUTION_JOB_ADDRESSES`.
        num_processes: Integer, the processes in the cluster. Defaults to
            `KERAS_DISTRIBUTION_NUM_PROCESSES`.
        process_id: Integer in `[0, num_processes)`, this process's rank;
            `0` is the chief. Defaults to `KERAS_DISTRIBUTION_PROCESS_ID`.

    Raises:
        ValueError: on another backend than JAX (see the module's
            docstring), or without the cluster's description.

    Example:

    ```python
    # On host 0 (10.0.0.1), and with process_id=1 on host 1:
    keras_isobn.distribution.initialize_cluster(
        "10.0.0.1:1234", num_processes=2, process_id=0
    )
    with keras_isobn.distribution.data_parallel_scope("multi_worker"):
        ...
    ```
    """
    check_multi_process_backend()
    if _CLUSTER:
        return
    given = (job_addresses, num_processes, process_id)
    if None in given and cluster_environment() is None:
        raise ValueError(
            "A cluster needs the coordinator's address, the number of "
            "processes and this process's id, as arguments or in the "
            f"{', '.join(ENVIRONMENT)} variables (which a cluster manager, "
            "or `python -m keras_isobn.launch` on one machine, sets). "
            f"Received: job_addresses={job_addresses}, "
            f"num_processes={num_processes}, process_id={process_id}"
        )
    import jax

    # XLA's CPU client has no cross-process collectives of its own.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    keras.distribution.initialize(job_addresses, num_processes, process_id)
    _CLUSTER["job_addresses"] = job_addresses or os.environ.get(ENVIRONMENT[0])


def join_cluster():
    """Joins the cluster of the `KERAS_DISTRIBUTION_*` variables, if any.

    The way for a script to run unchanged alone and under a cluster
    manager: `initialize_cluster()` when the variables describe a cluster
    (see `cluster_environment()`), nothing otherwise.

    Returns:
        Whether this process is now part of a cluster.
    """
    environment = cluster_environment()
    if environment is None:
        return bool(_CLUSTER)
    initialize_cluster(**environment)
    return True


def process_count():
    """The number of processes training together (`1` without a cluster)."""
    if not _CLUSTER:
        return 1
    import jax

    return jax.process_count()


def process_index():
    """This process's rank in the cluster, from `0` (`0` without one)."""
    if not _CLUSTER:
        return 0
    import jax

    return jax.process_index()


def is_chief():
    """Whether this process is the one that writes (process `0`).

    In a cluster, every process computes the same weights and metrics; the
    chief alone writes results, checkpoints and logs, so that the processes
    do not overwrite each other's files (on a shared file system) or leave
    partial copies (on local disks).
    """
    return process_index() == 0


def barrier(name):
    """Waits until every process of the cluster reaches `barrier(name)`.

    E.g. after the chief writes a file that the others then read. Without
    a cluster it returns at once.

    Args:
        name: String naming the barrier, the same in every process.
    """
    if process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def in_cluster():
    """Whether `initialize_cluster()` has joined this process to a cluster."""
    return bool(_CLUSTER)


def coordinator_host():
    """The host of the cluster's coordinator (process 0)."""
    address = (_CLUSTER.get("job_addresses") or "").split(",")[0]
    if ":" not in address:
        raise ValueError(
            "`stop_cluster_on_error()` needs the coordinator's address: "
            "give `job_addresses` (or KERAS_DISTRIBUTION_JOB_ADDRESSES) to "
            f"`initialize_cluster()`. Received: {address!r}"
        )
    return address.rsplit(":", 1)[0].strip("[]")

