import inspect
import socket

import keras
import numpy as np
import pytest

import keras_isobn
from keras_isobn import models
from keras_isobn.models import IsoBNBertTextClassifier
from keras_isobn.models import get_pooled_normalization
from keras_isobn.models.pooled_normalization import NORMALIZATION_SETTINGS
from tests.helpers import tiny_models as tiny


def test_named_normalizations_and_their_settings():
    isobn = get_pooled_normalization(
        "isobn", momentum=0.1, epsilon=1e-4, beta=1.0, bias_correction=True
    )
    assert isinstance(isobn, keras_isobn.IsoBatchNormalization)
    assert isobn.name == "pooled_normalization"
    assert (isobn.momentum, isobn.epsilon, isobn.beta) == (0.1, 1e-4, 1.0)
    assert isobn.bias_correction
    # Unset settings are the layer's own defaults.
    default = get_pooled_normalization("isobn")
    assert (
        default.get_config()
        == keras_isobn.IsoBatchNormalization(
            name="pooled_normalization"
        ).get_config()
    )

    # IsoBN's convention: `momentum` is the weight of each new batch.
    batchnorm = get_pooled_normalization(
        "batchnorm", momentum=0.1, epsilon=1e-4, beta=0.75
    )
    assert isinstance(batchnorm, keras.layers.BatchNormalization)
    assert batchnorm.name == "pooled_normalization"
    np.testing.assert_allclose(batchnorm.momentum, 0.9)
    assert batchnorm.epsilon == 1e-4
    np.testing.assert_allclose(
        get_pooled_normalization("batchnorm").momentum, 0.95
    )

    assert get_pooled_normalization(None) is None
    assert get_pooled_normalization(None, momentum=0.1) is None
    with pytest.raises(ValueError, match="Received: normalization='BN'"):
        get_pooled_normalization("BN")
    with pytest.raises(TypeError, match="a Keras layer or a layer config"):
        get_pooled_normalization(0.5)
    with pytest.raises(ValueError, match="momentum"):
        get_pooled_normalization("batchnorm", momentum=1.5)


def test_a_layer_or_config_is_a_template():
    template = keras_isobn.IsoBatchNormalization(beta=0.75, name="mine")
    layer = get_pooled_normalization(template, dtype="mixed_float16")
    assert layer is not template
    assert layer.name == "pooled_normalization"
    assert layer.dtype_policy.name == "mixed_float16"
    assert layer.beta == 0.75

    config = keras.layers.serialize(layer)
    again = get_pooled_normalization(config)
    assert again.get_config() == layer.get_config()
    other = get_pooled_normalization(
        keras.layers.serialize(keras.layers.LayerNormalization())
    )
    assert isinstance(other, keras.layers.LayerNormalization)
    assert other.name == "pooled_normalization"
    with pytest.raises(ValueError, match="only apply to a `normalization`"):
        get_pooled_normalization(template, beta=1.0)


@pytest.mark.parametrize("name", ["isobn", "batchnorm"])
def test_a_synchronized_config_loads_on_every_backend(name):
    # As a classifier trained under `tf.distribute` saves it.
    config = keras.layers.serialize(get_pooled_normalization(name))
    config["config"]["synchronized"] = True
    layer = get_pooled_normalization(config)
    on_tensorflow = keras.backend.backend() == "tensorflow"
    assert layer.synchronized is on_tensorflow


def test_normalization_settings_are_those_of_get_pooled_normalization():
    parameters = list(inspect.signature(get_pooled_normalization).parameters)
    assert tuple(parameters[1:-1]) == NORMALIZATION_SETTINGS


def test_builders_take_the_normalization_settings():
    common = {
        "vocabulary": tiny.BERT_VOCABULARY,
        "num_classes": 2,
        "sequence_length": 8,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 8,
        "intermediate_dim": 16,
    }
    classifier = models.small_bert_text_classifier(
        **common,
        momentum=0.1,
        beta=0.75,
        output_variance="unit",
        bias_correction=True,
        dropout=0.3,
    )
    layer = classifier.normalization
    assert isinstance(layer, keras_isobn.IsoBatchNormalization)
    assert (layer.momentum, layer.beta, layer.bias_correction) == (
        0.1,
        0.75,
        True,
    )
    assert layer.output_variance == "unit"
    # The classifier's config keeps it.
    clone = type(classifier).from_config(classifier.get_config())
    assert clone.normalization.output_variance == "unit"
    assert classifier.dropout == 0.3
    batchnorm = models.small_bert_text_classifier(
        **common, normalization="batchnorm", momentum=0.1, beta=0.75
    )
    np.testing.assert_allclose(batchnorm.normalization.momentum, 0.9)
    plain = models.small_bert_text_classifier(
        **common, normalization=None, momentum=0.1, beta=0.75
    )
    assert plain.normalization is None
    assert plain.get_config()["normalization"] is None


def test_unreachable_preset_says_so_and_shows_a_local_directory(
    monkeypatch, tmp_path
):
    def offline(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", offline)
    monkeypatch.setenv("KAGGLEHUB_CACHE", str(tmp_path))
    for load, caller in [
        (IsoBNBertTextClassifier.from_preset, "IsoBNBertTextClassifier"),
        (models.IsoBNTextClassifier.from_preset, "IsoBNTextClassifier"),
        (models.text_classifier_from_preset, "text_classifier_from_preset"),
    ]:
        with pytest.raises(OSError, match="Could not download") as info:
            load("bert_tiny_en_uncased", num_classes=2)
        message = str(info.value)
        assert "'bert_tiny_en_uncased'" in message
        assert "save_to_preset" in message
        assert f'{caller}("/path/to/' in message.replace(".from_preset", "")

    # Not a download failure: KerasHub's own error passes through.
    with pytest.raises(ValueError, match="Unknown preset identifier"):
        IsoBNBertTextClassifier.from_preset(
            str(tmp_path / "no_such_dir"), num_classes=2
        )
