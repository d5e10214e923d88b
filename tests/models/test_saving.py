import keras
import numpy as np
import pytest

import keras_isobn
from keras_isobn.models import IsoBNBertTextClassifier
from keras_isobn.models import IsoBNRobertaTextClassifier
from tests.helpers import tiny_models as tiny
from tests.helpers.tiny_models import to_numpy

CLASSIFIERS = {
    "bert": (
        IsoBNBertTextClassifier,
        tiny.bert_backbone,
        tiny.bert_preprocessor,
    ),
    "roberta": (
        IsoBNRobertaTextClassifier,
        tiny.roberta_backbone,
        tiny.roberta_preprocessor,
    ),
}


def statistics(classifier):
    variables = classifier.normalization.non_trainable_variables
    return [to_numpy(variable) for variable in variables]


@pytest.mark.parametrize("kind", sorted(CLASSIFIERS))
def test_keras_file_and_preset_round_trips(kind, tmp_path):
    cls, backbone, preprocessor = CLASSIFIERS[kind]
    classifier = cls(
        backbone(),
        num_classes=2,
        preprocessor=preprocessor(),
        normalization=keras_isobn.IsoBatchNormalization(
            beta=0.75, bias_correction=True
        ),
    )
    x = tiny.token_inputs(classifier.preprocessor, tiny.SENTENCES)
    for _ in range(3):
        classifier(x, training=True)
    logits = to_numpy(classifier(x, training=False))
    stats = statistics(classifier)
    assert len(stats) == 4  # covariance, std, bias-correction weight, scale
    assert all(np.any(s != 0.0) for s in stats)

    classifier.save(tmp_path / "classifier.keras")
    classifier.save_to_preset(tmp_path / "preset")
    restored = {
        ".keras": keras.saving.load_model(tmp_path / "classifier.keras"),
        "preset": cls.from_preset(str(tmp_path / "preset")),
    }
    for how, model in restored.items():
        assert type(model) is cls, how
        assert model.normalization.beta == 0.75, how
        for saved, loaded in zip(stats, statistics(model)):
            np.testing.assert_array_equal(saved, loaded, err_msg=how)
        reprocessed = tiny.token_inputs(model.preprocessor, tiny.SENTENCES)
        for name, value in x.items():
            np.testing.assert_array_equal(reprocessed[name], value)
        np.testing.assert_array_equal(
            to_numpy(model(x, training=False)), logits, err_msg=how
        )

    # With `num_classes`, KerasHub builds a new head, with the same
    # normalization hyperparameters.
    new_head = cls.from_preset(str(tmp_path / "preset"), num_classes=3)
    assert new_head.normalization.beta == 0.75
    assert new_head.normalization.bias_correction
    assert tuple(new_head(x).shape) == (len(tiny.SENTENCES), 3)


def test_reloaded_classifier_is_compiled_as_saved(tmp_path, recwarn):
    classifier = IsoBNBertTextClassifier(tiny.bert_backbone(), num_classes=1)
    classifier.compile(optimizer=keras.optimizers.AdamW(3e-4))
    x = tiny.token_inputs(tiny.bert_preprocessor(), tiny.SENTENCES)
    y = np.linspace(0.0, 5.0, len(tiny.SENTENCES)).astype("float32")
    classifier.fit(x, y, batch_size=4, verbose=0)
    classifier.save(tmp_path / "regression.keras")

    model = keras.saving.load_model(tmp_path / "regression.keras")
    assert not [w for w in recwarn if "compile" in str(w.message)]
    assert model.compiled
    assert isinstance(model.optimizer, keras.optimizers.AdamW)
    np.testing.assert_allclose(
        float(to_numpy(model.optimizer.learning_rate)), 3e-4, rtol=1e-6
    )
    assert isinstance(model.loss, keras.losses.MeanSquaredError)
    # The optimizer state came back too: training goes on from step 2.
    assert int(to_numpy(model.optimizer.iterations)) == 2
    model.fit(x, y, batch_size=4, verbose=0)
    assert int(to_numpy(model.optimizer.iterations)) == 4


def test_unknown_compile_objects_fail_unless_loaded_uncompiled(tmp_path):
    @keras.saving.register_keras_serializable(package="test_saving_only")
    class HalvedRate(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            return 0.5e-3

        def get_config(self):
            return {}

    classifier = IsoBNBertTextClassifier(tiny.bert_backbone(), num_classes=2)
    classifier.compile(optimizer=keras.optimizers.Adam(HalvedRate()))
    x = tiny.token_inputs(tiny.bert_preprocessor(), tiny.SENTENCES)
    classifier(x)
    classifier.save(tmp_path / "classifier.keras")
    del keras.saving.get_custom_objects()["test_saving_only>HalvedRate"]

    # Keras names the class it cannot find; `compile=False` loads the rest.
    with pytest.raises(TypeError, match="HalvedRate"):
        keras.saving.load_model(tmp_path / "classifier.keras")
    model = keras.saving.load_model(
        tmp_path / "classifier.keras", compile=False
    )
    np.testing.assert_array_equal(
        to_numpy(model(x, training=False)),
        to_numpy(classifier(x, training=False)),
    )
