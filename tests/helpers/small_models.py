"""A small Dense -> IsoBN -> BatchNormalization model, and its data."""

import keras
import numpy as np

from keras_isobn.layers import IsoBatchNormalization


def small_model(seed=0):
    """Dense -> IsoBN -> BatchNormalization -> Dense, seeded."""
    inputs = keras.Input((6,))
    x = keras.layers.Dense(
        6,
        activation="tanh",
        kernel_initializer=keras.initializers.GlorotUniform(seed),
        name="hidden",
    )(inputs)
    x = IsoBatchNormalization(name="iso")(x)
    x = keras.layers.BatchNormalization(name="bn")(x)
    outputs = keras.layers.Dense(
        3,
        kernel_initializer=keras.initializers.GlorotUniform(seed + 1),
        name="logits",
    )(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        keras.optimizers.Adam(0.01),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def small_data(n=24):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 6)) * np.logspace(0, -2, 6) + 1.0
    return x.astype("float32"), rng.integers(0, 3, size=n)
