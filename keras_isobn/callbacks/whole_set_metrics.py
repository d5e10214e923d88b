"""`WholeSetMetrics`: metrics of a whole evaluation set at each epoch end."""

import keras
import numpy as np

from keras_isobn.batching import pad_rows
from keras_isobn.callbacks.layer_probe import find_layer
from keras_isobn.callbacks.layer_probe import probe_model
from keras_isobn.callbacks.prediction import is_positive_int
from keras_isobn.callbacks.prediction import predict
from keras_isobn.isotropy import explained_variance

__all__ = ["WholeSetMetrics"]


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
    `keras_isobn.batching.trim_padding`): a few compiled steps, one per
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
        if not is_positive_int(batch_size):
            raise ValueError(
                f"`batch_size` must be an integer >= 1. Received: "
                f"batch_size={batch_size!r}"
            )
        if trim_padding is not None and not is_positive_int(trim_padding):
            raise ValueError(
                "`trim_padding` must be None or an integer >= 1. Received: "
                f"trim_padding={trim_padding!r}"
            )
        ks = [] if ev_k is None else [ev_k] if np.ndim(ev_k) == 0 else ev_k
        if ev_k is not None and not (
            ks and all(is_positive_int(value) for value in ks)
        ):
            raise ValueError(
                "`ev_k` must be None, an integer >= 1 or a non-empty "
                f"sequence of them. Received: ev_k={ev_k!r}"
            )
        self.size = len(keras.tree.flatten(x)[0])
        self.x = keras.tree.map_structure(
            lambda array: pad_rows(np.asarray(array), batch_size), x
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
        outputs = predict(
            self._probe_model(model), self.x, self.batch_size, self.trim_padding
        )
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
            layer = find_layer(model, self.ev_layer)
            probe = probe_model(model, layer)
            outputs = keras.tree.flatten(model.output)
            if len(outputs) != 1:
                raise ValueError(
                    "WholeSetMetrics with `ev_k` needs a model with one "
                    f"output; model '{model.name}' has {len(outputs)}."
                )
            probe = keras.Model(
                model.input,
                [outputs[0], *probe.outputs],
                name=f"{model.name}_with_{layer.name}",
            )
            self._probe = (model, layer, probe)
        return self._probe[2]
