"""Whole-set prediction in full batches, and the callbacks' argument checks."""

import functools

import keras
import numpy as np

from keras_isobn import distribution
from keras_isobn.batching import sequence_lengths
from keras_isobn.batching import trim_padding

__all__ = ["is_positive_int", "predict"]


def predict(model, x, batch_size, trim=None):
    """`model.predict(x)`, batch by batch; with `trim`, by length, cut.

    `predict_on_batch` makes no data pipeline per call (on TensorFlow,
    `predict` makes an autotuned `tf.data` iterator, whose deletion can
    wait for the thread that autotuning starts); `predict` splits batches
    across devices when a model is distributed. In a cluster of processes,
    every process predicts each whole batch with `predict_on_batch`, one
    program over all devices whose outputs every process gets. `x`'s rows
    are a multiple of `batch_size`.
    """
    size = len(keras.tree.flatten(x)[0])
    order = np.arange(size)
    mask = x.get("padding_mask") if isinstance(x, dict) else None
    trim = trim if mask is not None and np.ndim(mask) == 2 else None
    if trim:
        order = np.argsort(sequence_lengths(mask), kind="stable")
    strategy = getattr(model, "distribute_strategy", None)  # TensorFlow.
    if distribution.process_count() > 1:
        predict_batch = model.predict_on_batch
    elif keras.distribution.distribution() or (
        strategy and strategy.num_replicas_in_sync > 1
    ):
        predict_batch = functools.partial(
            model.predict, batch_size=batch_size, verbose=0
        )
    else:
        predict_batch = model.predict_on_batch
    pieces = []
    for start in range(0, size, batch_size):
        rows = order[start : start + batch_size]
        batch = keras.tree.map_structure(lambda a: np.asarray(a)[rows], x)
        if trim:
            batch = trim_padding(batch, trim)
        pieces.append(keras.tree.flatten(predict_batch(batch)))
    results = []
    for outputs in zip(*pieces):
        values = np.concatenate(outputs)
        values[order] = values.copy()
        results.append(values)
    return results if len(results) > 1 else results[0]



def is_positive_int(value):
    """Whether `value` is an integer (not a bool) `>= 1`."""
    return (
        isinstance(value, (int, np.integer))
        and not isinstance(value, bool)
        and value >= 1
    )

