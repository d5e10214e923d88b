"""BERT text classifier with IsoBN on the pooled output."""

import keras
import keras_hub

from keras_isobn.models.text_classifier_head import IsoBNHeadMixin


@keras.saving.register_keras_serializable(package="keras_isobn")
class IsoBNBertTextClassifier(
    IsoBNHeadMixin, keras_hub.models.BertTextClassifier
):
    """A KerasHub BERT classifier with IsoBN on the pooled output.

    A `keras_hub.models.BertTextClassifier` whose head is, as in the IsoBN
    authors' code,

    ```
    pooled_output -> pooled_normalization -> classifier_dropout -> logits
    ```

    with `pooled_normalization` a `keras_isobn.IsoBatchNormalization`
    (`normalization="isobn"`), a `keras.layers.BatchNormalization` (the
    paper's baseline, `normalization="batchnorm"`) or nothing
    (`normalization=None`, plain fine-tuning). The layer is
    `classifier.normalization`.

    `from_preset()` takes every preset name, Kaggle or Hugging Face handle
    and local directory that `BertTextClassifier.from_preset()` takes, and
    attaches the preprocessor, so `fit()`/`predict()` take raw strings or
    `(first, second)` pairs of strings. `num_classes=1` gives a regression
    head (compiled with a mean squared error loss by default).

    Args:
        backbone: A `keras_hub.models.BertBackbone` instance.
        num_classes: int. Number of classes to predict; `1` for regression.
        preprocessor: A `keras_hub.models.BertTextClassifierPreprocessor` or
            `None`. If `None`, inputs must be preprocessed: a dict of
            `"token_ids"`, `"segment_ids"` and `"padding_mask"`.
        activation: Optional `str` or callable, the activation of the
            outputs (`"softmax"` for probabilities). Defaults to `None`.
        dropout: float. The dropout rate before the logits. Defaults to
            `0.1`.
        normalization: `"isobn"` (the default), `"batchnorm"` or `None`.
        momentum: Float in `(0, 1]`, the weight of each new batch in the
            moving statistics of the normalization. Defaults to `0.05`.
        epsilon: Float `> 0`, the normalization's epsilon. Defaults to
            `1e-3`.
        beta: Float `>= 0`, IsoBN's strength. Defaults to `0.5`.
        bias_correction: Boolean, IsoBN's bias correction of its moving
            statistics. Defaults to `False` (the paper's behaviour).
        synchronized: Boolean. Under a `tf.distribute` strategy (TensorFlow),
            all-reduce the normalization's batch statistics across replicas
            so they are the global batch's. Defaults to `False` (each
            replica's own). JAX's `keras.distribution` needs no option.
        **kwargs: Task keyword arguments, such as `name` and `compile`.

    Example:

    ```python
    classifier = keras_isobn.models.IsoBNBertTextClassifier.from_preset(
        "bert_base_en_uncased",  # or a local directory
        num_classes=2,
    )
    classifier.fit(x=["What a movie!", "A waste of time."], y=[1, 0])
    classifier.normalization.moving_scale  # IsoBN's per-feature scale
    ```
    """

    def __init__(
        self,
        backbone,
        num_classes,
        preprocessor=None,
        activation=None,
        dropout=0.1,
        normalization="isobn",
        momentum=0.05,
        epsilon=1e-3,
        beta=0.5,
        bias_correction=False,
        synchronized=False,
        **kwargs,
    ):
        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor

        # === Functional Model ===
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
            synchronized=synchronized,
            output_dropout_name="classifier_dropout",
        )
        # Skip `BertTextClassifier.__init__`, which builds its own head.
        super(keras_hub.models.BertTextClassifier, self).__init__(
            inputs=inputs, outputs=outputs, **kwargs
        )
