"""The simulated anisotropic encoder of `experiments.anisotropic_glue`."""

import json

import keras
import numpy as np
import pytest

from experiments.anisotropic_glue import anisotropic_map
from keras_isobn import models
from keras_isobn.isotropy import explained_variance
from tests.helpers import tiny_models as tiny


def test_the_map_reaches_the_target_ev_and_keeps_the_total_variance():
    rng = np.random.default_rng(0)
    # Near isotropic, as MiniLM's pooled outputs: EV_3 about 0.1.
    pooled = rng.normal(size=(400, 32)) * np.linspace(1.0, 0.5, 32)
    before = anisotropic_map.statistics(pooled)
    assert before["ev3"] < 0.2
    matrix, p = anisotropic_map.anisotropic_map(pooled, target_ev=0.86)
    mapped = pooled @ matrix
    after = anisotropic_map.statistics(mapped)
    assert p > 0
    assert after["ev3"] == pytest.approx(0.86, abs=1e-3)
    assert explained_variance(mapped, [3])[0] == pytest.approx(0.86, abs=1e-3)
    np.testing.assert_allclose(
        np.var(mapped, axis=0).sum(), np.var(pooled, axis=0).sum(), rtol=1e-9
    )
    # Stds spread over orders of magnitude; features in correlated groups.
    assert after["std_max"] / after["std_min"] > 30
    assert after["gamma_median"] > 5 * before["gamma_median"]
    # The same seed, the same map.
    again, _ = anisotropic_map.anisotropic_map(pooled, target_ev=0.86)
    np.testing.assert_array_equal(matrix, again)
    with pytest.raises(ValueError, match="out of reach"):
        anisotropic_map.anisotropic_map(pooled, target_ev=0.01)


def test_the_classifier_sees_the_mapped_pooled_output():
    keras.utils.set_random_seed(1)
    classifier = models.IsoBNBertTextClassifier(
        tiny.bert_backbone(), 2, preprocessor=tiny.bert_preprocessor()
    )
    rng = np.random.default_rng(1)
    matrix = rng.normal(size=(16, 16))
    wrapped = anisotropic_map.with_map(classifier, matrix)
    assert type(wrapped) is type(classifier)
    assert wrapped.normalization.get_config() == (
        classifier.normalization.get_config()
    )
    x = wrapped.preprocessor(tiny.SENTENCES)
    backbone = classifier.backbone
    pooled = keras.Model(backbone.input, backbone.output["pooled_output"])
    probe = keras.Model(wrapped.input, wrapped.normalization.input)
    np.testing.assert_allclose(
        probe.predict(x, verbose=0),
        pooled.predict(x, verbose=0) @ matrix,
        rtol=1e-4,
        atol=1e-5,
    )
    # The map is frozen; the encoder still trains.
    (layer,) = [l for l in wrapped.backbone.layers if l.name == "anisotropic_map"]
    assert not layer.trainable
    assert wrapped.backbone.trainable_weights
    wrapped.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    kernel = np.array(keras.ops.convert_to_numpy(layer.kernel))
    wrapped.fit(tiny.SENTENCES, tiny.LABELS, epochs=1, verbose=0)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer.kernel), kernel)


def test_the_recipe_fine_tunes_minilm_behind_the_map(tmp_path):
    from experiments.anisotropic_glue import command_line
    from keras_isobn.glue import sample_data_dir

    (result,) = command_line.main(
        ["--glue-dir", sample_data_dir(), "--output-dir", str(tmp_path)]
        + ["--", "--task", "stsb", "--norm", "isobn", "--seeds", "1"]
        + ["--train-limit", "32", "--epochs", "1", "--batch-size", "16"]
        + ["--max-sequence-length", "16", "--no-report", "--verbose", "0"]
    )
    record = json.loads((tmp_path / "anisotropic_map_stsb.json").read_text())
    assert record["mapped"]["ev3"] == pytest.approx(0.86, abs=1e-3)
    assert record["examples"] == 32
    assert (tmp_path / "stsb" / "isobn" / "seed-1" / "results.json").is_file()
    # The recipe's classifier saw the mapped features: their EV_3 on the dev
    # set, before fine-tuning, is far above MiniLM's own.
    assert result["ev"]["before"]["in"] > record["pretrained"]["ev3"] + 0.1
