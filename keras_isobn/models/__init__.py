"""KerasHub text classifiers with IsoBN."""

from keras_isobn.models.bert_text_classifier import IsoBNBertTextClassifier
from keras_isobn.models.roberta_text_classifier import (
    IsoBNRobertaTextClassifier,
)
from keras_isobn.models.text_classifier_head import NORMALIZATIONS
from keras_isobn.models.text_classifier_head import IsoBNHeadMixin
from keras_isobn.models.text_classifier_head import get_pooled_normalization
