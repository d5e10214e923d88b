"""Callbacks for fine-tuning: EV_k around a layer, metrics on a whole set."""

import functools
import sys

import keras
import numpy as np

from keras_isobn.isotropy import explained_variance
from keras_isobn.layers import IsoBatchNormalization


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
        if not ks or not all(_is_positive_int(value) for value in ks):
            raise ValueError(
                "`k` must be an integer >= 1 or a non-empty sequence of them. "
                f"Received: k={k!r}"
            )
        if not _is_positive_int(every):
            raise ValueError(
                f"`every` must be an integer >= 1 (epochs). Received: "
                f"every={every!r}"
            )
        if every_n_batches is not None and not _is_positive_int(
            every_n_batches
        ):
            raise ValueError(
                "`every_n_batches` must be None or an integer >= 1. "
                f"Received: every_n_batches={every_n_batches!r}"
            )
        if not _is_positive_int(batch_size):
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
            lambda array: _pad_rows(array, self.batch_size), inputs
        )
        embeddings = _predict(probe, padded, self.batch_size)
        embeddings = [values[:size] for values in embeddings]
        mask = inputs.get("padding_mask") if isinstance(inputs, dict) else None
        results = {}
        for side, values in zip(("in", "out"), embeddings):
            rows = _rows(values, mask)
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
            self._probed_layer = _find_layer(model, self.layer)
            self._probe_model = _probe_model(model, self._probed_layer)
            self._probe_for = model
        return self._probe_model

    def _get_inputs(self, model):
        if self._inputs_for is not model:
            self._inputs = _prepare_inputs(model, self.data, self.batch_size)
            self._inputs_for = model
        return self._inputs


class WholeSetMetrics(keras.callbacks.Callback):
    """Puts metrics computed on a whole evaluation set in `logs` each epoch.

    At every epoch end the callback predicts all of `x` and calls
    `metric_fn(y, predictions)`, so metrics that do not average over
    batches (Matthews or Pearson correlation, F1) are exact. The values go
    to `logs` as `f"{prefix}{name}"` (e.g. `"val_pearson"`), where
    `ModelCheckpoint`, `EarlyStopping`, `CSVLogger`, `TensorBoard` and
    `History` see them if they come after this callback in `callbacks`.

    With `ev_k`, the same prediction pass also returns the embeddings
    entering and leaving a layer (the model's `IsoBatchNormalization` by
    default), and their EV_k goes to `logs` under the keys of
    `EVkCallback`, `"ev3_in"` and `"ev3_out"` for `ev_k=3`: the isotropy
    of the evaluation set at the cost of the evaluation alone.

    Every batch is full: `x` is padded to a multiple of `batch_size` by
    repeating its first examples, whose predictions are dropped. So one
    compiled step serves every batch, and the batches split evenly across
    data-parallel replicas. With `trim_padding`, the examples are predicted
    in order of length, each batch cut to its longest sequence (see
    `keras_isobn.resume.trim_padding`): a few compiled steps, one per
    length, and a fraction of the cost for short sentences.

    Args:
        x: The model inputs: a NumPy array or a dict or tuple of them (e.g.
            token ids, preprocessed once rather than at every epoch).
        y: The labels, as `metric_fn` takes them.
        metric_fn: Callable `(y, predictions) -> dict` of metric name to
            float; e.g. `functools.partial(keras_isobn.glue.compute_metrics,
            "stsb")`.
        batch_size: Integer `>= 1`, the prediction batch size. Defaults to
            `32`.
        prefix: String starting the keys in `logs`. Defaults to `"val_"`.
        trim_padding: `None` (the default) or an integer `>= 1`: for a dict
            `x` with a `"padding_mask"` and a model that masks padded
            positions (a KerasHub text classifier), predict by length with
            batches cut to a multiple of `trim_padding` positions.
        ev_k: `None` (the default), or an integer `>= 1` or a sequence of
            them: also measure EV_k of the embeddings around `ev_layer`.
        ev_layer: The layer around which to measure, as `EVkCallback`'s
            `layer`: a name, a layer instance, or `None` (the default) for
            the model's only `IsoBatchNormalization`. Its embeddings must
            have one row per example (e.g. a pooled output).

    Attributes:
        predictions: NumPy float32 array, the predictions of the last
            evaluation (one row per example of `x`).

    Example:

    ```python
    dev = WholeSetMetrics(
        dev_inputs, dev_labels,
        functools.partial(keras_isobn.glue.compute_metrics, "cola"),
        trim_padding=8, ev_k=3,
    )
    model.fit(train_ds, epochs=3, callbacks=[dev])  # val_mcc, ev3_in, ...
    ```
    """

    def __init__(
        self,
        x,
        y,
        metric_fn,
        batch_size=32,
        prefix="val_",
        trim_padding=None,
        ev_k=None,
        ev_layer=None,
    ):
        super().__init__()
        if not _is_positive_int(batch_size):
            raise ValueError(
                f"`batch_size` must be an integer >= 1. Received: "
                f"batch_size={batch_size!r}"
            )
        if trim_padding is not None and not _is_positive_int(trim_padding):
            raise ValueError(
                "`trim_padding` must be None or an integer >= 1. Received: "
                f"trim_padding={trim_padding!r}"
            )
        ks = [] if ev_k is None else [ev_k] if np.ndim(ev_k) == 0 else ev_k
        if ev_k is not None and not (
            ks and all(_is_positive_int(value) for value in ks)
        ):
            raise ValueError(
                "`ev_k` must be None, an integer >= 1 or a non-empty "
                f"sequence of them. Received: ev_k={ev_k!r}"
            )
        self.size = len(keras.tree.flatten(x)[0])
        self.x = keras.tree.map_structure(
            lambda array: _pad_rows(np.asarray(array), batch_size), x
        )
        self.y = y
        self.metric_fn = metric_fn
        self.batch_size = int(batch_size)
        self.prefix = prefix
        self.trim_padding = trim_padding
        self.ev_k = [int(value) for value in ks]
        self.ev_layer = ev_layer
        self.predictions = None
        self._probe = (None, None, None)

    def evaluate(self, model=None):
        """Predicts the whole set and returns its metrics, by log key.

        Args:
            model: The model to evaluate. Defaults to the model the
                callback is attached to.

        Returns:
            A dict of `f"{prefix}{name}"` to float, and with `ev_k` the
            EV_k values (`"ev3_in"`, `"ev3_out"`, ...).
        """
        model = self.model if model is None else model
        outputs = _predict(
            self._probe_model(model), self.x, self.batch_size,
            self.trim_padding,
        )  # fmt: skip
        embeddings = []
        if self.ev_k:
            outputs, *embeddings = outputs
        self.predictions = np.asarray(outputs, "float32")[: self.size]
        scores = self.metric_fn(self.y, self.predictions)
        logs = {self.prefix + name: value for name, value in scores.items()}
        for side, values in zip(("in", "out"), embeddings):
            values = np.asarray(values)[: self.size]
            if values.ndim != 2:
                raise ValueError(
                    "WholeSetMetrics measures EV_k of embeddings with one "
                    f"row per example; layer '{self._probe[1].name}' gives "
                    f"shape {values.shape}. Use EVkCallback for it."
                )
            shares = explained_variance(values, self.ev_k)
            for k, share in zip(self.ev_k, shares):
                logs[f"ev{k}_{side}"] = float(share)
        return logs

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs.update(self.evaluate())

    def _probe_model(self, model):
        """`model`, or with `ev_k` one that also outputs the embeddings."""
        if not self.ev_k:
            return model
        if self._probe[0] is not model:
            layer = _find_layer(model, self.ev_layer)
            probe = _probe_model(model, layer)
            outputs = keras.tree.flatten(model.output)
            if len(outputs) != 1:
                raise ValueError(
                    "WholeSetMetrics with `ev_k` needs a model with one "
                    f"output; model '{model.name}' has {len(outputs)}."
                )
            probe = keras.Model(
                model.input, [outputs[0], *probe.outputs],
                name=f"{model.name}_with_{layer.name}",
            )  # fmt: skip
            self._probe = (model, layer, probe)
        return self._probe[2]


def _predict(model, x, batch_size, trim=None):
    """`model.predict(x)`, batch by batch; with `trim`, by length, cut.

    `predict_on_batch` makes no data pipeline per call (on TensorFlow,
    `predict` makes an autotuned `tf.data` iterator, whose deletion can
    wait for the thread that autotuning starts); `predict` splits batches
    across devices when a model is distributed. In a cluster of processes,
    every process predicts each whole batch with `predict_on_batch`, one
    program over all devices whose outputs every process gets. `x`'s rows
    are a multiple of `batch_size`.
    """
    # Imported here: `import keras_isobn` loads `callbacks`, not `resume`.
    from keras_isobn import distribution
    from keras_isobn.resume import trim_padding

    size = len(keras.tree.flatten(x)[0])
    order = np.arange(size)
    mask = x.get("padding_mask") if isinstance(x, dict) else None
    trim = trim if mask is not None and np.ndim(mask) == 2 else None
    if trim:
        mask = np.asarray(mask, bool)
        lengths = mask.shape[1] - np.argmax(mask[:, ::-1], axis=1)
        lengths[~mask.any(axis=1)] = 1
        order = np.argsort(lengths, kind="stable")
    strategy = getattr(model, "distribute_strategy", None)  # TensorFlow.
    if distribution.process_count() > 1:
        predict = model.predict_on_batch
    elif keras.distribution.distribution() or (
        strategy and strategy.num_replicas_in_sync > 1
    ):
        predict = functools.partial(
            model.predict, batch_size=batch_size, verbose=0
        )
    else:
        predict = model.predict_on_batch
    pieces = []
    for start in range(0, size, batch_size):
        rows = order[start : start + batch_size]
        batch = keras.tree.map_structure(lambda a: np.asarray(a)[rows], x)
        if trim:
            batch = trim_padding(batch, trim)
        pieces.append(keras.tree.flatten(predict(batch)))
    results = []
    for outputs in zip(*pieces):
        values = np.concatenate(outputs)
        values[order] = values.copy()
        results.append(values)
    return results if len(results) > 1 else results[0]


def _pad_rows(array, multiple):
    """`array` with its first rows repeated to a multiple of `multiple`."""
    size = len(array)
    return np.resize(array, (size + (-size) % multiple,) + array.shape[1:])


def _find_layer(model, layer):
    """The layer of `model` that `layer` (None, a name, a layer) names."""
    found = list(_walk(model))
    if layer is None:
        matches = [f for f in found if isinstance(f, IsoBatchNormalization)]
        if not matches:
            raise ValueError(
                f"Model '{model.name}' has no IsoBatchNormalization "
                "layer. Pass `layer=` with the name of the layer whose "
                "input and output embeddings to measure."
            )
        what = "IsoBatchNormalization layers"
    elif isinstance(layer, str):
        matches = [f for f in found if f.name == layer]
        if not matches:
            names = ", ".join(repr(f.name) for f in found)
            raise ValueError(
                f"Model '{model.name}' has no layer named '{layer}' (nested "
                f"models included). Its layers are: {names}."
            )
        what = f"layers named '{layer}'"
    else:
        matches = [f for f in found if f is layer]
        if not matches:
            raise ValueError(
                f"Layer '{layer.name}' is not part of model "
                f"'{model.name}' (nested models included)."
            )
        what = "copies of the layer"
    if len(matches) > 1:
        paths = ", ".join(f.path for f in matches)
        raise ValueError(
            f"Model '{model.name}' has {len(matches)} {what} ({paths}). "
            "Pass `layer=` with one layer instance to measure."
        )
    return matches[0]


def _is_positive_int(value):
    return (
        isinstance(value, (int, np.integer))
        and not isinstance(value, bool)
        and value >= 1
    )


def _walk(model):
    """Yields the layers of `model` and of the models nested in it."""
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from _walk(layer)


def _probe_model(model, layer):
    """A functional model from `model`'s inputs to `layer`'s in/outputs.

    `layer.input` and `layer.output` are those of the layer's first call.
    A layer inside a nested model connects to the outer inputs when the
    nested model is called on them, as KerasHub tasks call their backbone
    (`inputs = backbone.input`).
    """
    try:
        embeddings = keras.tree.flatten(layer.input)[0]
        outputs = keras.tree.flatten(layer.output)
    except (AttributeError, ValueError) as error:
        raise ValueError(
            f"Layer '{layer.name}' has not been called in a functional "
            f"graph: EVkCallback needs it in one. ({error})"
        ) from error
    if len(outputs) != 1:
        raise ValueError(
            f"Layer '{layer.name}' must take the embeddings as its first "
            "positional argument and return one tensor."
        )
    try:
        return keras.Model(
            model.input, [embeddings, outputs[0]], name=f"{layer.name}_probe"
        )
    except Exception as error:
        raise ValueError(
            f"Cannot connect layer '{layer.name}' to the inputs of model "
            f"'{model.name}': EVkCallback needs the layer in a functional "
            "model, or in functional models nested in it and called on its "
            f"inputs. ({type(error).__name__}: {error})"
        ) from error


def _prepare_inputs(model, data, batch_size):
    """The probe inputs as NumPy arrays, raw strings preprocessed."""
    if _is_tf_dataset(data):
        batches = [
            keras.utils.unpack_x_y_sample_weight(element)[0]
            for element in data.as_numpy_iterator()
        ]
        if not batches:
            raise ValueError("The probe dataset `data` is empty.")
    else:
        batches = [_as_arrays(data)]
    if _holds_text(batches[0]):
        batches = [
            piece
            for batch in batches
            for piece in _preprocess(model, batch, batch_size)
        ]
    return keras.tree.map_structure(
        lambda *arrays: np.concatenate(arrays), *batches
    )


def _preprocess(model, x, batch_size):
    if getattr(model, "preprocessor", None) is None:
        raise ValueError(
            f"The probe `data` holds raw strings but model '{model.name}' "
            "has no `preprocessor`. Use a KerasHub task with its "
            "preprocessor, or pass the model's numeric inputs (e.g. token "
            "ids)."
        )
    # KerasHub preprocesses raw strings in tf.data (some tokenizers take
    # no NumPy strings outside it).
    import tensorflow as tf

    preprocess = getattr(model, "preprocess_samples", model.preprocessor)
    # `(x,)`: a pair `(first, second)` is one `x`, not `(x, y)`.
    batches = tf.data.Dataset.from_tensor_slices((x,)).batch(batch_size)
    yield from batches.map(preprocess).as_numpy_iterator()


def _as_arrays(x):
    """Leaves of `x` as NumPy arrays; a list of strings is one leaf."""
    if isinstance(x, dict):
        return {key: _as_arrays(value) for key, value in x.items()}
    if isinstance(x, list) and x and isinstance(x[0], (str, bytes)):
        return np.asarray(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_as_arrays(value) for value in x)
    if isinstance(x, np.ndarray):
        return x
    return np.asarray(keras.ops.convert_to_numpy(x))


def _holds_text(x):
    return any(
        isinstance(leaf, (str, bytes))
        or (isinstance(leaf, np.ndarray) and leaf.dtype.kind in "OSU")
        for leaf in keras.tree.flatten(x)
    )


def _is_tf_dataset(data):
    # A tf.data.Dataset can only exist if TensorFlow was imported.
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(data, tf.data.Dataset)


def _rows(embeddings, mask):
    """Embeddings as `(rows, features)`, padded positions left out."""
    embeddings = np.asarray(embeddings)
    if embeddings.ndim <= 2:
        return embeddings
    rows = embeddings.reshape(-1, embeddings.shape[-1])
    if mask is not None and np.shape(mask) == embeddings.shape[:-1]:
        rows = rows[np.asarray(mask, dtype=bool).reshape(-1)]
    return rows
