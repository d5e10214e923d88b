"""Data-parallel training on the backend's own distributed engine.

IsoBN's statistics are those of the *global* batch, as on one device with
the whole batch:

- JAX: `keras.distribution.DataParallel` (or `ModelParallel` with a
  `LayoutMap`) compiles one program over all devices, so the batch sums are
  global without anything else to do.
- TensorFlow: `tf.distribute.MirroredStrategy` (`MultiWorkerMirroredStrategy`
  when `TF_CONFIG` describes a cluster) runs one copy of the step per
  replica. Each replica computes the statistics of its own share of the
  batch and keeps its own copy of the moving statistics (what is read and
  saved is the first replica's), unless the layers are `synchronized`
  (`synchronize_statistics(model)`): then the batch sums and sums of outer
  products are all-reduced, and every copy holds the statistics of the
  global batch.
- PyTorch: single-process training on one device only; a data-parallel
  or synchronized request raises an error.
"""

import contextlib
import os

import keras

from keras_isobn.layers import IsoBatchNormalization

KINDS = ("data_parallel", None)
_STRATEGIES = {}


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
    keras-isobn classifiers' preprocessors do). On JAX with several hosts,
    call `keras.distribution.initialize()` first.

    Args:
        kind: `"data_parallel"` to replicate the model on `devices` and
            split every batch across them, or `None` to train as usual (one
            device; the block does nothing).
        devices: Optional list of devices, as `keras.distribution.
            list_devices()` names them (e.g. `["gpu:0", "gpu:1"]`). Defaults
            to all of them: the GPUs (or TPUs) if any, else the CPUs. With
            TensorFlow and a `TF_CONFIG` cluster, each worker's local GPUs
            are used (`MultiWorkerMirroredStrategy`) and `devices` must be
            `None`.

    Yields:
        The number of replicas the global batch is split across (`1` for
        `kind=None`).

    Raises:
        ValueError: for an unknown `kind`, or `"data_parallel"` on a backend
            without a supported engine (PyTorch).

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
            "batch across devices, None for one device. "
            f"Received: kind={kind!r}"
        )
    if kind is None:
        yield 1
        return
    backend = keras.backend.backend()
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
        if devices is not None:
            raise ValueError(
                "With a `TF_CONFIG` cluster, each worker trains on its own "
                "local devices (MultiWorkerMirroredStrategy); pass "
                f"`devices=None`. Received: devices={devices}"
            )
        key = "multi_worker"
    else:
        if devices is None:
            devices = keras.distribution.list_devices()
        key = tuple(devices)
    if key not in _STRATEGIES:
        if key == "multi_worker":
            _STRATEGIES[key] = tf.distribute.MultiWorkerMirroredStrategy()
        else:
            _STRATEGIES[key] = tf.distribute.MirroredStrategy(list(key))
    return _STRATEGIES[key]
