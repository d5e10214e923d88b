"""Data-parallel training on 4 virtual CPU devices, for test_distribution.py.

Run in a subprocess, because the devices must be split before the backend
starts; from the repository root:

    KERAS_BACKEND=tensorflow python -m tests.helpers.distribution_worker OUT.npz

It trains the same models, from the same initial weights and on the same
global batches, on one device and on 4 replicas (TensorFlow:
`MirroredStrategy` with and without synchronized statistics; JAX:
`DataParallel` and a 2x2 `ModelParallel` layout), and saves the data and
what each run ends with (moving statistics, per-replica copies, weights,
predictions) to `OUT.npz` under keys `"<run>/<name>"`. The test makes the
assertions.
"""

import sys

import keras
import numpy as np

from keras_isobn import distribution
from keras_isobn.layers import IsoBatchNormalization

REPLICAS = 4
# Split before the backend computes anything (nothing does on import).
DEVICES = distribution.virtual_cpu_devices(REPLICAS)

# Sequences of `LENGTH` positions with `FEATURES` features; each global
# batch of `BATCH` sequences is split in 4 shares of `BATCH // 4`.
BATCH, STEPS, LENGTH, FEATURES, CLASSES = 16, 4, 4, 6, 3


def make_data(seed=0):
    """Anisotropic sequences, zero-padded to uneven lengths, and labels.

    The lengths are chosen so that the replicas' shares of a batch hold
    different numbers of positions (a mean of the replicas' means is not
    the global mean).
    """
    rng = np.random.default_rng(seed)
    n = BATCH * STEPS
    mixing = rng.normal(size=(FEATURES, FEATURES)) * np.logspace(
        0, -1.5, FEATURES
    )
    x = rng.normal(size=(n, LENGTH, FEATURES)) @ mixing + 0.5
    lengths = 1 + (np.arange(n) // (BATCH // REPLICAS)) % LENGTH
    x[np.arange(LENGTH)[None, :] >= lengths[:, None]] = 0.0
    y = rng.integers(0, CLASSES, size=n)
    x_test = rng.normal(size=(8, LENGTH, FEATURES)) @ mixing + 0.5
    return x.astype("float32"), y, x_test.astype("float32")


def tiny_model(synchronized=False):
    """Masking -> IsoBN -> Dense -> IsoBN -> mean over positions -> logits."""
    inputs = keras.Input((LENGTH, FEATURES))
    x = keras.layers.Masking(0.0)(inputs)
    x = IsoBatchNormalization(name="iso_in")(x)
    x = keras.layers.Dense(FEATURES, activation="tanh", name="hidden")(x)
    x = IsoBatchNormalization(name="iso_hidden")(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    outputs = keras.layers.Dense(CLASSES, name="logits")(x)
    model = keras.Model(inputs, outputs)
    if synchronized:
        distribution.synchronize_statistics(model)
    model.compile(
        keras.optimizers.SGD(0.1),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def tiny_classifier(synchronized=False):
    """A tiny randomly initialised IsoBN BERT classifier, no dropout."""
    import keras_hub

    from keras_isobn.models import IsoBNBertTextClassifier

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=50,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=8,
        dropout=0.0,
    )
    classifier = IsoBNBertTextClassifier(
        backbone=backbone, num_classes=2, dropout=0.0
    )
    if synchronized:
        distribution.synchronize_statistics(classifier)
    classifier.compile(
        keras.optimizers.SGD(0.1),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return classifier


def classifier_data(seed=1):
    rng = np.random.default_rng(seed)
    n = 8 * 3
    token_ids = rng.integers(1, 50, size=(n, 8))
    padding_mask = np.arange(8)[None, :] < rng.integers(2, 9, size=(n, 1))
    x = {
        "token_ids": np.where(padding_mask, token_ids, 0),
        "segment_ids": np.zeros((n, 8), "int32"),
        # int32, the backbone's input dtype: Keras 3.15 cannot `fit` bool inputs
        # under a multi-replica tf.distribute strategy.
        "padding_mask": padding_mask.astype("int32"),
    }
    return x, rng.integers(0, 2, size=n)


def train(build, synchronized, x, y, batch_size, initial_weights, scope=None):
    """Builds (in `scope`), sets `initial_weights`, fits one epoch in order.

    Args:
        build: `tiny_model` or `tiny_classifier`, called with
            `synchronized` in the scope.

    Returns:
        The model and the dict of what it ends with.
    """
    with scope or distribution.data_parallel_scope(None):
        model = build(synchronized)
        model.set_weights(initial_weights)
        history = model.fit(
            x, y, batch_size=batch_size, shuffle=False, epochs=1, verbose=0
        )
    results = {"loss": np.float64(history.history["loss"][-1])}
    for variable in model.weights:
        results[f"weights/{variable.path}"] = keras.ops.convert_to_numpy(
            variable
        )
    for layer in model._flatten_layers():
        if isinstance(layer, IsoBatchNormalization):
            for name in ("moving_covariance", "moving_std"):
                results[f"{layer.name}/{name}"] = keras.ops.convert_to_numpy(
                    getattr(layer, name)
                )
                results[f"{layer.name}/{name}/replicas"] = replica_copies(
                    getattr(layer, name)
                )
    return model, results


def replica_copies(variable):
    """The copies of a variable on each device, stacked on a first axis."""
    if keras.backend.backend() == "tensorflow":
        values = getattr(variable.value, "values", (variable.value,))
        return np.stack([v.numpy() for v in values])
    shards = variable.value.addressable_shards
    return np.stack([np.asarray(shard.data) for shard in shards])


def model_parallel_scope():
    """A 2x2 mesh: batch split in 2, Dense kernels split in 2 ("model")."""
    mesh = keras.distribution.DeviceMesh(
        (2, 2), axis_names=("batch", "model"), devices=DEVICES
    )
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["hidden/kernel"] = (None, "model")
    layout_map["hidden/bias"] = ("model",)
    return keras.distribution.ModelParallel(
        layout_map=layout_map, batch_dim_name="batch"
    ).scope()


def main(path):
    backend = keras.backend.backend()
    keras.utils.set_random_seed(0)
    x, y, x_test = make_data()
    initial = tiny_model().get_weights()
    runs = {"single": None, "data_parallel": distribution.data_parallel_scope}
    if backend == "tensorflow":
        runs["unsynchronized"] = distribution.data_parallel_scope
    else:
        runs["model_parallel"] = model_parallel_scope
    out = {"x": x, "y": y, "x_test": x_test, "devices": np.array(DEVICES)}
    for run, scope in runs.items():
        model, results = train(
            tiny_model,
            run == "data_parallel",
            x,
            y,
            BATCH,
            initial,
            scope=scope and scope(),
        )
        if run != "unsynchronized":
            # An eager call: `predict` would compile one more function.
            results["predictions"] = keras.ops.convert_to_numpy(
                model(x_test, training=False)
            )
        if backend == "jax":
            kernel = model.get_layer("hidden").kernel.value
            results["hidden_kernel_shard_shape"] = np.array(
                kernel.addressable_shards[0].data.shape
            )
        out.update({f"{run}/{k}": v for k, v in results.items()})

    cx, cy = classifier_data()
    initial = tiny_classifier().get_weights()
    for run, scope in (
        ("classifier_single", None),
        ("classifier_data_parallel", distribution.data_parallel_scope()),
    ):
        model, results = train(
            tiny_classifier,
            scope is not None,
            cx,
            cy,
            8,
            initial,
            scope=scope,
        )
        out.update({f"{run}/{k}": v for k, v in results.items()})
    np.savez(path, **out)


if __name__ == "__main__":
    main(sys.argv[1])
