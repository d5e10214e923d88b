import keras
import numpy as np
import pytest

from keras_isobn.tokenization import tokenize
from tests.helpers import tiny_models as tiny


def test_tokenize_matches_the_preprocessor():
    classifier = tiny.small_bert_classifier()
    x = tokenize(classifier, tiny.SENTENCES, batch_size=3)
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
    x = tokenize(tiny.small_bert_classifier(), tiny.SENTENCES, batch_size=3)
    assert seen == [False]
    assert x["token_ids"].shape == (8, 16)


def test_tokenize_sentence_pairs():
    classifier = tiny.small_bert_classifier()
    pairs = (tiny.SENTENCES, tiny.SECOND_SENTENCES)
    x = tokenize(classifier, pairs, batch_size=5)
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
    preprocessor = tiny.small_bert_classifier().preprocessor
    pairs = (tiny.SENTENCES, tiny.SECOND_SENTENCES)
    for features in (tiny.SENTENCES, pairs):
        x = tokenize(preprocessor, features, batch_size=3)
        want = tiny.token_inputs(preprocessor, features)
        assert sorted(x) == sorted(want)
        for name in want:
            np.testing.assert_array_equal(x[name], want[name], name)
    with pytest.raises(TypeError, match="classifier or its preprocessor"):
        tokenize("not a preprocessor", tiny.SENTENCES)
