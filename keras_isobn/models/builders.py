"""Builds IsoBN text classifiers: by backbone, from a preset, small BERTs."""

import keras_hub

from keras_isobn.models.albert_text_classifier import IsoBNAlbertTextClassifier
from keras_isobn.models.bert_text_classifier import IsoBNBertTextClassifier
from keras_isobn.models.deberta_v3_text_classifier import (
    IsoBNDebertaV3TextClassifier,
)
from keras_isobn.models.distil_bert_text_classifier import (
    IsoBNDistilBertTextClassifier,
)
from keras_isobn.models.f_net_text_classifier import IsoBNFNetTextClassifier
from keras_isobn.models.pooled_normalization import NORMALIZATION_SETTINGS
from keras_isobn.models.pooled_normalization import get_pooled_normalization
from keras_isobn.models.roberta_text_classifier import (
    IsoBNRobertaTextClassifier,
)
from keras_isobn.models.roformer_v2_text_classifier import (
    IsoBNRoformerV2TextClassifier,
)
from keras_isobn.models.text_classifier import explain_unreachable
from keras_isobn.models.xlm_roberta_text_classifier import (
    IsoBNXLMRobertaTextClassifier,
)

__all__ = [
    "TEXT_CLASSIFIERS",
    "small_bert_text_classifier",
    "text_classifier_class",
    "text_classifier_from_preset",
]

# One classifier class per KerasHub text classifier family.
TEXT_CLASSIFIERS = (
    IsoBNAlbertTextClassifier,
    IsoBNBertTextClassifier,
    IsoBNDebertaV3TextClassifier,
    IsoBNDistilBertTextClassifier,
    IsoBNFNetTextClassifier,
    IsoBNRobertaTextClassifier,
    IsoBNRoformerV2TextClassifier,
    IsoBNXLMRobertaTextClassifier,
)


def text_classifier_class(backbone):
    """The `keras_isobn.models` classifier class for a KerasHub backbone.

    The class whose `backbone_cls` is the backbone's class, or its nearest
    base class (so an `XLMRobertaBackbone`, a `RobertaBackbone` subclass,
    gets `IsoBNXLMRobertaTextClassifier`).

    Args:
        backbone: A `keras_hub.models.Backbone` instance (or class).

    Returns:
        One of `TEXT_CLASSIFIERS`.

    Raises:
        ValueError: for a backbone of no supported family; the message
            lists the backbones that are.
    """
    backbone_type = backbone if isinstance(backbone, type) else type(backbone)
    by_backbone = {cls.backbone_cls: cls for cls in TEXT_CLASSIFIERS}
    for base in backbone_type.__mro__:
        if base in by_backbone:
            return by_backbone[base]
    supported = ", ".join(cls.backbone_cls.__name__ for cls in TEXT_CLASSIFIERS)
    raise ValueError(
        f"No keras_isobn text classifier takes a {backbone_type.__name__}. "
        f"The supported backbones (KerasHub text classifier families) are: "
        f"{supported}."
    )


def text_classifier_from_preset(
    preset, num_classes, sequence_length=None, load_weights=True, **kwargs
):
    """The IsoBN classifier of a KerasHub preset, with its preprocessor.

    The family (ALBERT, BERT, DeBERTaV3, DistilBERT, FNet, RoBERTa,
    RoFormer V2 or XLM-RoBERTa) is the one of the preset's backbone, read
    with KerasHub's public `Backbone.from_preset`, so the preset is loaded
    once; the head is new (`num_classes` logits).

    Args:
        preset: A KerasHub preset name (`"bert_base_en_uncased"`, ...), a
            Kaggle (`kaggle://`) or Hugging Face (`hf://`) handle, or a
            local directory (a KerasHub preset or a Hugging Face checkpoint
            folder).
        num_classes: int. Number of logits; `1` for regression.
        sequence_length: Optional int, the preprocessor's sequence length.
            Defaults to the preset's.
        load_weights: bool. Whether to load the pre-trained weights.
        **kwargs: Arguments of the classifier class (`normalization`,
            `dropout`, `activation`, ...) and, with `normalization` given by
            name (`"isobn"`, the default, or `"batchnorm"`), the settings of
            `get_pooled_normalization()`: `momentum`, `epsilon`, `beta`,
            `output_variance`, `bias_correction`, `synchronized`.

    Returns:
        A `keras_isobn.models` classifier (one of `TEXT_CLASSIFIERS`) whose
        `preprocessor` takes raw strings.

    Raises:
        ValueError: if the preset's backbone is of no supported family.

    Example:

    ```python
    classifier = keras_isobn.models.text_classifier_from_preset(
        "roberta_base_en", num_classes=2, sequence_length=128, beta=0.75
    )
    ```
    """
    with explain_unreachable(preset, "text_classifier_from_preset"):
        backbone = keras_hub.models.Backbone.from_preset(
            preset, load_weights=load_weights
        )
    classifier_cls = text_classifier_class(backbone)
    preprocessor_kwargs = {}
    if sequence_length is not None:
        preprocessor_kwargs["sequence_length"] = sequence_length
    preprocessor = classifier_cls.preprocessor_cls.from_preset(
        preset, **preprocessor_kwargs
    )
    return classifier_cls(
        backbone,
        num_classes,
        preprocessor=preprocessor,
        **_with_normalization_layer(kwargs),
    )


def small_bert_text_classifier(
    vocabulary,
    num_classes,
    sequence_length,
    num_layers=2,
    num_heads=4,
    hidden_dim=64,
    intermediate_dim=128,
    lowercase=True,
    **kwargs,
):
    """A small, randomly initialised BERT classifier, for offline runs.

    Args:
        vocabulary: A WordPiece vocabulary: a file path or a list of tokens
            (with `"[PAD]"`, `"[UNK]"`, `"[CLS]"`, `"[SEP]"`, `"[MASK]"`).
        num_classes: int. Number of logits; `1` for regression.
        sequence_length: int. Tokens per example, and the longest sequence
            the backbone takes.
        num_layers: int. Transformer layers.
        num_heads: int. Attention heads.
        hidden_dim: int. Width of the embeddings.
        intermediate_dim: int. Width of the feed-forward layers.
        lowercase: bool. Whether the tokenizer lowercases its inputs.
        **kwargs: Arguments of `IsoBNBertTextClassifier` and the
            normalization settings, as for `text_classifier_from_preset()`.

    Returns:
        An `IsoBNBertTextClassifier` whose `preprocessor` takes raw strings.

    Example:

    ```python
    classifier = keras_isobn.models.small_bert_text_classifier(
        keras_isobn.glue.sample_vocabulary_path(), num_classes=2,
        sequence_length=40,
    )
    ```
    """
    tokenizer = keras_hub.models.BertTokenizer(
        vocabulary=vocabulary, lowercase=lowercase
    )
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=num_layers,
        num_heads=num_heads,
        hidden_dim=hidden_dim,
        intermediate_dim=intermediate_dim,
        max_sequence_length=sequence_length,
    )
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        tokenizer, sequence_length=sequence_length
    )
    return IsoBNBertTextClassifier(
        backbone,
        num_classes,
        preprocessor=preprocessor,
        **_with_normalization_layer(kwargs),
    )


def _with_normalization_layer(kwargs):
    """Classifier kwargs, with the normalization settings made a layer.

    The settings (`momentum`, ...) among `kwargs` and the `normalization`
    name become one `normalization` layer (`get_pooled_normalization()`),
    which the classifier takes as its template.
    """
    kwargs = dict(kwargs)
    settings = {
        key: kwargs.pop(key) for key in NORMALIZATION_SETTINGS if key in kwargs
    }
    if settings:
        kwargs["normalization"] = get_pooled_normalization(
            kwargs.get("normalization", "isobn"), **settings
        )
    return kwargs
