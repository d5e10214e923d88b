"""Every KerasHub text classifier family with IsoBN: tiny random backbones.

KerasHub's own task harness (`run_task_test`, `run_model_saving_test`, as
its classifiers' tests use) plus IsoBN's placement in each head, equality
with KerasHub's classifier without normalization, and what the
keras_isobn tools (export, callbacks, distribution) need from each head.
"""

import sys
import types

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized
from keras import ops

import keras_isobn
from keras_isobn import distribution
from keras_isobn import export
from keras_isobn import models
from keras_isobn.isotropy import isobn_reference_scale
from tests.helpers import tiny_models as tiny
from tests.helpers.tiny_models import to_numpy

BACKEND = keras.config.backend()
FAMILIES = sorted(tiny.FAMILIES)
PAIRS = (tiny.SENTENCES, tiny.SECOND_SENTENCES)

# What enters the normalization: the backbone's pooled output, or the first
# token's features through the head's dense layer (and its activation).
HEADS = {
    "albert": (None, ["output_dropout"]),
    "bert": (None, ["classifier_dropout"]),
    "deberta_v3": ("gelu", ["pooled_dropout", "classifier_dropout"]),
    "distil_bert": ("relu", ["output_dropout"]),
    "f_net": (None, ["output_dropout"]),
    "roberta": ("tanh", ["pooled_dropout", "output_dropout"]),
    "roformer_v2": ("tanh", ["pooled_dropout", "output_dropout"]),
    "xlm_roberta": ("tanh", ["pooled_dropout", "output_dropout"]),
}

ACTIVATIONS = {
    "gelu": lambda x: to_numpy(keras.activations.gelu(x)),
    "relu": lambda x: np.maximum(x, 0.0),
    "tanh": np.tanh,
}


def keras_hub_test_case():
    """KerasHub's `TestCase`, the harness of its own model tests.

    Its module imports Grain for its Grain checks only (none of them run
    here); without Grain installed, an empty module stands in while it is
    imported, and is removed right after, so nothing else sees it.
    """
    try:
        import grain  # noqa: F401
    except ImportError:
        sys.modules["grain"] = types.ModuleType("grain")
        try:
            from keras_hub.src.tests.test_case import TestCase
        finally:
            del sys.modules["grain"]
    else:
        from keras_hub.src.tests.test_case import TestCase
    return TestCase


class KerasHubTaskHarnessTest(keras_hub_test_case()):
    """KerasHub's own checks of a task, as its classifiers' tests run them.

    `run_task_test` (predict and fit on raw strings, with and without split
    preprocessing, compilation defaults) is the same for every family but
    costs a dozen compiled steps: it runs on DeBERTaV3 (SentencePiece, the
    longest head). Serialization and `.keras` saving run on all.
    """

    # On TensorFlow the harness is a `tf.test.TestCase`, whose deprecated
    # `test_session` helper pytest would collect and report as skipped.
    test_session = None

    def init_kwargs(self, name):
        family = tiny.FAMILIES[name]
        return {
            "backbone": family.backbone(),
            "num_classes": 2,
            "preprocessor": family.preprocessor(),
        }

    def test_task_basics(self):
        self.run_task_test(
            cls=tiny.FAMILIES["deberta_v3"].classifier,
            init_kwargs=self.init_kwargs("deberta_v3"),
            train_data=(tiny.SENTENCES[:2], tiny.LABELS[:2]),
            expected_output_shape=(2, 2),
        )

    @parameterized.named_parameters(*[(name, name) for name in FAMILIES])
    def test_serialization_and_saving(self, name):
        init_kwargs = self.init_kwargs(name)
        cls = tiny.FAMILIES[name].classifier
        self.run_serialization_test(cls(**init_kwargs))
        x = tiny.token_inputs(init_kwargs["preprocessor"], tiny.SENTENCES)
        self.run_model_saving_test(
            cls=cls, init_kwargs=init_kwargs, input_data=x
        )


@pytest.mark.parametrize("name", FAMILIES)
def test_without_normalization_computes_the_keras_hub_classifier(name):
    family = tiny.FAMILIES[name]
    theirs = family.keras_hub_classifier(family.backbone(), num_classes=3)
    ours = family.classifier(
        family.backbone(), num_classes=3, normalization=None
    )
    assert isinstance(ours, keras_hub.models.TextClassifier)
    assert ours.normalization is None

    def head(model):
        return [
            (layer.name, type(layer))
            for layer in model.layers
            if layer is not model.backbone
        ]

    assert head(ours) == head(theirs)
    ours.set_weights(theirs.get_weights())
    x = tiny.token_inputs(family.preprocessor(), PAIRS)
    np.testing.assert_array_equal(
        to_numpy(ours(x, training=False)), to_numpy(theirs(x, training=False))
    )
    # The same dropout rates: KerasHub's defaults, except RoBERTa-like
    # heads, whose 0.1 is Hugging Face's (KerasHub has 0.0).
    for layer in theirs.layers:
        if isinstance(layer, keras.layers.Dropout):
            rate = ours.get_layer(layer.name).rate
            if name in ("roberta", "roformer_v2", "xlm_roberta"):
                assert (layer.rate, rate) == (0.0, 0.1)
            else:
                assert rate == layer.rate


@pytest.mark.parametrize("name", FAMILIES)
def test_isobn_sits_right_before_the_dropout_and_logits(name):
    family = tiny.FAMILIES[name]
    backbone = family.backbone(dropout=0.0)
    classifier = family.classifier(backbone, num_classes=3, dropout=0.0)
    layer = classifier.normalization
    assert isinstance(layer, keras_isobn.IsoBatchNormalization)
    assert layer is classifier.get_layer("pooled_normalization")

    # The graph: normalization -> dropout -> logits, and before the
    # normalization the head's dense layer, if any.
    activation, dropouts = HEADS[name]
    output_dropout = classifier.get_layer(dropouts[-1])
    assert output_dropout is classifier.output_dropout
    assert classifier.output_dense.name == "logits"
    assert classifier.output_dense.input is output_dropout.output
    assert output_dropout.input is layer.output
    names = [layer.name for layer in classifier.layers]
    expected = [*dropouts[:-1], "pooled_normalization", dropouts[-1], "logits"]
    if activation is not None:
        expected.insert(len(dropouts) - 1, "pooled_dense")
        assert layer.input is classifier.get_layer("pooled_dense").output
    assert names[-len(expected) :] == expected

    # The features entering IsoBN, from the backbone independently.
    x = tiny.token_inputs(family.preprocessor(), PAIRS)
    outputs = backbone(x)
    if activation is None:
        features = to_numpy(outputs["pooled_output"])
    else:
        index = getattr(backbone, "start_token_index", None)
        if index is None:
            index = backbone.cls_token_index
        kernel, bias = map(to_numpy, classifier.pooled_dense.weights)
        first = to_numpy(outputs)[:, index, :]
        features = ACTIVATIONS[activation](first @ kernel + bias)

    classifier(x, training=True)  # Updates the statistics from `features`.
    centred = features - features.mean(axis=0)
    covariance = to_numpy(layer.moving_covariance)
    np.testing.assert_allclose(
        covariance, 0.05 * centred.T @ centred / len(features), atol=1e-6
    )
    scale = isobn_reference_scale(
        covariance, to_numpy(layer.moving_std), degenerate_limit=True
    )
    kernel = to_numpy(classifier.output_dense.kernel)
    bias = to_numpy(classifier.output_dense.bias)
    np.testing.assert_allclose(
        to_numpy(classifier(x, training=False)),
        (features * scale) @ kernel + bias,
        atol=1e-5,
    )


@pytest.mark.parametrize("name", FAMILIES)
def test_fold_and_export_give_the_same_logits(name, tmp_path):
    family = tiny.FAMILIES[name]
    classifier = family.classifier(
        family.backbone(),
        num_classes=3,
        preprocessor=family.preprocessor(),
        normalization="batchnorm" if name == "bert" else "isobn",
    )
    x = tiny.token_inputs(classifier.preprocessor, tiny.SENTENCES)
    for _ in range(3):
        classifier(x, training=True)
    logits = to_numpy(classifier(x, training=False))

    folded = export.fold_normalization(classifier)
    assert type(folded) is type(classifier)
    assert folded.normalization is None
    np.testing.assert_allclose(
        to_numpy(folded(x, training=False)), logits, atol=1e-5
    )

    path = str(tmp_path / "saved_model")
    if BACKEND == "torch":
        with pytest.raises(NotImplementedError, match="KERAS_BACKEND"):
            export.export_saved_model(classifier, path)
        return
    export.export_saved_model(classifier, path)
    reloaded = tf.saved_model.load(path)
    served = reloaded.serve(x)
    np.testing.assert_allclose(served.numpy(), logits, atol=1e-4, rtol=0)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow only")
@pytest.mark.parametrize("name", ["albert", "roberta"])
def test_text_serving_export_of_a_sentencepiece_and_a_bpe_tokenizer(
    name, tmp_path
):
    family = tiny.FAMILIES[name]
    classifier = family.classifier(
        family.backbone(), num_classes=2, preprocessor=family.preprocessor()
    )
    x = tiny.token_inputs(classifier.preprocessor, tiny.SENTENCES)
    classifier(x, training=True)
    path = str(tmp_path / "serving")
    export.export_text_serving(classifier, path)
    reloaded = tf.saved_model.load(path)
    served = reloaded.serve(tf.constant(tiny.SENTENCES))
    np.testing.assert_allclose(
        served.numpy(),
        to_numpy(classifier(x, training=False)),
        atol=1e-4,
        rtol=0,
    )


@pytest.mark.parametrize("name", FAMILIES)
def test_regression_mixed_precision_and_int32_padding_mask(name):
    family = tiny.FAMILIES[name]
    regression = family.classifier(family.backbone(), num_classes=1)
    assert isinstance(regression.loss, keras.losses.MeanSquaredError)
    optimizer = regression.optimizer
    assert float(to_numpy(optimizer.learning_rate)) == pytest.approx(
        1e-5 if name == "albert" else 5e-5
    )

    keras.mixed_precision.set_global_policy("mixed_float16")
    classifier = family.classifier(
        family.backbone(), num_classes=2, preprocessor=family.preprocessor()
    )
    layer = classifier.normalization
    assert layer.dtype_policy.name == "mixed_float16"
    assert classifier.output_dense.dtype_policy.name == "mixed_float16"

    x, _ = classifier.preprocess_samples(PAIRS, y=tiny.LABELS)
    if "padding_mask" in x:  # Not FNet's.
        mask = ops.convert_to_numpy(x["padding_mask"])
        assert mask.dtype == np.int32
        expected = tiny.token_inputs(classifier.preprocessor, PAIRS)
        np.testing.assert_array_equal(mask, expected["padding_mask"])
    classifier(x, training=True)
    assert layer.moving_covariance.dtype == "float32"
    assert layer.moving_scale.dtype == "float32"
    assert np.any(to_numpy(layer.moving_std) > 0.0)
    logits = classifier(x, training=False)
    assert keras.backend.standardize_dtype(logits.dtype) == "float16"
    assert np.isfinite(to_numpy(logits)).all()


@pytest.mark.parametrize("name", FAMILIES)
def test_callback_and_distribution_find_the_normalization(name):
    family = tiny.FAMILIES[name]
    classifier = family.classifier(
        family.backbone(), num_classes=2, preprocessor=family.preprocessor()
    )
    x = tiny.token_inputs(classifier.preprocessor, tiny.SENTENCES)
    callback = keras_isobn.EVkCallback(x, k=2, batch_size=8)
    results = callback.measure(classifier)
    assert sorted(results) == ["ev2_in", "ev2_out"]
    assert all(0.0 < value <= 1.0 for value in results.values())

    if BACKEND == "torch":
        with pytest.raises(ValueError, match="not supported"):
            distribution.synchronize_statistics(classifier)
        return
    layers = distribution.synchronize_statistics(classifier)
    if BACKEND == "tensorflow":
        assert layers == [classifier.normalization]
        assert classifier.normalization.synchronized
        config = classifier.get_config()["normalization"]["config"]
        assert config["synchronized"] is True
    else:
        assert layers == []


@pytest.mark.parametrize("name", FAMILIES)
def test_from_preset_of_the_base_class_picks_the_family(name, tmp_path):
    family = tiny.FAMILIES[name]
    classifier = family.classifier(
        family.backbone(),
        num_classes=2,
        preprocessor=family.preprocessor(),
        normalization=keras_isobn.IsoBatchNormalization(beta=0.75),
    )
    x = tiny.token_inputs(classifier.preprocessor, tiny.SENTENCES)
    for _ in range(2):
        classifier(x, training=True)
    classifier.save_to_preset(tmp_path / "preset")

    restored = models.IsoBNTextClassifier.from_preset(str(tmp_path / "preset"))
    assert type(restored) is family.classifier
    assert restored.normalization.beta == 0.75
    np.testing.assert_array_equal(
        to_numpy(restored(x, training=False)),
        to_numpy(classifier(x, training=False)),
    )
    reprocessed = tiny.token_inputs(restored.preprocessor, PAIRS)
    for key, value in tiny.token_inputs(classifier.preprocessor, PAIRS).items():
        np.testing.assert_array_equal(reprocessed[key], value)

    # A new head: the backbone's weights, this head's settings.
    built = models.text_classifier_from_preset(
        str(tmp_path / "preset"),
        num_classes=3,
        sequence_length=8,
        normalization="batchnorm",
        momentum=0.1,
        dropout=0.3,
    )
    assert type(built) is family.classifier
    assert built.normalization.momentum == pytest.approx(0.9)
    assert built.dropout == 0.3
    for saved, loaded in zip(
        classifier.backbone.weights, built.backbone.weights
    ):
        np.testing.assert_array_equal(to_numpy(saved), to_numpy(loaded))
    short = tiny.token_inputs(built.preprocessor, PAIRS)
    assert short["token_ids"].shape == (8, 8)
    assert tuple(built(short).shape) == (8, 3)


def test_another_backbone_is_rejected_with_the_supported_families(tmp_path):
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=10,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=8,
    )
    backbone.save_to_preset(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="GPT2Backbone") as info:
        models.text_classifier_from_preset(str(tmp_path / "gpt2"), 2)
    for cls in models.TEXT_CLASSIFIERS:
        assert cls.backbone_cls.__name__ in str(info.value)
    with pytest.raises(ValueError, match="GPT2Backbone"):
        models.IsoBNTextClassifier.from_preset(
            str(tmp_path / "gpt2"), num_classes=2
        )


def test_every_keras_hub_text_classifier_has_a_class():
    theirs = {
        getattr(keras_hub.models, name).backbone_cls
        for name in dir(keras_hub.models)
        if name.endswith("TextClassifier") and name != "TextClassifier"
    }
    ours = {cls.backbone_cls for cls in models.TEXT_CLASSIFIERS}
    assert ours == theirs
    for cls in models.TEXT_CLASSIFIERS:
        assert issubclass(cls, models.IsoBNTextClassifier)
        registered = keras.saving.get_registered_name(cls)
        assert registered == f"keras_isobn>{cls.__name__}"
        assert (
            cls.__name__
            == "IsoBN"
            + getattr(keras_hub.models, cls.__name__[len("IsoBN") :]).__name__
        )
        assert models.text_classifier_class(cls.backbone_cls) is cls
