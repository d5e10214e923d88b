"""DeBERTaV3 text classifier with IsoBN in its classification head."""

import keras
import keras_hub

from keras_isobn.models.pooled_normalization import get_pooled_normalization
from keras_isobn.models.text_classifier import IsoBNTextClassifier

__all__ = ["IsoBNDebertaV3TextClassifier"]


@keras.saving.register_keras_serializable(package="keras_isobn")
class IsoBNDebertaV3TextClassifier(IsoBNTextClassifier):
    """`keras_hub.models.DebertaV3TextClassifier` with IsoBN in its head.

    KerasHub's DeBERTaV3 classifier (same arguments, layers and layer
    names) with a normalization after the gelu dense layer, as the IsoBN
    authors place it in RoBERTa's head:

    ```
    start token -> pooled_dropout -> pooled_dense (gelu)
                -> pooled_normalization -> classifier_dropout -> logits
    ```

    As in KerasHub (and Hugging Face's DeBERTa-v2 head), `dropout` is the
    rate before the dense layer, and the backbone's `dropout` the rate
    before the logits.

    See `keras_isobn.models.IsoBNTextClassifier` for what all the IsoBN
    classifiers share (presets, regression heads, saving).

    Args:
        backbone: A `keras_hub.models.DebertaV3Backbone` instance.
        num_classes: int. Number of classes to predict; `1` for regression.
        preprocessor: A
            `keras_hub.models.DebertaV3TextClassifierPreprocessor` or
            `None`. If `None`, inputs must be preprocessed: a dict of
            `"token_ids"` and `"padding_mask"`.
        activation: Optional `str` or callable, the activation of the
            outputs (`"softmax"` for probabilities). Defaults to `None`.
        hidden_dim: int. The size of the gelu dense layer. Defaults to the
            backbone's `hidden_dim`.
        dropout: float. The dropout rate before the dense layer. Defaults
            to `0.0`.
        normalization: `"isobn"` (the default), `"batchnorm"`, `None`, or a
            layer or layer config (see
            `keras_isobn.models.get_pooled_normalization`).
        **kwargs: Task keyword arguments, such as `name` and `compile`.

    Example:

    ```python
    classifier = keras_isobn.models.IsoBNDebertaV3TextClassifier.from_preset(
        "deberta_v3_base_en",  # or a local directory
        num_classes=2,
    )
    classifier.fit(x=["What a movie!", "A waste of time."], y=[1, 0])
    ```
    """

    backbone_cls = keras_hub.models.DebertaV3Backbone
    preprocessor_cls = keras_hub.models.DebertaV3TextClassifierPreprocessor

    def __init__(
        self,
        backbone,
        num_classes,
        preprocessor=None,
        activation=None,
        hidden_dim=None,
        dropout=0.0,
        normalization="isobn",
        **kwargs,
    ):
        # === Config ===
        # Set first: `super().__init__()` compiles with defaults that depend
        # on them (a regression loss for `num_classes=1`).
        self.num_classes = num_classes
        self.activation = keras.activations.get(activation)
        self.hidden_dim = hidden_dim or backbone.hidden_dim
        self.dropout = dropout

        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.pooled_dropout = keras.layers.Dropout(
            dropout,
            dtype=backbone.dtype_policy,
            name="pooled_dropout",
        )
        self.pooled_dense = keras.layers.Dense(
            self.hidden_dim,
            activation=keras.activations.gelu,
            dtype=backbone.dtype_policy,
            name="pooled_dense",
        )
        self.normalization = get_pooled_normalization(
            normalization, dtype=backbone.dtype_policy
        )
        self.output_dropout = keras.layers.Dropout(
            backbone.dropout,
            dtype=backbone.dtype_policy,
            name="classifier_dropout",
        )
        self.output_dense = keras.layers.Dense(
            num_classes,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
            activation=activation,
            dtype=backbone.dtype_policy,
            name="logits",
        )

        # === Functional Model ===
        inputs = backbone.input
        x = backbone(inputs)[:, backbone.start_token_index, :]
        x = self.pooled_dropout(x)
        x = self.pooled_dense(x)
        if self.normalization is not None:
            x = self.normalization(x)
        x = self.output_dropout(x)
        outputs = self.output_dense(x)
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)

    def get_config(self):
        config = super().get_config()
        config.update({"hidden_dim": self.hidden_dim})
        return config
