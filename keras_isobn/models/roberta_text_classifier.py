"""RoBERTa text classifier with IsoBN in its classification head."""

import keras
import keras_hub

from keras_isobn.models.text_classifier_head import IsoBNHeadMixin


@keras.saving.register_keras_serializable(package="keras_isobn")
class IsoBNRobertaTextClassifier(
    IsoBNHeadMixin, keras_hub.models.RobertaTextClassifier
):
    """A KerasHub RoBERTa classifier with IsoBN in its classification head.

    A `keras_hub.models.RobertaTextClassifier` whose head is, as in the
    IsoBN authors' code,

    ```
    start token -> pooled_dropout -> pooled_dense (tanh)
                -> pooled_normalization -> output_dropout -> logits
    ```

    with `pooled_normalization` a `keras_isobn.IsoBatchNormalization`
    (`normalization="isobn"`), a `keras.layers.BatchNormalization` (the
    paper's baseline, `normalization="batchnorm"`) or nothing
    (`normalization=None`, plain fine-tuning). The layer is
    `classifier.normalization`.

    `from_preset()` takes every preset name, Kaggle or Hugging Face handle
    and local directory that `RobertaTextClassifier.from_preset()` takes,
    and attaches the preprocessor, so `fit()`/`predict()` take raw strings
    or `(first, second)` pairs of strings. `num_classes=1` gives a
    regression head (compiled with a mean squared error loss by default).

    Args:
        backbone: A `keras_hub.models.RobertaBackbone` instance.
        num_classes: int. Number of classes to predict; `1` for regression.
        preprocessor: A `keras_hub.models.RobertaTextClassifierPreprocessor`
            or `None`. If `None`, inputs must be preprocessed: a dict of
            `"token_ids"` and `"padding_mask"`.
        activation: Optional `str` or callable, the activation of the
            outputs (`"softmax"` for probabilities). Defaults to `None`.
        hidden_dim: int. The size of the tanh dense layer. Defaults to the
            backbone's `hidden_dim`.
        dropout: float. The dropout rate before the dense layer and before
            the logits. Defaults to `0.1`, as in the Hugging Face RoBERTa
            classification head the authors fine-tuned (KerasHub's
            `RobertaTextClassifier` defaults to `0.0`).
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
    classifier = keras_isobn.models.IsoBNRobertaTextClassifier.from_preset(
        "roberta_base_en",  # or a local directory
        num_classes=2,
    )
    classifier.fit(x=["What a movie!", "A waste of time."], y=[1, 0])
    ```
    """

    def __init__(
        self,
        backbone,
        num_classes,
        preprocessor=None,
        activation=None,
        hidden_dim=None,
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
        self.hidden_dim = hidden_dim or backbone.hidden_dim

        # === Functional Model ===
        inputs = backbone.input
        outputs = self.build_head(
            backbone(inputs)[:, backbone.start_token_index, :],
            num_classes=num_classes,
            activation=activation,
            dropout=dropout,
            normalization=normalization,
            momentum=momentum,
            epsilon=epsilon,
            beta=beta,
            bias_correction=bias_correction,
            synchronized=synchronized,
            hidden_dim=self.hidden_dim,
            hidden_activation="tanh",
            output_dropout_name="output_dropout",
        )
        # Skip `RobertaTextClassifier.__init__`, which builds its own head.
        super(keras_hub.models.RobertaTextClassifier, self).__init__(
            inputs=inputs, outputs=outputs, **kwargs
        )
