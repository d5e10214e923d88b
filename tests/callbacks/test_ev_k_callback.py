import csv
import types

import keras
import keras_hub
import numpy as np
import pytest

from keras_isobn.callbacks import EVkCallback
from tests.helpers.probe_models import SEQUENCE_LENGTH
from tests.helpers.probe_models import independent_ev
from tests.helpers.probe_models import isobn_classifier
from tests.helpers.probe_models import token_inputs
from tests.helpers.tiny_models import BERT_VOCABULARY
from tests.helpers.tiny_models import bert_backbone


def _weights(model):
    return [np.array(keras.ops.convert_to_numpy(v)) for v in model.variables]


class _Snapshot(keras.callbacks.Callback):
    """Checks that the callbacks between two of these change no variable."""

    def __init__(self, reference=None):
        super().__init__()
        self.reference = reference
        self.values = None
        self.checks = 0

    def _visit(self):
        if hasattr(self.model, "jax_state_sync"):
            self.model.jax_state_sync()
        self.values = _weights(self.model)
        if self.reference is not None:
            for before, after in zip(self.reference.values, self.values):
                np.testing.assert_array_equal(before, after)
            self.checks += 1

    def on_train_batch_end(self, batch, logs=None):
        self._visit()

    def on_epoch_end(self, epoch, logs=None):
        self._visit()


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """Two epochs of `fit` with EV_k measured every 2 of 4 batches."""
    keras.utils.set_random_seed(7)
    rng = np.random.default_rng(7)
    model = isobn_classifier()
    inputs = token_inputs(rng)
    labels = rng.integers(0, 2, size=32)
    callback = EVkCallback(inputs, k=[1, 3], every_n_batches=2, batch_size=8)
    batch_logs = []
    spy = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: batch_logs.append(dict(logs))
    )
    csv_path = str(tmp_path_factory.mktemp("csv") / "log.csv")
    history = model.fit(
        inputs,
        labels,
        epochs=2,
        batch_size=8,
        shuffle=False,
        callbacks=[callback, keras.callbacks.CSVLogger(csv_path), spy],
        verbose=0,
    )
    with open(csv_path) as file:
        rows = list(csv.DictReader(file))
    return types.SimpleNamespace(
        model=model,
        inputs=inputs,
        labels=labels,
        callback=callback,
        recorded={key: list(value) for key, value in callback.history.items()},
        history=history.history,
        batch_logs=batch_logs,
        csv_rows=rows,
    )


def test_fit_records_ev_in_history_and_csv(fitted):
    keys = ["ev1_in", "ev1_out", "ev3_in", "ev3_out"]
    assert sorted(fitted.callback.keys) == keys
    for key in keys:
        values = fitted.history[key]
        assert len(values) == 2
        assert all(type(v) is float and 0.0 < v <= 1.0 for v in values)
        np.testing.assert_allclose(
            [float(row[key]) for row in fitted.csv_rows], values, rtol=1e-12
        )
    for side in ("in", "out"):
        ev1, ev3 = fitted.history[f"ev1_{side}"], fitted.history[f"ev3_{side}"]
        assert all(a <= b for a, b in zip(ev1, ev3))


def test_batch_measurements_are_logged_and_match_epoch_end(fitted):
    logs = fitted.batch_logs
    assert [("ev3_out" in entry) for entry in logs] == [False, True] * 4
    # The start, after batches 2 and 4 of each epoch (the epoch end reuses
    # the measurement after the last batch: nothing changed in between).
    assert fitted.recorded["epoch"] == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert logs[3]["ev3_out"] == fitted.history["ev3_out"][0]
    assert logs[7]["ev3_out"] == fitted.history["ev3_out"][1]
    assert fitted.recorded["ev3_out"][2::2] == fitted.history["ev3_out"]
    assert len(set(fitted.recorded["ev3_out"])) == 5
    # Before training, IsoBN (not fitted yet) is the identity.
    assert fitted.recorded["ev3_in"][0] == fitted.recorded["ev3_out"][0]


def test_last_values_are_those_of_the_trained_model(fitted):
    isobn = fitted.model.get_layer("isobn")
    features = keras.Model(fitted.model.input, [isobn.input, isobn.output])
    outputs = features.predict(fitted.inputs, verbose=0)
    for k in (1, 3):
        for side, embeddings in zip(("in", "out"), outputs):
            got = fitted.history[f"ev{k}_{side}"][-1]
            assert abs(got - independent_ev(embeddings, k)) < 1e-5
    assert fitted.history["ev3_out"][-1] != fitted.history["ev3_in"][-1]


def test_probe_changes_no_weight_or_statistic(fitted):
    model, callback = fitted.model, fitted.callback
    isobn = model.get_layer("isobn")
    assert np.any(keras.ops.convert_to_numpy(isobn.moving_covariance) != 0)
    before = _weights(model)
    callback.measure(model)
    for old, new in zip(before, _weights(model)):
        np.testing.assert_array_equal(old, new)

    # Inside fit, around every batch-level and epoch-level measurement.
    callback.every_n_batches = 1
    first = _Snapshot()
    second = _Snapshot(reference=first)
    model.fit(
        fitted.inputs,
        fitted.labels,
        epochs=1,
        batch_size=8,
        callbacks=[first, callback, second],
        verbose=0,
    )
    assert second.checks == 4 + 1
    assert len(callback.history["epoch"]) == len(fitted.recorded["epoch"]) + 4


def test_batch_size_that_does_not_divide_the_data(fitted):
    # 32 examples in batches of 5 (the last one padded, its padding dropped)
    # give the values of one batch of 32, those of the unpadded embeddings.
    model = fitted.model
    padded = EVkCallback(fitted.inputs, k=(1, 3), batch_size=5).measure(model)
    whole = EVkCallback(fitted.inputs, k=(1, 3), batch_size=32).measure(model)
    assert padded.keys() == whole.keys()
    for key, value in whole.items():
        assert padded[key] == pytest.approx(value, abs=1e-6), key


def test_every_two_epochs():
    callback = EVkCallback(np.zeros((4, 2)), every=2)
    callback.measure = lambda model=None: {"ev3_in": 0.5, "ev3_out": 0.25}
    logs = [{} for _ in range(4)]
    for epoch, epoch_logs in enumerate(logs):
        callback.on_epoch_end(epoch, epoch_logs)
    assert logs == [{}, {"ev3_in": 0.5, "ev3_out": 0.25}] * 2
    assert callback.history["epoch"] == [2.0, 4.0]


def test_layer_nested_in_a_keras_hub_backbone_with_raw_strings():
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=BERT_VOCABULARY)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        tokenizer, sequence_length=SEQUENCE_LENGTH
    )
    classifier = keras_hub.models.BertTextClassifier(
        bert_backbone(), num_classes=2, preprocessor=preprocessor
    )
    words = BERT_VOCABULARY[5:]
    sentences = [
        " ".join(words[(i * j) % len(words)] for j in range(1 + i % 6))
        for i in range(24)
    ]
    callback = EVkCallback(sentences, layer="transformer_layer_0", batch_size=8)
    values = callback.measure(classifier)

    # Independently: the transformer's input is the embeddings' layer norm
    # (dropout is off in inference) and, with one layer, its output is the
    # sequence output; padded positions are left out.
    backbone = classifier.backbone
    features = keras.Model(
        backbone.input,
        [
            backbone.get_layer("embeddings_layer_norm").output,
            backbone.output["sequence_output"],
        ],
    )
    inputs = keras.tree.map_structure(
        keras.ops.convert_to_numpy, preprocessor(sentences)
    )
    embeddings_in, embeddings_out = keras.tree.map_structure(
        keras.ops.convert_to_numpy, features(inputs, training=False)
    )
    mask = inputs["padding_mask"].astype(bool)
    assert not mask.all()
    assert abs(values["ev3_in"] - independent_ev(embeddings_in[mask], 3)) < 1e-5
    assert abs(values["ev3_out"] - independent_ev(embeddings_out[mask], 3)) < 1e-5

    # A tf.data.Dataset of (strings, labels) batches: the same probe.
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices(
        (sentences, np.arange(24) % 2)
    ).batch(5)
    callback.data = dataset
    from_dataset = callback.measure(classifier)
    for key in values:
        assert abs(from_dataset[key] - values[key]) < 1e-6

    # Sentence pairs through the preprocessor, the head's Dense layer.
    pairs = EVkCallback((sentences, sentences[::-1]), k=1, layer="logits")
    pair_values = pairs.measure(classifier)
    assert set(pair_values) == {"ev1_in", "ev1_out"}
    assert all(0.0 < value <= 1.0 for value in pair_values.values())


def test_clear_errors(rng):
    inputs = token_inputs(rng, samples=8)
    backbone = bert_backbone()
    plain = keras.Model(
        backbone.input, keras.layers.Dense(2)(backbone.output["pooled_output"])
    )
    with pytest.raises(ValueError, match="no IsoBatchNormalization layer"):
        EVkCallback(inputs).measure(plain)
    with pytest.raises(ValueError, match="no layer named 'missing'"):
        EVkCallback(inputs, layer="missing").measure(plain)
    with pytest.raises(ValueError, match="no `preprocessor`"):
        EVkCallback(["a cat", "a dog"], layer="pooled_dense").measure(plain)
    with pytest.raises(ValueError, match=r"\[1, 2\]"):
        EVkCallback(inputs, k=3, layer=plain.layers[-1]).measure(plain)
    with pytest.raises(ValueError, match="No model to probe"):
        EVkCallback(inputs).measure()
    for kwargs, match in [
        ({"k": 0}, "`k`"),
        ({"k": [3, 1.5]}, "`k`"),
        ({"every": 0}, "`every`"),
        ({"every_n_batches": 0}, "`every_n_batches`"),
        ({"batch_size": 0}, "`batch_size`"),
        ({"layer": 3}, "`layer`"),
    ]:
        with pytest.raises(ValueError, match=match):
            EVkCallback(inputs, **kwargs)
