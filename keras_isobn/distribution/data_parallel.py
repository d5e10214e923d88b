"""Data-parallel training: the scope of a model, synchronized statistics."""

import contextlib
import os

import keras

from keras_isobn.distribution.backend_support import (
    check_multi_process_backend,
)
from keras_isobn.distribution.backend_support import unsupported_backend_error
from keras_isobn.distribution.cluster import in_cluster
from keras_isobn.layers import IsoBatchNormalization

__all__ = ["KINDS", "data_parallel_scope", "synchronize_statistics"]

# The kinds of `data_parallel_scope()`.
KINDS = ("data_parallel", "multi_worker", None)
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
        check_multi_process_backend()
        if not in_cluster():
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
        raise unsupported_backend_error(
            "Data-parallel training",
            "keras-isobn trains there in a single process (one device), "
            "whose statistics are those of the whole batch",
            "Use `kind=None`, or KERAS_BACKEND=tensorflow (tf.distribute) or "
            "KERAS_BACKEND=jax (keras.distribution) for data-parallel "
            f"training. Received: kind={kind!r}",
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
        raise unsupported_backend_error(
            "Synchronizing statistics",
            "keras-isobn trains there in a single process, whose statistics "
            "are those of the whole batch already",
            "Don't call `synchronize_statistics`, or use "
            "KERAS_BACKEND=tensorflow (tf.distribute) or KERAS_BACKEND=jax "
            "(keras.distribution) for data-parallel training.",
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
        check_multi_process_backend()
    if devices is None:
        devices = keras.distribution.list_devices()
    key = tuple(devices)
    if key not in _STRATEGIES:
        _STRATEGIES[key] = tf.distribute.MirroredStrategy(list(key))
    return _STRATEGIES[key]
