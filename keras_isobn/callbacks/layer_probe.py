"""The layer a callback probes, and its probe inputs, as NumPy arrays."""

import sys

import keras
import numpy as np

from keras_isobn.layers import IsoBatchNormalization
from keras_isobn.tokenization import tokenize

__all__ = ["embedding_rows", "find_layer", "prepare_inputs", "probe_model"]


def find_layer(model, layer):
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



def _walk(model):
    """Yields the layers of `model` and of the models nested in it."""
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from _walk(layer)


def probe_model(model, layer):
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


def prepare_inputs(model, data, batch_size):
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
        batches = [_preprocess(model, batch, batch_size) for batch in batches]
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
    return tokenize(model, x, batch_size)


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


def embedding_rows(embeddings, mask):
    """Embeddings as `(rows, features)`, padded positions left out."""
    embeddings = np.asarray(embeddings)
    if embeddings.ndim <= 2:
        return embeddings
    rows = embeddings.reshape(-1, embeddings.shape[-1])
    if mask is not None and np.shape(mask) == embeddings.shape[:-1]:
        rows = rows[np.asarray(mask, dtype=bool).reshape(-1)]
    return rows
