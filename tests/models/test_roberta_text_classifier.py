import copy

from keras_isobn.models import IsoBNRobertaTextClassifier
from tests.helpers import tiny_models as tiny


def test_defaults_and_config_round_trip():
    classifier = IsoBNRobertaTextClassifier(
        tiny.roberta_backbone(), num_classes=2, normalization="batchnorm"
    )
    assert classifier.dropout == 0.1
    assert classifier.hidden_dim == classifier.backbone.hidden_dim
    assert classifier.get_layer("pooled_normalization").momentum == 0.95
    config = classifier.get_config()
    assert config["normalization"]["class_name"] == "BatchNormalization"
    assert config["hidden_dim"] == classifier.backbone.hidden_dim
    restored = IsoBNRobertaTextClassifier.from_config(copy.deepcopy(config))
    assert isinstance(restored.normalization, type(classifier.normalization))
    assert restored.get_config() == config
