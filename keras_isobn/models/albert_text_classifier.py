"""ALBERT text classifier with IsoBN on the pooled output."""

import keras
import keras_hub

from keras_isobn.models.pooled_normalization import get_pooled_normalization
from keras_isobn.models.text_classifier import IsoBNTextClassifier

__all__ = ["IsoBNAlbertTextClassifier"]


@keras.saving.register_keras_serializable(package="keras_isobn")
class IsoBNAlbertTextClassifier(IsoBNTextClassifier):
    """`keras_hub.models.AlbertTextClassifier` with IsoBN on the pooled output.

    KerasHub's ALBERT classifier (same arguments, layers and layer names,
    and its default optimizer, `Adam(1e-5)`) with a normalization before
    the dropout, as the IsoBN authors place it on BERT's pooled output:

    ```
    pooled_output -> pooled_normalization -> output_dropout -> logits
    ```

    See `keras_isobn.models.IsoBNTextClassifier` for what all the IsoBN
    classifiers share (presets, regression heads, saving).

    Args:
        backbone: A `keras_hub.models.AlbertBackbone` instance.
        num_classes: int. Number of classes to predict; `1` for regression.
        preprocessor: A `keras_hub.models.AlbertTextClassifierPreprocessor`
            or `None`. If `None`, inputs must be preprocessed: a dict of
            `"token_ids"`, `"segment_ids"` and `"padding_mask"`.
        activation: Optional `str` or callable, the activation of the
            outputs (`"softmax"` for probabilities). Defaults to `None`.
        dropout: float. The dropout rate before the logits. Defaults to
            `0.1`.
        normalization: `"isobn"` (the default), `"batchnorm"`, `None`, or a
            layer or layer config (see
            `keras_isobn.models.get_pooled_normalization`).
        **kwargs: Task keyword arguments, such as `name` and `compile`.

    Example:

    ```python
    classifier = keras_isobn.models.IsoBNAlbertTextClassifier.from_preset(
        "albert_base_en_uncased",  # or a local directory
        num_classes=2,
    )
    classifier.fit(x=["What a movie!", "A waste of time."], y=[1, 0])
    ```
    """

    backbone_cls = keras_hub.models.AlbertBackbone
    preprocessor_cls = keras_hub.models.AlbertTextClassifierPreprocessor

    def __init__(
        self,
        backbone,
        num_classes,
        preprocessor=None,
        activation=None,
        dropout=0.1,
        normalization="isobn",
        **kwargs,
    ):
        # === Config ===
        # Set first: `super().__init__()` compiles with defaults that depend
        # on them (a regression loss for `num_classes=1`).
        self.num_classes = num_classes
        self.activation = keras.activations.get(activation)
        self.dropout = dropout

        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.normalization = get_pooled_normalization(
            normalization, dtype=backbone.dtype_policy
        )
        self.output_dense = keras.layers.Dense(
            num_classes,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
            activation=activation,
            dtype=backbone.dtype_policy,
            name="logits",
        )
        self.output_dropout = keras.layers.Dropout(
            dropout,
            dtype=backbone.dtype_policy,
            name="output_dropout",
        )

        # === Functional Model ===
        inputs = backbone.input
        pooled = backbone(inputs)["pooled_output"]
        if self.normalization is not None:
            pooled = self.normalization(pooled)
        pooled = self.output_dropout(pooled)
        outputs = self.output_dense(pooled)
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)

    def compile(
        self, optimizer="auto", loss="auto", *, metrics="auto", **kwargs
    ):
        """As `IsoBNTextClassifier.compile()`, with ALBERT's `Adam(1e-5)`."""
        if optimizer == "auto":
            optimizer = keras.optimizers.Adam(1e-5)
        super().compile(
            optimizer=optimizer, loss=loss, metrics=metrics, **kwargs
        )
