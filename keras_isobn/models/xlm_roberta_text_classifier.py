"""XLM-RoBERTa text classifier with IsoBN in its classification head."""

import keras
import keras_hub

from keras_isobn.models.roberta_text_classifier import (
    IsoBNRobertaTextClassifier,
)

__all__ = ["IsoBNXLMRobertaTextClassifier"]


@keras.saving.register_keras_serializable(package="keras_isobn")
class IsoBNXLMRobertaTextClassifier(IsoBNRobertaTextClassifier):
    """`keras_hub.models.XLMRobertaTextClassifier` with IsoBN in its head.

    KerasHub's XLM-RoBERTa classifier (same arguments, layers and layer names)
    with a normalization after the tanh dense layer, as the IsoBN
    authors place it in RoBERTa's head:

    ```
    start token -> pooled_dropout -> pooled_dense (tanh)
                -> pooled_normalization -> output_dropout -> logits
    ```

    It subclasses `IsoBNRobertaTextClassifier`, whose head it shares. See
    `keras_isobn.models.IsoBNTextClassifier` for what all the IsoBN
    classifiers share (presets, regression heads, saving).

    Args:
        backbone: A `keras_hub.models.XLMRobertaBackbone` instance.
        num_classes: int. Number of classes to predict; `1` for regression.
        preprocessor: A
            `keras_hub.models.XLMRobertaTextClassifierPreprocessor` or
            `None`. If `None`, inputs must be preprocessed: a dict of
            `"token_ids"` and `"padding_mask"`.
        activation: Optional `str` or callable, the activation of the
            outputs (`"softmax"` for probabilities). Defaults to `None`.
        hidden_dim: int. The size of the tanh dense layer. Defaults to the
            backbone's `hidden_dim`.
        dropout: float. The dropout rate before the dense layer and before
            the logits. Defaults to `0.1`, as in the Hugging Face
            XLM-RoBERTa classification head (KerasHub's
            `XLMRobertaTextClassifier` defaults to `0.0`).
        normalization: `"isobn"` (the default), `"batchnorm"`, `None`, or a
            layer or layer config (see
            `keras_isobn.models.get_pooled_normalization`).
        **kwargs: Task keyword arguments, such as `name` and `compile`.

    Example:

    ```python
    classifier = keras_isobn.models.IsoBNXLMRobertaTextClassifier.from_preset(
        "xlm_roberta_base_multi",  # or a local directory
        num_classes=2,
    )
    classifier.fit(x=["What a movie!", "A waste of time."], y=[1, 0])
    ```
    """

    backbone_cls = keras_hub.models.XLMRobertaBackbone
    preprocessor_cls = keras_hub.models.XLMRobertaTextClassifierPreprocessor
