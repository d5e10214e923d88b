import copy

import numpy as np
import pytest

import keras_isobn
from keras_isobn.models import IsoBNRobertaTextClassifier
from tests.models import tiny
from tests.models.tiny import numpy_isobn_scale
from tests.models.tiny import to_numpy


@pytest.mark.parametrize("normalization", ["isobn", None])
def test_normalization_sits_after_the_tanh_dense_layer(normalization):
    backbone = tiny.roberta_backbone(dropout=0.0)
    classifier = IsoBNRobertaTextClassifier(
        backbone,
        num_classes=3,
        hidden_dim=8,
        dropout=0.0,
        normalization=normalization,
    )
    pairs = (tiny.SENTENCES, tiny.SECOND_SENTENCES)
    x = tiny.token_inputs(tiny.roberta_preprocessor(), pairs)
    assert np.all(np.sum(x["token_ids"] == 2, axis=1) >= 2)  # "</s>" twice
    start = to_numpy(backbone(x))[:, backbone.start_token_index, :]
    dense_kernel, dense_bias = map(
        to_numpy, classifier.get_layer("pooled_dense").weights
    )
    pooled = np.tanh(start @ dense_kernel + dense_bias)
    assert pooled.shape == (len(tiny.SENTENCES), 8)

    # One training-mode call updates the statistics from `pooled`.
    classifier(x, training=True)
    logits = to_numpy(classifier(x, training=False))
    kernel = to_numpy(classifier.output_dense.kernel)
    bias = to_numpy(classifier.output_dense.bias)
    if normalization == "isobn":
        layer = classifier.get_layer("pooled_normalization")
        assert layer is classifier.normalization
        assert isinstance(layer, keras_isobn.IsoBatchNormalization)
        centred = pooled - pooled.mean(axis=0)
        covariance = to_numpy(layer.moving_covariance)
        std = to_numpy(layer.moving_std)
        np.testing.assert_allclose(
            covariance, 0.05 * centred.T @ centred / len(pooled), atol=1e-6
        )
        pooled = pooled * numpy_isobn_scale(covariance, std)
    else:
        assert classifier.normalization is None
    np.testing.assert_allclose(logits, pooled @ kernel + bias, atol=1e-5)
    names = [layer.name for layer in classifier.layers]
    expected = [
        backbone.name,
        "pooled_dropout",
        "pooled_dense",
        "pooled_normalization",
        "output_dropout",
        "logits",
    ]
    if normalization is None:
        expected.remove("pooled_normalization")
    assert names[-len(expected) :] == expected


def test_defaults_and_config_round_trip():
    classifier = IsoBNRobertaTextClassifier(
        tiny.roberta_backbone(), num_classes=2, normalization="batchnorm"
    )
    assert classifier.dropout == 0.1
    assert classifier.hidden_dim == classifier.backbone.hidden_dim
    assert classifier.get_layer("pooled_normalization").momentum == 0.95
    config = classifier.get_config()
    assert config["normalization"] == "batchnorm"
    assert config["hidden_dim"] == classifier.backbone.hidden_dim
    restored = IsoBNRobertaTextClassifier.from_config(copy.deepcopy(config))
    assert isinstance(restored.normalization, type(classifier.normalization))
    assert restored.get_config() == config
