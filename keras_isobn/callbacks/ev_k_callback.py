"""`EVkCallback`: EV_k of the embeddings entering and leaving a layer."""

import keras
import numpy as np

from keras_isobn.batching import pad_rows
from keras_isobn.callbacks.layer_probe import embedding_rows
from keras_isobn.callbacks.layer_probe import find_layer
from keras_isobn.callbacks.layer_probe import prepare_inputs
from keras_isobn.callbacks.layer_probe import probe_model
from keras_isobn.callbacks.prediction import is_positive_int
from keras_isobn.callbacks.prediction import predict
from keras_isobn.isotropy import explained_variance

__all__ = ["EVkCallback"]


class EVkCallback(keras.callbacks.Callback):
    """Records EV_k of the embeddings entering and leaving a layer.

    At the end of every `every` epochs (and, optionally, every
    `every_n_batches` training batches) the callback runs the probe `data`
    through the model in inference mode, takes the embeddings entering and
    leaving the model's `IsoBatchNormalization` layer (or the layer named by
    `layer`), and writes their EV_k (the share of the variance on the top-k
    principal components, see `keras_isobn.isotropy.explained_variance`) to
    `logs` as Python floats, under the keys
    `f"{prefix}{k}_in"` and `f"{prefix}{k}_out"` for each `k`: `"ev3_in"`
    and `"ev3_out"` by default. `History` (so `model.fit(...).history`),
    `CSVLogger`, `TensorBoard` and the progress bar record them, provided
    they come after this callback in `callbacks` (`History` and the progress
    bar always do).

    The probe uses inference mode only: no weight or moving statistic of the
    model changes. The probe data is prepared once (raw strings through the
    model's `preprocessor`, a `tf.data.Dataset` read in full), so every
    measurement sees the same examples.

    The layer may sit in the model's own functional graph (e.g. the
    normalization of a KerasHub task head) or inside functional models
    nested in it and called on its inputs (e.g. `"transformer_layer_0"` of a
    KerasHub backbone). Its first call is probed, and the embeddings
    entering it are its first positional argument. Embeddings of rank 3,
    `(batch, sequence, features)`, count one row per position; when the
    inputs hold a `"padding_mask"` of shape `(batch, sequence)`, padded
    positions are left out.

    On the JAX backend, `fit` holds the variables in its own state and
    writes them back to the model at the end of each epoch, before
    `on_epoch_end`. For the measurements every `every_n_batches` batches,
    the callback calls `model.jax_state_sync()` first, which costs one copy
    of the state per measurement.

    Args:
        data: The probe inputs, without labels: a NumPy array (or backend
            tensor), a dict or tuple of them as the model takes, raw strings
            (or a tuple `(first_segments, second_segments)`) for a model with
            a `preprocessor` such as a KerasHub `TextClassifier`, or a finite
            `tf.data.Dataset` of such batches, possibly with labels (`(x, y)`
            or `(x, y, sample_weight)` elements, as `fit` takes).
        k: Integer `>= 1` or a sequence of them: the numbers of principal
            components. Defaults to `3`.
        layer: The layer to probe: a name (searched in the model and in the
            functional models nested in it), a layer instance, or `None`
            (the default) for the model's only `IsoBatchNormalization`.
        every: Integer `>= 1`. Measure at the end of epochs `every`,
            `2 * every`, ... (counted from 1). Defaults to `1`.
        every_n_batches: `None` (the default) or an integer `>= 1`: also
            measure after training batches `every_n_batches`,
            `2 * every_n_batches`, ... of each epoch (counted from 1) and
            write the values to that batch's logs (shown by the progress bar
            and by `TensorBoard(update_freq="batch")`).
        batch_size: Integer `>= 1`. Batch size for running the probe (and
            for preprocessing raw strings). Every batch is full (the data
            is padded by repeating its first rows, and their outputs
            dropped), so under `keras.distribution.DataParallel` give a
            multiple of the number of devices. Defaults to `32`.
        prefix: String starting the keys in `logs`. Defaults to `"ev"`.

    Attributes:
        keys: The keys written to `logs`, e.g. `["ev3_in", "ev3_out"]`.
        history: A dict of lists of every measurement of this callback:
            `"epoch"` (epochs completed, fractional for measurements after a
            batch, `0.0` for the one made when training first starts) and
            one list per key.

    Example:

    ```python
    callback = keras_isobn.EVkCallback(probe_sentences, k=[1, 3])
    history = classifier.fit(train_ds, epochs=3, callbacks=[callback])
    history.history["ev3_in"], history.history["ev3_out"]
    ```
    """

    def __init__(
        self,
        data,
        k=3,
        layer=None,
        every=1,
        every_n_batches=None,
        batch_size=32,
        prefix="ev",
    ):
        super().__init__()
        ks = [k] if np.ndim(k) == 0 else list(k)
        if not ks or not all(is_positive_int(value) for value in ks):
            raise ValueError(
                "`k` must be an integer >= 1 or a non-empty sequence of them. "
                f"Received: k={k!r}"
            )
        if not is_positive_int(every):
            raise ValueError(
                f"`every` must be an integer >= 1 (epochs). Received: "
                f"every={every!r}"
            )
        if every_n_batches is not None and not is_positive_int(
            every_n_batches
        ):
            raise ValueError(
                "`every_n_batches` must be None or an integer >= 1. "
                f"Received: every_n_batches={every_n_batches!r}"
            )
        if not is_positive_int(batch_size):
            raise ValueError(
                f"`batch_size` must be an integer >= 1. Received: "
                f"batch_size={batch_size!r}"
            )
        if not (layer is None or isinstance(layer, (str, keras.layers.Layer))):
            raise ValueError(
                "`layer` must be None, a layer name or a layer instance. "
                f"Received: layer={layer!r}"
            )
        self.data = data
        self.k = [int(value) for value in ks]
        self.layer = layer
        self.every = int(every)
        self.every_n_batches = every_n_batches
        self.batch_size = int(batch_size)
        self.prefix = str(prefix)
        self.keys = [
            f"{self.prefix}{value}_{side}"
            for value in self.k
            for side in ("in", "out")
        ]
        self.history = {"epoch": [], **{key: [] for key in self.keys}}
        self._probe_model = None
        self._probe_for = None
        self._epoch = 0
        self._latest = None

    @property
    def async_safe(self):
        # Without batch-level measurements nothing happens at batch end, so
        # Keras may dispatch the batch callbacks asynchronously.
        return self.every_n_batches is None

    @property
    def data(self):
        """The probe data; setting it replaces the prepared probe inputs."""
        return self._data

    @data.setter
    def data(self, data):
        self._data = data
        self._inputs = None
        self._inputs_for = None

    def measure(self, model=None):
        """Runs the probe and returns EV_k of the layer's inputs and outputs.

        Args:
            model: The model to probe. Defaults to the model the callback is
                attached to.

        Returns:
            A dict of Python floats, one per entry of `keys`.
        """
        model = self.model if model is None else model
        if model is None:
            raise ValueError(
                "No model to probe: pass `model=` or use the callback in "
                "`model.fit(..., callbacks=[callback])`."
            )
        probe = self._get_probe_model(model)
        inputs = self._get_inputs(model)
        # Full batches only (the first rows repeated, their outputs
        # dropped): one compiled step for all, and batches that split
        # evenly across data-parallel devices.
        size = len(keras.tree.flatten(inputs)[0])
        padded = keras.tree.map_structure(
            lambda array: pad_rows(array, self.batch_size), inputs
        )
        embeddings = predict(probe, padded, self.batch_size)
        embeddings = [values[:size] for values in embeddings]
        mask = inputs.get("padding_mask") if isinstance(inputs, dict) else None
        results = {}
        for side, values in zip(("in", "out"), embeddings):
            rows = embedding_rows(values, mask)
            try:
                shares = explained_variance(rows, self.k)
            except ValueError as error:
                raise ValueError(
                    f"Cannot measure EV_k of the {side}puts of layer "
                    f"'{self._probed_layer.name}' (shape {values.shape}): "
                    f"{error}"
                ) from error
            for value, share in zip(self.k, shares):
                results[f"{self.prefix}{value}_{side}"] = float(share)
        return results

    def on_train_begin(self, logs=None):
        if not self.history["epoch"]:
            self._record(0.0, self.measure())

    def on_train_batch_end(self, batch, logs=None):
        if self.every_n_batches is None:
            return
        self._latest = None
        if (batch + 1) % self.every_n_batches != 0:
            return
        if hasattr(self.model, "jax_state_sync"):
            self.model.jax_state_sync()
        results = self.measure()
        steps = self.params.get("steps") if self.params else None
        epoch = self._epoch + (batch + 1) / steps if steps else np.nan
        self._record(epoch, results)
        self._latest = results
        if logs is not None:
            logs.update(results)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._latest = None

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every != 0:
            return
        # Reuse a measurement made after the last batch: nothing changed.
        results = self._latest
        if results is None:
            results = self.measure()
            self._record(float(epoch + 1), results)
        if logs is not None:
            logs.update(results)

    def _record(self, epoch, results):
        self.history["epoch"].append(float(epoch))
        for key in self.keys:
            self.history[key].append(results[key])

    def _get_probe_model(self, model):
        if self._probe_for is not model:
            self._probed_layer = find_layer(model, self.layer)
            self._probe_model = probe_model(model, self._probed_layer)
            self._probe_for = model
        return self._probe_model

    def _get_inputs(self, model):
        if self._inputs_for is not model:
            self._inputs = prepare_inputs(model, self.data, self.batch_size)
            self._inputs_for = model
        return self._inputs
