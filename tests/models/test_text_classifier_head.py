import socket

import keras
import keras_hub
import numpy as np
import pytest

import keras_isobn
from keras_isobn.models import IsoBNBertTextClassifier
from keras_isobn.models import IsoBNHeadMixin
from keras_isobn.models import get_pooled_normalization
from tests.models import tiny
from tests.models.tiny import numpy_isobn_scale
from tests.models.tiny import to_numpy


@keras.saving.register_keras_serializable(package="keras_isobn_tests")
class IsoBNAlbertTextClassifier(
    IsoBNHeadMixin, keras_hub.models.AlbertTextClassifier
):
    """The reuse example of `IsoBNHeadMixin`'s docstring."""

    def __init__(
        self,
        backbone,
        num_classes,
        preprocessor=None,
        activation=None,
        dropout=0.1,
        normalization="isobn",
        momentum=0.05,
        epsilon=1e-3,
        beta=0.5,
        bias_correction=False,
        **kwargs,
    ):
        self.backbone = backbone
        self.preprocessor = preprocessor
        inputs = backbone.input
        outputs = self.build_head(
            backbone(inputs)["pooled_output"],
            num_classes=num_classes,
            activation=activation,
            dropout=dropout,
            normalization=normalization,
            momentum=momentum,
            epsilon=epsilon,
            beta=beta,
            bias_correction=bias_correction,
        )
        keras_hub.models.TextClassifier.__init__(
            self, inputs=inputs, outputs=outputs, **kwargs
        )


def test_get_pooled_normalization():
    isobn = get_pooled_normalization(
        "isobn", momentum=0.1, epsilon=1e-4, beta=1.0, bias_correction=True
    )
    assert isinstance(isobn, keras_isobn.IsoBatchNormalization)
    assert isobn.name == "pooled_normalization"
    assert (isobn.momentum, isobn.epsilon, isobn.beta) == (0.1, 1e-4, 1.0)
    assert isobn.bias_correction

    batchnorm = get_pooled_normalization(
        "batchnorm", momentum=0.1, epsilon=1e-4
    )
    assert isinstance(batchnorm, keras.layers.BatchNormalization)
    assert batchnorm.name == "pooled_normalization"
    np.testing.assert_allclose(batchnorm.momentum, 0.9)
    assert batchnorm.epsilon == 1e-4

    assert get_pooled_normalization(None) is None
    with pytest.raises(ValueError, match="Received: normalization='BN'"):
        get_pooled_normalization("BN")
    with pytest.raises(ValueError, match="momentum"):
        get_pooled_normalization("batchnorm", momentum=1.5)


def test_head_is_reusable_for_albert():
    backbone = keras_hub.models.AlbertBackbone(
        vocabulary_size=len(tiny.BERT_VOCABULARY),
        num_layers=1,
        num_heads=2,
        embedding_dim=8,
        hidden_dim=16,
        intermediate_dim=32,
        dropout=0.0,
        max_sequence_length=32,
    )
    classifier = IsoBNAlbertTextClassifier(backbone, num_classes=3)
    assert isinstance(classifier, keras_hub.models.AlbertTextClassifier)
    layer = classifier.get_layer("pooled_normalization")
    assert layer is classifier.normalization

    x = tiny.token_inputs(tiny.bert_preprocessor(), tiny.SENTENCES)
    pooled = to_numpy(backbone(x)["pooled_output"])
    classifier(x, training=True)
    scale = numpy_isobn_scale(
        to_numpy(layer.moving_covariance), to_numpy(layer.moving_std)
    )
    kernel = to_numpy(classifier.output_dense.kernel)
    bias = to_numpy(classifier.output_dense.bias)
    np.testing.assert_allclose(
        to_numpy(classifier(x, training=False)),
        (pooled * scale) @ kernel + bias,
        atol=1e-5,
    )
    config = classifier.get_config()
    assert config["normalization"] == "isobn"
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(classifier)
    )
    assert isinstance(restored, IsoBNAlbertTextClassifier)


def test_unreachable_preset_says_so_and_shows_a_local_directory(
    monkeypatch, tmp_path
):
    def offline(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", offline)
    monkeypatch.setenv("KAGGLEHUB_CACHE", str(tmp_path))
    with pytest.raises(OSError, match="Could not download the preset") as info:
        IsoBNBertTextClassifier.from_preset(
            "bert_tiny_en_uncased", num_classes=2
        )
    message = str(info.value)
    assert "'bert_tiny_en_uncased'" in message
    assert "save_to_preset" in message
    assert 'IsoBNBertTextClassifier.from_preset("/path/to/' in message

    # Not a download failure: KerasHub's own error passes through.
    with pytest.raises(ValueError, match="Unknown preset identifier"):
        IsoBNBertTextClassifier.from_preset(
            str(tmp_path / "no_such_dir"), num_classes=2
        )
