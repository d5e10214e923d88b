"""The normalization layer in front of a text classifier's logits."""

import keras

from keras_isobn.layers import IsoBatchNormalization

__all__ = ["get_pooled_normalization"]

LAYER_NAME = "pooled_normalization"

# The keyword arguments of `get_pooled_normalization()` that configure the
# layer built from a name. The builders (`text_classifier_from_preset`, ...)
# route these to it; a new setting is added there and here.
NORMALIZATION_SETTINGS = (
    "momentum",
    "epsilon",
    "beta",
    "output_variance",
    "bias_correction",
    "synchronized",
)


def get_pooled_normalization(
    normalization,
    momentum=None,
    epsilon=None,
    beta=None,
    output_variance=None,
    bias_correction=None,
    synchronized=None,
    dtype=None,
):
    """Returns the normalization layer of a classifier head, or `None`.

    The `normalization` argument of every `keras_isobn.models` classifier
    goes through this function, so it accepts the same values:

    - `"isobn"`: a `keras_isobn.IsoBatchNormalization`, with the settings
      given here (the layer's defaults otherwise: `momentum=0.05`,
      `epsilon=1e-3`, `beta=0.5`, `output_variance="total"`,
      `bias_correction=False`).
    - `"batchnorm"`: a `keras.layers.BatchNormalization`, the paper's
      baseline. `momentum` is the weight of each new batch, as for IsoBN
      (`BatchNormalization(momentum=1 - momentum)`, default `0.05`);
      `beta`, `output_variance` and `bias_correction` are IsoBN's only
      and ignored.
    - `None`: no normalization (plain fine-tuning); returns `None` (the
      settings are ignored).
    - A Keras layer, e.g. `keras_isobn.IsoBatchNormalization(beta=0.75)`,
      or its config as `keras.layers.serialize()` gives it (what a
      classifier's `get_config()` holds): used as a template, i.e. a new
      layer of the same class and config is returned (the template's
      weights are not copied). The settings arguments must then be `None`.
      A template's `synchronized` is kept on TensorFlow only (elsewhere it
      does nothing or is rejected), so a classifier saved with
      synchronized statistics loads on every backend.

    The returned layer is named `"pooled_normalization"` and, when `dtype`
    is given, takes that dtype policy (the classifiers pass the backbone's;
    IsoBN keeps its statistics in float32 under `"mixed_float16"`).

    Args:
        normalization: `"isobn"`, `"batchnorm"`, `None`, a layer or a layer
            config dict.
        momentum: Optional float in `(0, 1]`, the weight of each new batch
            in the moving statistics.
        epsilon: Optional float `> 0`, IsoBN's or BatchNormalization's
            epsilon.
        beta: Optional float `>= 0`, IsoBN's strength.
        output_variance: Optional `"total"` (the paper's: keep the total
            variance) or `"unit"` (unit variance on average), IsoBN's.
        bias_correction: Optional boolean, IsoBN's bias correction of the
            moving statistics.
        synchronized: Optional boolean. Under a `tf.distribute` strategy,
            all-reduce the batch statistics across replicas, so they are the
            global batch's. Only for TensorFlow; on JAX it changes nothing
            (`keras.distribution` gives the global batch's statistics
            anyway), and PyTorch rejects it. For a model already built,
            `keras_isobn.distribution.synchronize_statistics(model)` sets
            it.
        dtype: Optional dtype policy of the layer, usually the backbone's.

    Returns:
        The layer, named `"pooled_normalization"`, or `None`.

    Example:

    ```python
    get_pooled_normalization("isobn", beta=0.75)
    get_pooled_normalization("isobn", output_variance="unit")
    get_pooled_normalization("batchnorm", momentum=0.1)  # Keras's 0.9
    get_pooled_normalization(keras_isobn.IsoBatchNormalization(beta=1.0))
    ```
    """
    settings = {
        "momentum": momentum,
        "epsilon": epsilon,
        "beta": beta,
        "output_variance": output_variance,
        "bias_correction": bias_correction,
        "synchronized": synchronized,
    }
    settings = {
        key: value for key, value in settings.items() if value is not None
    }
    if normalization is None:
        return None
    if normalization == "isobn":
        return IsoBatchNormalization(**settings, dtype=dtype, name=LAYER_NAME)
    if normalization == "batchnorm":
        momentum = settings.get("momentum", 0.05)
        if not 0.0 < float(momentum) <= 1.0:
            raise ValueError(
                "`momentum` must be in (0, 1], the weight of each new batch "
                f"in the moving statistics. Received: momentum={momentum}"
            )
        synchronized = bool(settings.get("synchronized", False))
        return keras.layers.BatchNormalization(
            momentum=1.0 - float(momentum),
            epsilon=settings.get("epsilon", 1e-3),
            # Keras's option is TensorFlow's; JAX needs none (see above).
            synchronized=synchronized and keras.backend.backend() != "jax",
            dtype=dtype,
            name=LAYER_NAME,
        )
    if not isinstance(normalization, (keras.layers.Layer, dict)):
        error = ValueError if isinstance(normalization, str) else TypeError
        raise error(
            '`normalization` must be "isobn", "batchnorm", None (no '
            "normalization), a Keras layer or a layer config dict. "
            f"Received: normalization={normalization!r}"
        )
    if settings:
        raise ValueError(
            "Settings such as `momentum` or `beta` only apply to a "
            '`normalization` given by name ("isobn" or "batchnorm"); a layer '
            "or layer config carries its own. Received: "
            f"normalization={normalization!r} and {settings}"
        )
    template = normalization
    if isinstance(template, dict):
        template = _without_build_config(template)
        template["config"] = _for_this_backend(template["config"])
        template = keras.layers.deserialize(template)
    config = _for_this_backend(template.get_config())
    config["name"] = LAYER_NAME
    if dtype is not None:
        config["dtype"] = dtype
    return type(template).from_config(config)


def serialize_pooled_normalization(layer):
    """The config of a pooled normalization, for a classifier's config.

    `keras.layers.serialize(layer)` without its build config (the head
    decides the input shape), or `None` for no layer. Passing it back as
    `normalization` rebuilds the same layer (see
    `get_pooled_normalization()`).
    """
    if layer is None:
        return None
    return _without_build_config(keras.layers.serialize(layer))


def _for_this_backend(config):
    """A layer config whose `synchronized` is dropped off TensorFlow.

    The option only acts under `tf.distribute`; PyTorch (and, for
    BatchNormalization, JAX) reject it. A classifier trained with
    synchronized statistics on TensorFlow then loads on every backend.
    """
    if config.get("synchronized") and keras.backend.backend() != "tensorflow":
        config = {**config, "synchronized": False}
    return config


def _without_build_config(config):
    return {
        key: value for key, value in config.items() if key != "build_config"
    }
