"""DistilBERT text classifier with IsoBN in its classification head."""

import keras
import keras_hub

from keras_isobn.models.pooled_normalization import get_pooled_normalization
from keras_isobn.models.text_classifier import IsoBNTextClassifier

__all__ = ["IsoBNDistilBertTextClassifier"]


@keras.saving.register_keras_serializable(package="keras_isobn")
class IsoBNDistilBertTextClassifier(IsoBNTextClassifier):
    """`keras_hub.models.DistilBertTextClassifier` with IsoBN in its head.

    KerasHub's DistilBERT classifier (same arguments, layers and layer
    names) with a normalization after the relu dense layer, as the IsoBN
    authors place it in RoBERTa's head:

    ```
    [CLS] token -> pooled_dense (relu) -> pooled_normalization
                -> output_dropout -> logits
    ```

    See `keras_isobn.models.IsoBNTextClassifier` for what all the IsoBN
    classifiers share (presets, regression heads, saving).

    Args:
        backbone: A `keras_hub.models.DistilBertBackbone` instance.
        num_classes: int. Number of classes to predict; `1` for regression.
        preprocessor: A
            `keras_hub.models.DistilBertTextClassifierPreprocessor` or
            `None`. If `None`, inputs must be preprocessed: a dict of
            `"token_ids"` and `"padding_mask"`.
        activation: Optional `str` or callable, the activation of the
            outputs (`"softmax"` for probabilities). Defaults to `None`.
        hidden_dim: int. The size of the relu dense layer. Defaults to the
            backbone's `hidden_dim`.
        dropout: float. The dropout rate before the logits. Defaults to
            `0.2`.
        normalization: `"isobn"` (the default), `"batchnorm"`, `None`, or a
            layer or layer config (see
            `keras_isobn.models.get_pooled_normalization`).
        **kwargs: Task keyword arguments, such as `name` and `compile`.

    Example:

    ```python
    classifier = keras_isobn.models.IsoBNDistilBertTextClassifier.from_preset(
        "distil_bert_base_en_uncased",  # or a local directory
        num_classes=2,
    )
    classifier.fit(x=["What a movie!", "A waste of time."], y=[1, 0])
    ```
    """

    backbone_cls = keras_hub.models.DistilBertBackbone
    preprocessor_cls = keras_hub.models.DistilBertTextClassifierPreprocessor

    def __init__(
        self,
        backbone,
        num_classes,
        preprocessor=None,
        activation=None,
        hidden_dim=None,
        dropout=0.2,
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
        self.pooled_dense = keras.layers.Dense(
            self.hidden_dim,
            activation="relu",
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
            dtype=backbone.dtype_policy,
            name="pooled_dense",
        )
        self.normalization = get_pooled_normalization(
            normalization, dtype=backbone.dtype_policy
        )
        self.output_dropout = keras.layers.Dropout(
            dropout,
            dtype=backbone.dtype_policy,
            name="output_dropout",
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
        x = backbone(inputs)[:, backbone.cls_token_index, :]
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
