import copy

import keras
import numpy as np
import pytest
from keras import ops

import keras_isobn
from keras_isobn.isotropy import isobn_reference_scale
from keras_isobn.models import IsoBNBertTextClassifier
from keras_isobn.models import get_pooled_normalization
from tests.helpers import tiny_models as tiny
from tests.helpers.tiny_models import to_numpy


@pytest.mark.parametrize("normalization", ["isobn", "batchnorm", None])
def test_normalization_sits_between_pooled_output_and_logits(normalization):
    backbone = tiny.bert_backbone(dropout=0.0)
    classifier = IsoBNBertTextClassifier(
        backbone, num_classes=3, normalization=normalization
    )
    x = tiny.token_inputs(tiny.bert_preprocessor(), tiny.SENTENCES)
    pooled = to_numpy(backbone(x)["pooled_output"])

    # One training-mode call updates the statistics from the pooled output.
    classifier(x, training=True)
    kernel = to_numpy(classifier.output_dense.kernel)
    bias = to_numpy(classifier.output_dense.bias)
    logits = to_numpy(classifier(x, training=False))

    centred = pooled - pooled.mean(axis=0)
    if normalization == "isobn":
        layer = classifier.normalization
        assert isinstance(layer, keras_isobn.IsoBatchNormalization)
        covariance = to_numpy(layer.moving_covariance)
        std = to_numpy(layer.moving_std)
        np.testing.assert_allclose(
            covariance, 0.05 * centred.T @ centred / len(pooled), atol=1e-6
        )
        np.testing.assert_allclose(
            std, 0.05 * np.sqrt(np.mean(centred**2, axis=0)), atol=1e-6
        )
        features = pooled * isobn_reference_scale(covariance, std)
    elif normalization == "batchnorm":
        layer = classifier.normalization
        assert isinstance(layer, keras.layers.BatchNormalization)
        # `momentum=0.05` is the weight of the new batch, as for IsoBN.
        mean = to_numpy(layer.moving_mean)
        variance = to_numpy(layer.moving_variance)
        np.testing.assert_allclose(mean, 0.05 * pooled.mean(0), atol=1e-6)
        np.testing.assert_allclose(
            variance, 0.95 + 0.05 * pooled.var(0), atol=1e-6
        )
        features = (pooled - mean) / np.sqrt(variance + 1e-3)
    else:
        assert classifier.normalization is None
        features = pooled
    np.testing.assert_allclose(logits, features @ kernel + bias, atol=1e-5)

    names = [layer.name for layer in classifier.layers]
    expected = [backbone.name, "classifier_dropout", "logits"]
    if normalization is not None:
        expected.insert(1, "pooled_normalization")
    assert names[-len(expected) :] == expected


def test_fit_on_raw_sentence_pairs_updates_isobn_statistics():
    classifier = IsoBNBertTextClassifier(
        tiny.bert_backbone(),
        num_classes=2,
        preprocessor=tiny.bert_preprocessor(),
    )
    assert not np.any(to_numpy(classifier.normalization.moving_std))
    pairs = (tiny.SENTENCES, tiny.SECOND_SENTENCES)
    history = classifier.fit(pairs, tiny.LABELS, batch_size=4, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert np.all(to_numpy(classifier.normalization.moving_std) > 0.0)


def test_regression_head_defaults_to_mean_squared_error():
    classifier = IsoBNBertTextClassifier(tiny.bert_backbone(), num_classes=1)
    assert isinstance(classifier.loss, keras.losses.MeanSquaredError)
    x = tiny.token_inputs(tiny.bert_preprocessor(), tiny.SENTENCES)
    classifier(x, training=True)
    predictions = to_numpy(classifier(x, training=False))
    assert predictions.shape == (len(tiny.SENTENCES), 1)
    scores = np.linspace(0.0, 5.0, len(tiny.SENTENCES)).astype("float32")
    loss, mae = classifier.evaluate(
        x, scores, batch_size=len(scores), verbose=0
    )
    errors = predictions[:, 0] - scores
    np.testing.assert_allclose(loss, np.mean(errors**2), rtol=1e-4)
    np.testing.assert_allclose(mae, np.mean(np.abs(errors)), rtol=1e-4)


def test_config_round_trip_keeps_head_hyperparameters():
    classifier = IsoBNBertTextClassifier(
        tiny.bert_backbone(),
        num_classes=4,
        normalization=keras_isobn.IsoBatchNormalization(
            momentum=0.1, epsilon=1e-4, beta=0.75, bias_correction=True
        ),
        dropout=0.2,
    )
    layer = classifier.normalization
    assert layer.name == "pooled_normalization"
    assert layer.dtype_policy == classifier.backbone.dtype_policy
    config = classifier.get_config()
    assert config["normalization"]["class_name"] == "IsoBatchNormalization"
    assert config["normalization"]["config"]["beta"] == 0.75
    restored = IsoBNBertTextClassifier.from_config(copy.deepcopy(config))
    assert isinstance(restored, IsoBNBertTextClassifier)
    layer = restored.normalization
    assert (layer.momentum, layer.epsilon, layer.beta) == (0.1, 1e-4, 0.75)
    assert layer.bias_correction
    assert restored.dropout == 0.2
    assert restored.get_config() == config


@pytest.mark.parametrize("normalization", ["isobn", "batchnorm"])
def test_synchronized_statistics_option(normalization):
    make = lambda: IsoBNBertTextClassifier(  # noqa: E731
        tiny.bert_backbone(),
        num_classes=2,
        normalization=get_pooled_normalization(
            normalization, synchronized=True
        ),
    )
    if keras.backend.backend() == "torch":  # No synchronized statistics.
        with pytest.raises(ValueError, match="synchronized=True"):
            make()
        return
    classifier = make()
    # The option acts under `tf.distribute` only: off TensorFlow, the layer
    # made from the template is not synchronized (on JAX,
    # `keras.distribution` computes the global batch's statistics anyway).
    expected = keras.backend.backend() == "tensorflow"
    assert classifier.normalization.synchronized is expected
    config = classifier.get_config()
    assert config["normalization"]["config"]["synchronized"] is expected
    restored = IsoBNBertTextClassifier.from_config(copy.deepcopy(config))
    assert restored.get_config() == config
    assert restored.normalization.synchronized is expected
    default = IsoBNBertTextClassifier(tiny.bert_backbone(), num_classes=2)
    assert not default.normalization.synchronized


def test_preprocessed_padding_mask_is_int32():
    # Keras cannot split boolean inputs across `tf.distribute` replicas; the
    # backbone takes int32.
    classifier = IsoBNBertTextClassifier(
        tiny.bert_backbone(),
        num_classes=2,
        preprocessor=tiny.bert_preprocessor(),
    )
    x, y = classifier.preprocess_samples(
        np.array(tiny.SENTENCES), y=tiny.LABELS
    )
    mask = ops.convert_to_numpy(x["padding_mask"])
    assert mask.dtype == np.int32
    expected = tiny.bert_preprocessor()(np.array(tiny.SENTENCES))
    np.testing.assert_array_equal(mask, to_numpy(expected["padding_mask"]))
    np.testing.assert_array_equal(to_numpy(y), tiny.LABELS)
    # In the tf.data pipeline of `predict`, and on to the same logits.
    logits = classifier.predict(np.array(tiny.SENTENCES), verbose=0)
    np.testing.assert_allclose(
        logits, to_numpy(classifier(x, training=False)), rtol=1e-5, atol=1e-6
    )


def test_unknown_normalization_is_rejected():
    with pytest.raises(ValueError, match='"isobn", "batchnorm", None'):
        IsoBNBertTextClassifier(
            tiny.bert_backbone(), num_classes=2, normalization="layernorm"
        )


def test_mixed_float16_trains_with_float32_statistics():
    keras.mixed_precision.set_global_policy("mixed_float16")
    classifier = IsoBNBertTextClassifier(tiny.bert_backbone(), num_classes=2)
    layer = classifier.normalization
    assert layer.dtype_policy.name == "mixed_float16"
    assert classifier.output_dense.dtype_policy.name == "mixed_float16"
    x = tiny.token_inputs(tiny.bert_preprocessor(), tiny.SENTENCES)
    history = classifier.fit(x, tiny.LABELS, batch_size=4, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert layer.moving_covariance.dtype == "float32"
    assert layer.moving_std.dtype == "float32"
    assert np.all(to_numpy(layer.moving_std) > 0.0)
    assert np.isfinite(to_numpy(layer.moving_covariance)).all()
    assert ops.convert_to_numpy(layer.scale()).dtype == np.float32
    logits = classifier(x, training=False)
    assert keras.backend.standardize_dtype(logits.dtype) == "float16"
    assert np.isfinite(to_numpy(logits)).all()
    for variable in classifier.weights:
        assert np.isfinite(to_numpy(variable)).all(), variable.path
