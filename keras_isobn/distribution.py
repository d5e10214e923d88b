"""Data-parallel training on the backend's own distributed engine.

IsoBN's statistics are those of the *global* batch, as on one device with
the whole batch:

- JAX: `keras.distribution.DataParallel` (or `ModelParallel` with a
  `LayoutMap`) compiles one program over all devices, so the batch sums are
  global without anything else to do.
- TensorFlow: `tf.distribute.MirroredStrategy` runs one copy of the step
  per replica. Each replica computes the statistics of its own share of the
  batch and keeps its own copy of the moving statistics (what is read and
  saved is the first replica's), unless the layers are `synchronized`
  (`synchronize_statistics(model)`): then the batch sums and sums of outer
  products are all-reduced, and every copy holds the statistics of the
  global batch.
- PyTorch: single-process training on one device only; a data-parallel
  or synchronized request raises an error.

Several processes (hosts) train together on JAX: each process calls
`initialize_cluster()` (or `join_cluster()`, from the `KERAS_DISTRIBUTION_*`
variables) first, then builds and fits the model in
`data_parallel_scope("multi_worker")`, the same program everywhere. One
program runs over the devices of all processes, whose collectives (gloo
on CPUs) make the batch statistics and gradients the global batch's.
`stop_cluster_on_error()` stops the survivors when a process dies. On
TensorFlow, Keras 3's `fit` fails under `MultiWorkerMirroredStrategy`
(keras-team/keras#20585), so a multi-process request raises an error there,
as on PyTorch.
"""

import contextlib
import os
import select
import socket
import sys
import threading
import traceback

import keras

from keras_isobn.layers import IsoBatchNormalization

KINDS = ("data_parallel", "multi_worker", None)
ENVIRONMENT = (
    "KERAS_DISTRIBUTION_JOB_ADDRESSES",
    "KERAS_DISTRIBUTION_NUM_PROCESSES",
    "KERAS_DISTRIBUTION_PROCESS_ID",
)
MWMS_BUG = (
    "Keras 3's `fit` fails under tf.distribute.MultiWorkerMirroredStrategy "
    "(keras-team/keras#20585; reproduced with Keras 3.15 and TensorFlow "
    "2.21, benchmarks/results/mwms_repro.py)"
)
_STRATEGIES = {}
_CLUSTER = {}


@contextlib.contextmanager
def data_parallel_scope(kind="data_parallel", devices=None):
    """Context manager under which a model is built and trained in parallel.

    Build, compile and `fit` the model in the block. The `batch_size` given
    to `fit` (or the batches of a dataset) is the *global* batch, split in
    equal shares across the replicas. On TensorFlow, build the layers with
    `synchronized=True` (or call `synchronize_statistics(model)` before
    `compile()`) so IsoBN's statistics are the global batch's.

    Keep every batch a multiple of the number of replicas: on JAX each batch
    in the block must be, the last batch of the training and validation
    data included (use `drop_remainder=True`, or `evaluate`/`predict` after
    the block, which take any batch); on TensorFlow the first batch of a
    `fit` or `evaluate` must be. On TensorFlow with several replicas,
    Keras 3.15's `fit` and `evaluate` also reject boolean inputs (their
    first batch is averaged across replicas to build the model): give
    KerasHub's `padding_mask` as int32, the backbones' input dtype (the
    keras-isobn classifiers' preprocessors do).

    With several processes (JAX, `kind="multi_worker"`), every process runs
    the same program on the same global batches: `fit` on a batched
    `tf.data.Dataset` gives each process its share of every global batch
    (Keras shards the dataset by process), and the batch statistics, the
    gradients and so the weights are the same everywhere. Predict with
    `predict_on_batch` on a whole global batch (the same on every process):
    its outputs are the global batch's, on every process.

    Args:
        kind: `"data_parallel"` to replicate the model on `devices` and
            split every batch across them, `"multi_worker"` to do so over
            the devices of all the processes of a cluster joined with
            `initialize_cluster()` (JAX only), or `None` to train as usual
            (one device; the block does nothing).
        devices: Optional list of devices, as `keras.distribution.
            list_devices()` names them (e.g. `["gpu:0", "gpu:1"]`). Defaults
            to all of them: the GPUs (or TPUs) if any, else the CPUs (of
            every process, for `"multi_worker"`).

    Yields:
        The number of replicas the global batch is split across (`1` for
        `kind=None`).

    Raises:
        ValueError: for an unknown `kind`, `"data_parallel"` on a backend
            without a supported engine (PyTorch), or `"multi_worker"` (or a
            `TF_CONFIG` cluster) on another backend than JAX.
        RuntimeError: for `"multi_worker"` before `initialize_cluster()`.

    Example:

    ```python
    with keras_isobn.distribution.data_parallel_scope() as replicas:
        classifier = keras_isobn.models.IsoBNBertTextClassifier.from_preset(
            "bert_base_en_uncased", num_classes=2
        )
        keras_isobn.distribution.synchronize_statistics(classifier)
        classifier.compile(...)
        classifier.fit(x, y, batch_size=32 * replicas)
    ```
    """
    if kind not in KINDS:
        raise ValueError(
            f"`kind` must be one of {KINDS}: 'data_parallel' to split each "
            "batch across devices, 'multi_worker' across the devices of "
            "several processes, None for one device. "
            f"Received: kind={kind!r}"
        )
    if kind is None:
        yield 1
        return
    backend = keras.backend.backend()
    if kind == "multi_worker":
        _check_multi_process_backend()
        if not _CLUSTER:
            raise RuntimeError(
                "`data_parallel_scope('multi_worker')` needs the cluster: "
                "call `keras_isobn.distribution.initialize_cluster()` (or "
                "`join_cluster()`) first, before anything is computed."
            )
        devices = devices or keras.distribution.list_devices()
        with keras.distribution.DataParallel(devices=devices).scope():
            yield len(devices)
        return
    if backend == "tensorflow":
        strategy = _tensorflow_strategy(devices)
        with strategy.scope():
            yield strategy.num_replicas_in_sync
    elif backend == "jax":
        if devices is None:
            devices = keras.distribution.list_devices()
        with keras.distribution.DataParallel(devices=devices).scope():
            yield len(devices)
    else:
        raise ValueError(
            f"Data-parallel training is not supported on the {backend} "
            "backend: keras-isobn trains there in a single process (one "
            "device), whose statistics are those of the whole batch. Use "
            "`kind=None`, or KERAS_BACKEND=tensorflow (tf.distribute) or "
            "KERAS_BACKEND=jax (keras.distribution) for data-parallel "
            f"training. Received: kind={kind!r}"
        )


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
    _check_multi_process_backend()
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


@contextlib.contextmanager
def stop_cluster_on_error():
    """Stops every process of the cluster soon after one of them stops.

    A process killed (`SIGKILL`, out of memory) while the others wait for
    it in a collective operation would leave them waiting until JAX's
    heartbeat timeout (100 s) or longer. In the block, a thread in each
    process keeps a connection to the chief: when a process ends before
    leaving its block, the chief sees its connection close, prints an
    error naming it and exits with status 1 at once (`os._exit`), and the
    other processes, seeing the chief's connection close, do the same,
    within a fraction of a second. A process that raises in the block
    prints its error and exits at once too (status 1, or that of a
    `SystemExit`), which stops the others likewise; one that leaves the
    block normally says so to the chief first. Without a cluster the
    block does nothing.

    Example:

    ```python
    keras_isobn.distribution.join_cluster()
    with keras_isobn.distribution.stop_cluster_on_error():
        model.fit(...)  # Every process, the same program.
    ```
    """
    if process_count() <= 1:
        yield
        return
    guard = _Watchdog(process_index(), process_count(), _coordinator_host())
    try:
        yield
    except BaseException as error:
        guard.stop(error)
    guard.close(done=True)


class _Watchdog:
    """The connections of `stop_cluster_on_error()`: workers to the chief.

    The chief listens on a free port, which a broadcast over the cluster's
    own collectives tells the workers. Each connection carries one message,
    `b"done"`, sent when its process leaves the block normally; a
    connection closed without it (the kernel closes the sockets of a
    killed process) stops the process at the other end.
    """

    def __init__(self, index, count, host):
        from jax.experimental import multihost_utils

        self.index, self.count, self.closing = index, count, False
        server, port = None, 0
        if index == 0:
            server = socket.create_server(("", 0))
            server.listen(count)
            port = server.getsockname()[1]
        port = int(multihost_utils.broadcast_one_to_all(port))
        if index == 0:
            self.peers = {}
            for _ in range(count - 1):
                connection, _ = server.accept()
                peer = int.from_bytes(connection.recv(4), "big")
                self.peers[peer] = connection
            server.close()
        else:
            connection = socket.create_connection((host, port), timeout=60)
            connection.settimeout(None)
            connection.sendall(index.to_bytes(4, "big"))
            self.peers = {0: connection}
        for peer, connection in self.peers.items():
            threading.Thread(
                target=self._watch, args=(peer, connection), daemon=True
            ).start()

    def _watch(self, peer, connection):
        try:
            message = connection.recv(16)
        except OSError:
            message = b""
        if not (message.startswith(b"done") or self.closing):
            self._exit(self._lost(peer), 1)

    def _lost(self, peer):
        what = "the chief" if peer == 0 else "a worker"
        return (
            f"keras_isobn.distribution: process {peer} of the "
            f"{self.count}-process cluster ({what}) stopped before the end "
            f"(killed, or failed); stopping process {self.index} too (exit "
            "status 1) rather than wait for it in a collective. Running "
            "the same commands again resumes from the last saved state."
        )

    def _exit(self, message, status):
        sys.stdout.flush()
        print(message, file=sys.stderr, flush=True)
        os._exit(status)

    def stop(self, error):
        """Ends this process after `error`, naming a lost peer if any."""
        self.closing = True
        # A collective fails too when a peer dies: if one did, say so.
        ready, _, _ = select.select(list(self.peers.values()), [], [], 1.0)
        for peer, connection in self.peers.items():
            if connection in ready and not connection.recv(16, socket.MSG_PEEK):
                self._exit(self._lost(peer), 1)
        status = 1
        if isinstance(error, SystemExit):
            status = error.code if isinstance(error.code, int) else 1
            message = "" if error.code in (None, 0) else str(error.code)
        else:
            message = "".join(traceback.format_exception(error))
        self._exit(
            f"{message}\nkeras_isobn.distribution: process {self.index} "
            f"stops, and so the {self.count}-process cluster.",
            status,
        )

    def close(self, done=False):
        self.closing = True
        for connection in self.peers.values():
            try:
                if done:
                    connection.sendall(b"done")
                connection.close()
            except OSError:
                pass


def _coordinator_host():
    address = (_CLUSTER.get("job_addresses") or "").split(",")[0]
    if ":" not in address:
        raise ValueError(
            "`stop_cluster_on_error()` needs the coordinator's address: "
            "give `job_addresses` (or KERAS_DISTRIBUTION_JOB_ADDRESSES) to "
            f"`initialize_cluster()`. Received: {address!r}"
        )
    return address.rsplit(":", 1)[0].strip("[]")


def _check_multi_process_backend():
    backend = keras.backend.backend()
    if backend == "jax":
        return
    if backend == "tensorflow":
        cause = MWMS_BUG
    else:
        cause = "Keras has no multi-process training on PyTorch"
    raise ValueError(
        f"Training with several processes is not supported on the {backend} "
        f"backend: {cause}. Use KERAS_BACKEND=jax (keras.distribution, "
        "tested on the loopback), or one process with "
        "`data_parallel_scope('data_parallel')` on TensorFlow."
    )


def synchronize_statistics(model):
    """Makes a model's batch statistics those of the global batch.

    Sets `synchronized=True` on every `keras_isobn.IsoBatchNormalization`
    and `keras.layers.BatchNormalization` of `model` (nested models and
    layers included), so that under a `tf.distribute` strategy the replicas
    all-reduce their batch sums and all hold the same moving statistics.
    Call it before `compile()` (a compiled step keeps the statistics it was
    traced with). Outside a strategy the statistics are unchanged.

    On JAX this does nothing (`keras.distribution` computes the global
    batch's statistics already). The option is in each layer's config, so a
    model rebuilt from its config (e.g. reloaded) keeps it.

    Args:
        model: A Keras model or layer.

    Returns:
        The list of layers set to `synchronized=True` (empty on JAX).

    Raises:
        ValueError: on the PyTorch backend, which has no synchronized
            statistics.
    """
    backend = keras.backend.backend()
    if backend == "jax":
        return []
    if backend != "tensorflow":
        raise ValueError(
            f"Synchronized statistics are not supported on the {backend} "
            "backend: keras-isobn trains there in a single process, whose "
            "statistics are those of the whole batch already. Don't call "
            "`synchronize_statistics`, or use KERAS_BACKEND=tensorflow "
            "(tf.distribute) or KERAS_BACKEND=jax (keras.distribution) for "
            "data-parallel training."
        )
    layers = [
        layer
        for layer in _layers_of(model)
        if isinstance(
            layer, (IsoBatchNormalization, keras.layers.BatchNormalization)
        )
    ]
    for layer in layers:
        layer.synchronized = True
    return layers


def _layers_of(layer):
    """`layer` and, for a model, the layers of it and of nested models.

    Keras has no public walk into the sublayers of a plain `Layer`; models
    (functional models, KerasHub tasks and backbones) list theirs in
    `layers`, which is where normalizations sit.
    """
    yield layer
    if isinstance(layer, keras.Model):
        for sublayer in layer.layers:
            yield from _layers_of(sublayer)


def accelerator_visible():
    """Whether the backend sees a GPU or TPU (without starting it twice)."""
    if keras.backend.backend() == "torch":  # No `list_devices` there.
        import torch

        return torch.cuda.is_available()
    devices = keras.distribution.list_devices()
    return any(not device.lower().startswith("cpu") for device in devices)


def virtual_cpu_devices(count):
    """Splits the host CPU into `count` devices, to try data parallelism.

    With them, `data_parallel_scope()` (or any `keras.distribution` or
    `tf.distribute` engine) runs `count` replicas on one machine without
    accelerators, e.g. in tests or on a laptop. Call it first thing, before
    the backend computes anything (on JAX, before any JAX operation; on
    TensorFlow, before its runtime starts).

    Args:
        count: Integer `>= 1`, the number of CPU devices.

    Returns:
        The device names, as `keras.distribution.list_devices("cpu")` gives
        them.

    Raises:
        RuntimeError: if the backend has already started with another
            number of CPU devices.
        ValueError: for `count < 1`, or on a backend without virtual
            devices (PyTorch).
    """
    if int(count) != count or count < 1:
        raise ValueError(
            f"`count` must be an integer >= 1. Received: count={count}"
        )
    count = int(count)
    backend = keras.backend.backend()
    try:
        if backend == "jax":
            import jax

            if hasattr(jax.config, "jax_num_cpu_devices"):
                jax.config.update("jax_num_cpu_devices", count)
            else:  # JAX < 0.4.38
                os.environ["XLA_FLAGS"] = (
                    os.environ.get("XLA_FLAGS", "")
                    + f" --xla_force_host_platform_device_count={count}"
                )
        elif backend == "tensorflow":
            import tensorflow as tf

            cpu = tf.config.list_physical_devices("CPU")[0]
            current = tf.config.get_logical_device_configuration(cpu)
            if len(current or [None]) != count:
                tf.config.set_logical_device_configuration(
                    cpu, [tf.config.LogicalDeviceConfiguration()] * count
                )
        else:
            raise ValueError(
                f"Virtual CPU devices are not supported on the {backend} "
                "backend (no data-parallel engine there); use "
                "KERAS_BACKEND=jax or KERAS_BACKEND=tensorflow."
            )
    except RuntimeError as error:
        if len(keras.distribution.list_devices("cpu")) == count:
            return keras.distribution.list_devices("cpu")
        raise RuntimeError(
            f"Cannot split the CPU into {count} devices: the {backend} "
            "backend has already started. Call `virtual_cpu_devices()` "
            "before anything is computed, e.g. right after `import keras`. "
            f"Cause: {error}"
        ) from error
    return keras.distribution.list_devices("cpu")


def _tensorflow_strategy(devices):
    """The process's strategy for `devices`, created once and reused.

    Two `tf.distribute` strategies in one process share the keys of their
    collective operations, so a second one aborts with "Shape mismatch in
    the collective instance" (tensorflow/tensorflow#62790): every block of
    the same devices gets the same strategy.
    """
    import tensorflow as tf

    if "TF_CONFIG" in os.environ:
        # A `TF_CONFIG` cluster asks for `MultiWorkerMirroredStrategy`.
        _check_multi_process_backend()
    if devices is None:
        devices = keras.distribution.list_devices()
    key = tuple(devices)
    if key not in _STRATEGIES:
        _STRATEGIES[key] = tf.distribute.MirroredStrategy(list(key))
    return _STRATEGIES[key]
