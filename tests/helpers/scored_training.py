"""A small IsoBN model trained with scores that tests choose, per epoch."""

import keras
import numpy as np

from keras_isobn import IsoBatchNormalization


def variable_values(variables):
    """The values of `variables`, as NumPy copies."""
    return [np.array(keras.ops.convert_to_numpy(v)) for v in variables]


def toy_data(rows=20, features=5, seed=0):
    """`rows` random examples of `features` features, 2 separable classes."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int32")
    return x, y


def isobn_model(seed=11, dropout_seed=None):
    """Dense -> Dropout -> IsoBN -> Dense, compiled, seeded by `seed`."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(6, activation="relu"),
            keras.layers.Dropout(0.3, seed=dropout_seed),
            IsoBatchNormalization(momentum=0.2, name="isobn"),
            keras.layers.Dense(2),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


class Scores(keras.callbacks.Callback):
    """Puts `score` = `scores[epoch]` in the logs; keeps the weights."""

    def __init__(self, scores):
        super().__init__()
        self.scores = scores
        self.weights = []

    def on_epoch_end(self, epoch, logs=None):
        logs["score"] = self.scores[epoch]
        self.weights.append(variable_values(self.model.variables))


def fit_scored(model, callbacks, epochs, initial_epoch=0):
    """Fits `model` on 16 examples, in order, in batches of 8."""
    x, y = toy_data(rows=16)
    return model.fit(
        x,
        y,
        batch_size=8,
        epochs=epochs,
        initial_epoch=initial_epoch,
        shuffle=False,
        callbacks=callbacks,
        verbose=0,
    )
