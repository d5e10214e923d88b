"""Inference export of KerasHub text classifiers: SavedModel and serving.

Two artifacts, both TensorFlow SavedModels that TensorFlow alone reloads
(`tf.saved_model.load(path)`) and TF Serving serves:

- `export_saved_model()`: the classifier on preprocessed inputs (the
  backbone's dict of `"token_ids"`, `"segment_ids"` for BERT and
  `"padding_mask"`), on the TensorFlow and JAX backends.
- `export_text_serving()`: raw sentences (or sentence pairs) in, logits out,
  with the KerasHub preprocessing (tokenizer and packer) inside the graph,
  on the TensorFlow backend.

Both fold the normalization into the classifier kernel first (see
`fold_normalization()`): at inference IsoBN is a fixed diagonal scale, so the
exported graph has no IsoBN op left and returns the same logits.

Backends:

- TensorFlow: both exports; the sequence length of `export_saved_model()`
  stays dynamic unless `sequence_length` is given.
- JAX: `export_saved_model()` only. `jax2tf` cannot export KerasHub's
  position embedding with a symbolic sequence length, so the sequence length
  is fixed (by default to the preprocessor's `sequence_length`); the batch
  size stays dynamic. Pad or truncate inputs to that length (the KerasHub
  preprocessor does). The raw-text export needs the tokenizer's TensorFlow
  lookup resources tracked with the model's variables, which
  `keras.export.ExportArchive` only does on the TensorFlow backend: save the
  classifier (`.keras` or `save_to_preset()`) and export it from a
  TensorFlow-backend process.
- torch: neither (`ExportArchive` SavedModel export is experimental there
  and needs fully static shapes). Save the classifier (`.keras` or
  `save_to_preset()`) and export it from a process with
  `KERAS_BACKEND=tensorflow` (or `jax`).
"""

import keras
import numpy as np

from keras_isobn.layers import IsoBatchNormalization

__all__ = [
    "SERVING_ENDPOINT",
    "export_saved_model",
    "export_text_serving",
    "fold_normalization",
]

SERVING_ENDPOINT = "serve"


def fold_normalization(classifier):
    """Folds the pooled normalization of a classifier into its logits layer.

    At inference, IsoBN multiplies the features by a fixed scale `s` and
    BatchNormalization by `s = gamma / sqrt(moving_variance + epsilon)` plus
    a shift `t = beta - moving_mean * s`. With the dropout before the logits
    being the identity at inference, `(x * s + t) W + b = x (s W) + (t W + b)`:
    the returned classifier has no normalization and a logits layer with
    kernel `s[:, None] * W` and bias `t W + b`, hence the same logits (up to
    float32 rounding) at one multiply less per feature.

    The returned classifier shares the backbone and preprocessor of
    `classifier` (no copy of their weights) and copies the other head
    weights. It is meant for inference and export, not for training (it
    has no normalization any more).

    Args:
        classifier: A `keras_isobn.models` classifier (any with
            `normalization`, `output_dense` and the `normalization` config
            key).

    Returns:
        A new classifier of the same class with `normalization=None`, or
        `classifier` itself if it has no normalization.

    Example:

    ```python
    folded = keras_isobn.export.fold_normalization(classifier)
    folded.predict(x)  # the same logits as classifier.predict(x)
    ```
    """
    layer = getattr(classifier, "normalization", None)
    if layer is None:
        return classifier
    if isinstance(layer, IsoBatchNormalization):
        scale = _to_float64(layer.moving_scale)  # what inference uses
        shift = np.zeros_like(scale)
    elif isinstance(layer, keras.layers.BatchNormalization):
        variance = _to_float64(layer.moving_variance)
        scale = 1.0 / np.sqrt(variance + layer.epsilon)
        if layer.scale:
            scale = scale * _to_float64(layer.gamma)
        shift = -_to_float64(layer.moving_mean) * scale
        if layer.center:
            shift = shift + _to_float64(layer.beta)
    else:
        raise ValueError(
            "Only IsoBatchNormalization and BatchNormalization can be "
            f"folded into the logits layer. Received: {layer}"
        )

    config = classifier.get_config()
    config.update(
        backbone=classifier.backbone,
        preprocessor=classifier.preprocessor,
        normalization=None,
        compile=False,
    )
    folded = type(classifier).from_config(config)
    skip = {classifier.backbone.name, layer.name, classifier.output_dense.name}
    for source in classifier.layers:
        if source.name not in skip and source.weights:
            folded.get_layer(source.name).set_weights(source.get_weights())
    kernel = _to_float64(classifier.output_dense.kernel)
    bias = _to_float64(classifier.output_dense.bias)
    # Computed in float64; `set_weights` casts to the variables' dtype.
    folded.output_dense.set_weights(
        [scale[:, None] * kernel, bias + shift @ kernel]
    )
    return folded


def export_saved_model(
    classifier, filepath, sequence_length=None, fold=True, verbose=False
):
    """Exports a classifier on preprocessed inputs as a TF SavedModel.

    The artifact has one endpoint, `serve` (also the TF Serving
    `serving_default` signature), that takes the backbone's input dict
    (`"token_ids"`, `"segment_ids"` for BERT, `"padding_mask"`, int32
    `(batch, sequence_length)`) and returns the logits. TensorFlow alone
    reloads it: `tf.saved_model.load(filepath).serve(inputs)`.

    Supported on the TensorFlow and JAX backends. On JAX the sequence
    length must be fixed (jax2tf cannot export KerasHub's position
    embedding with a symbolic sequence length); the batch size stays
    dynamic.

    Args:
        classifier: A KerasHub text classifier, e.g.
            `keras_isobn.models.IsoBNBertTextClassifier`.
        filepath: Directory to write the SavedModel to.
        sequence_length: Optional int, the fixed sequence length of the
            inputs. Defaults to dynamic on the TensorFlow backend, and to the
            preprocessor's `sequence_length` on the JAX backend (required
            there when the classifier has no preprocessor).
        fold: Boolean. Whether to fold the normalization into the logits
            layer first (`fold_normalization()`). Defaults to `True`.
        verbose: Boolean. Whether to print the endpoint summary.

    Example:

    ```python
    keras_isobn.export.export_saved_model(classifier, "exported")
    reloaded = tf.saved_model.load("exported")
    x = classifier.preprocessor(["A great movie!"])
    logits = reloaded.serve({k: tf.cast(v, "int32") for k, v in x.items()})
    ```
    """
    _check_backend("export_saved_model", ("tensorflow", "jax"))
    if sequence_length is None and keras.config.backend() == "jax":
        preprocessor = classifier.preprocessor
        sequence_length = getattr(preprocessor, "sequence_length", None)
        if sequence_length is None:
            raise ValueError(
                "On the JAX backend, the SavedModel needs a fixed sequence "
                "length: jax2tf cannot export KerasHub's position embedding "
                "with a symbolic sequence length. Pass "
                "`sequence_length=...` (e.g. 128), or attach a preprocessor, "
                "whose `sequence_length` is then used."
            )
    model = fold_normalization(classifier) if fold else classifier
    input_signature = {
        name: keras.InputSpec(
            shape=(None, sequence_length), dtype=tensor.dtype, name=name
        )
        for name, tensor in model.backbone.input.items()
    }
    model.export(
        filepath,
        format="tf_saved_model",
        input_signature=[input_signature],
        verbose=verbose,
    )


def export_text_serving(
    classifier, filepath, pairs=False, fold=True, verbose=False
):
    """Exports a classifier that takes raw text, for TF Serving.

    The artifact's `serve` endpoint (also the TF Serving `serving_default`
    signature) takes a 1-D string tensor `text` of sentences, or with
    `pairs=True` two, `text_a` and `text_b`, of sentence pairs; it runs the
    classifier's KerasHub preprocessor (tokenizer and packer, to its
    `sequence_length`) and the classifier in one TensorFlow graph, and
    returns the logits. TensorFlow (and `tensorflow-text`, whose ops the
    KerasHub tokenizers use) reloads it without Keras:
    `tf.saved_model.load(filepath).serve(tf.constant([...]))`.

    This is `keras.export.ExportArchive` on the TensorFlow backend, the
    backend it requires: there the preprocessor's lookup resources are
    tracked with the model. Models trained on another backend can be saved
    (`.keras` or `save_to_preset()`) and exported from a TensorFlow-backend
    process.

    Args:
        classifier: A KerasHub text classifier with a `preprocessor`.
        filepath: Directory to write the SavedModel to.
        pairs: Boolean. Whether the endpoint takes sentence pairs
            (`text_a`, `text_b`) instead of single sentences (`text`).
        fold: Boolean. Whether to fold the normalization into the logits
            layer first (`fold_normalization()`). Defaults to `True`.
        verbose: Boolean. Whether to print the endpoint summary.

    Example:

    ```python
    keras_isobn.export.export_text_serving(classifier, "serving")
    reloaded = tf.saved_model.load("serving")
    logits = reloaded.serve(tf.constant(["A great movie!", "Dull."]))
    ```
    """
    _check_backend("export_text_serving", ("tensorflow",))
    import tensorflow as tf

    preprocessor = classifier.preprocessor
    if preprocessor is None:
        raise ValueError(
            "`export_text_serving()` puts the classifier's preprocessor in "
            "the graph, but this classifier has none. Attach one, e.g. "
            "`classifier.preprocessor = keras_hub.models."
            "BertTextClassifierPreprocessor.from_preset(preset)`, or export "
            "the model on token ids with `export_saved_model()`."
        )
    model = fold_normalization(classifier) if fold else classifier
    text = tf.TensorSpec(shape=(None,), dtype=tf.string)
    if pairs:

        @tf.function(input_signature=[text, text])
        def serve(text_a, text_b):
            # `y=None`: a 2-tuple alone would be unpacked as `(x, y)`.
            x = preprocessor((text_a, text_b), y=None)
            return model(x, training=False)

    else:

        @tf.function(input_signature=[text])
        def serve(text):
            return model(preprocessor(text), training=False)

    # Tracing builds the preprocessor, which `track()` requires.
    serve.get_concrete_function()
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.track(preprocessor)
    archive.add_endpoint(SERVING_ENDPOINT, serve)
    archive.write_out(filepath, verbose=verbose)


def _check_backend(function, supported):
    backend = keras.config.backend()
    if backend in supported:
        return
    names = " or ".join(f"KERAS_BACKEND={name}" for name in supported)
    raise NotImplementedError(
        f"`{function}()` is supported with {names}, not with the {backend} "
        "backend. Save the classifier (`classifier.save('model.keras')` or "
        "`classifier.save_to_preset(directory)`), then load it and export "
        f"it in a process started with {names}."
    )


def _to_float64(value):
    return np.asarray(keras.ops.convert_to_numpy(value), dtype="float64")
