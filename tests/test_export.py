import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_isobn import export
from keras_isobn.isotropy import isobn_reference_scale
from keras_isobn.models import IsoBNBertTextClassifier
from tests.helpers import tiny_models as tiny
from tests.helpers.tiny_models import to_numpy

BACKEND = keras.config.backend()


def fitted_classifier(normalization="isobn", preprocessor=True):
    """A tiny BERT classifier whose normalization has seen some batches."""
    classifier = IsoBNBertTextClassifier(
        tiny.bert_backbone(),
        num_classes=3,
        preprocessor=tiny.bert_preprocessor() if preprocessor else None,
        normalization=normalization,
    )
    x = tiny.token_inputs(tiny.bert_preprocessor(), tiny.SENTENCES)
    for _ in range(3):
        classifier(x, training=True)
    return classifier, x


@pytest.mark.parametrize("normalization", ["isobn", "batchnorm"])
def test_fold_normalization_into_the_logits_kernel(normalization):
    classifier, x = fitted_classifier(normalization)
    layer = classifier.normalization
    kernel = to_numpy(classifier.output_dense.kernel)
    bias = to_numpy(classifier.output_dense.bias)
    if normalization == "isobn":
        scale = isobn_reference_scale(
            to_numpy(layer.moving_covariance), to_numpy(layer.moving_std)
        )
        shift = np.zeros_like(scale)
    else:
        scale = to_numpy(layer.gamma) / np.sqrt(
            to_numpy(layer.moving_variance) + layer.epsilon
        )
        shift = to_numpy(layer.beta) - to_numpy(layer.moving_mean) * scale

    folded = export.fold_normalization(classifier)
    assert type(folded) is IsoBNBertTextClassifier
    assert folded.normalization is None
    assert folded.backbone is classifier.backbone
    np.testing.assert_allclose(
        to_numpy(folded.output_dense.kernel), scale[:, None] * kernel, rtol=1e-5
    )
    np.testing.assert_allclose(
        to_numpy(folded.output_dense.bias), bias + shift @ kernel, atol=1e-6
    )
    np.testing.assert_allclose(
        to_numpy(folded(x, training=False)),
        to_numpy(classifier(x, training=False)),
        atol=1e-5,
    )
    plain = IsoBNBertTextClassifier(
        tiny.bert_backbone(), num_classes=2, normalization=None
    )
    assert export.fold_normalization(plain) is plain


def test_export_saved_model(tmp_path):
    classifier, x = fitted_classifier()
    path = str(tmp_path / "saved_model")
    if BACKEND == "torch":
        with pytest.raises(NotImplementedError, match="KERAS_BACKEND=jax"):
            export.export_saved_model(classifier, path)
        return

    export.export_saved_model(classifier, path)
    reloaded = tf.saved_model.load(path)
    logits = to_numpy(classifier(x, training=False))
    np.testing.assert_allclose(
        reloaded.serve(x).numpy(), logits, atol=1e-4, rtol=0
    )
    spec = reloaded.serve.concrete_functions[0].structured_input_signature
    shape = spec[0][0]["token_ids"].shape.as_list()
    if BACKEND == "tensorflow":
        # The sequence length stays dynamic.
        assert shape == [None, None]
        short = {name: value[:, :10] for name, value in x.items()}
        np.testing.assert_allclose(
            reloaded.serve(short).numpy(),
            to_numpy(classifier(short, training=False)),
            atol=1e-4,
            rtol=0,
        )
    else:
        # jax2tf needs a fixed sequence length: the preprocessor's.
        assert shape == [None, tiny.SEQUENCE_LENGTH]
        classifier.preprocessor = None
        with pytest.raises(ValueError, match="sequence_length"):
            export.export_saved_model(classifier, str(tmp_path / "other"))


def test_export_text_serving_of_sentence_pairs(tmp_path):
    # Single sentences: see tests/models/test_minilm_integration.py.
    classifier, _ = fitted_classifier()
    path = str(tmp_path / "serving")
    if BACKEND != "tensorflow":
        with pytest.raises(
            NotImplementedError, match="KERAS_BACKEND=tensorflow"
        ):
            export.export_text_serving(classifier, path, pairs=True)
        return

    pairs = (tiny.SENTENCES, tiny.SECOND_SENTENCES)
    export.export_text_serving(classifier, path, pairs=True)
    reloaded = tf.saved_model.load(path)
    served = reloaded.serve(tf.constant(pairs[0]), tf.constant(pairs[1]))
    x = tiny.token_inputs(classifier.preprocessor, pairs)
    np.testing.assert_allclose(
        served.numpy(),
        to_numpy(classifier(x, training=False)),
        atol=1e-4,
        rtol=0,
    )
    signature = reloaded.signatures["serving_default"]
    names = sorted(signature.structured_input_signature[1])
    assert names == ["text_a", "text_b"]

    classifier.preprocessor = None
    with pytest.raises(ValueError, match="has none"):
        export.export_text_serving(classifier, str(tmp_path / "other"))
