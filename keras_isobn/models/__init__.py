"""KerasHub text classifiers with IsoBN.

One class per KerasHub text classifier family, with KerasHub's name and
arguments (`IsoBNBertTextClassifier` for `keras_hub.models.
BertTextClassifier`, ...), and `IsoBNTextClassifier.from_preset()` picking
the family from a preset's backbone.

Import this module (or use `keras_isobn.models`) before loading a saved
classifier, so that Keras finds its registered class.
"""

from keras_isobn.models.albert_text_classifier import IsoBNAlbertTextClassifier
from keras_isobn.models.bert_text_classifier import IsoBNBertTextClassifier
from keras_isobn.models.builders import TEXT_CLASSIFIERS
from keras_isobn.models.builders import small_bert_text_classifier
from keras_isobn.models.builders import text_classifier_class
from keras_isobn.models.builders import text_classifier_from_preset
from keras_isobn.models.deberta_v3_text_classifier import (
    IsoBNDebertaV3TextClassifier,
)
from keras_isobn.models.distil_bert_text_classifier import (
    IsoBNDistilBertTextClassifier,
)
from keras_isobn.models.f_net_text_classifier import IsoBNFNetTextClassifier
from keras_isobn.models.pooled_normalization import get_pooled_normalization
from keras_isobn.models.roberta_text_classifier import (
    IsoBNRobertaTextClassifier,
)
from keras_isobn.models.roformer_v2_text_classifier import (
    IsoBNRoformerV2TextClassifier,
)
from keras_isobn.models.text_classifier import IsoBNTextClassifier
from keras_isobn.tokenization import tokenize
from keras_isobn.tokenization import tokenize_splits
from keras_isobn.models.xlm_roberta_text_classifier import (
    IsoBNXLMRobertaTextClassifier,
)

__all__ = [
    "TEXT_CLASSIFIERS",
    "IsoBNAlbertTextClassifier",
    "IsoBNBertTextClassifier",
    "IsoBNDebertaV3TextClassifier",
    "IsoBNDistilBertTextClassifier",
    "IsoBNFNetTextClassifier",
    "IsoBNRobertaTextClassifier",
    "IsoBNRoformerV2TextClassifier",
    "IsoBNTextClassifier",
    "IsoBNXLMRobertaTextClassifier",
    "get_pooled_normalization",
    "small_bert_text_classifier",
    "text_classifier_class",
    "text_classifier_from_preset",
    "tokenize",
    "tokenize_splits",
]
