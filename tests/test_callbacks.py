import csv
import types

import keras
import keras_hub
import numpy as np
import pytest

from keras_isobn import IsoBatchNormalization
from keras_isobn.callbacks import EVkCallback

from tests.models.tiny import BERT_VOCABULARY as VOCABULARY
from tests.models.tiny import bert_backbone as _backbone

SEQUENCE_LENGTH = 8


def _isobn_classifier():
    """A tiny BERT with IsoBN, BatchNormalization and Dropout in its head."""
    backbone = _backbone()
    inputs = backbone.input
    x = backbone(inputs)["pooled_output"]
    x = IsoBatchNormalization(name="isobn")(x)
    x = keras.layers.BatchNormalization(name="batchnorm")(x)
    x = keras.layers.Dropout(0.1)(x)
    outputs = keras.layers.Dense(2, name="logits")(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def _token_inputs(rng, samples=32):
    lengths = rng.integers(3, SEQUENCE_LENGTH + 1, size=samples)
    padding_mask = np.arange(SEQUENCE_LENGTH) < lengths[:, None]
    token_ids = rng.integers(5, len(VOCABULARY), size=padding_mask.shape)
    return {
        "token_ids": np.where(padding_mask, token_ids, 0).astype("int32"),
        "segment_ids": np.zeros(padding_mask.shape, "int32"),
        "padding_mask": padding_mask,
    }


def _ev(x, k):
    """EV_k from the eigenvalues of the float64 covariance (independent)."""
    eigenvalues = np.sort(np.linalg.eigvalsh(np.cov(np.float64(x).T)))[::-1]
    return eigenvalues[:k].sum() / eigenvalues.sum()


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
    model = _isobn_classifier()
    inputs = _token_inputs(rng)
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
            assert abs(got - _ev(embeddings, k)) < 1e-5
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
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=VOCABULARY)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        tokenizer, sequence_length=SEQUENCE_LENGTH
    )
    classifier = keras_hub.models.BertTextClassifier(
        _backbone(), num_classes=2, preprocessor=preprocessor
    )
    words = VOCABULARY[5:]
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
    assert abs(values["ev3_in"] - _ev(embeddings_in[mask], 3)) < 1e-5
    assert abs(values["ev3_out"] - _ev(embeddings_out[mask], 3)) < 1e-5

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
    inputs = _token_inputs(rng, samples=8)
    backbone = _backbone()
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


# WholeSetMetrics


def _regressor():
    keras.utils.set_random_seed(4)
    inputs = {
        "a": keras.Input((3,), name="a"),
        "b": keras.Input((2,), name="b"),
    }
    x = keras.layers.Concatenate()([inputs["a"], inputs["b"]])
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Dropout(0.5)(x)
    model = keras.Model(inputs, keras.layers.Dense(1)(x))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def _regression_data(rows=11):
    rng = np.random.default_rng(2)
    x = {
        "a": rng.normal(size=(rows, 3)).astype("float32"),
        "b": rng.normal(size=(rows, 2)).astype("float32"),
    }
    y = x["a"][:, 0] - x["b"][:, 1]
    return x, y


def _whole_set_scores(y, predictions):
    predictions = np.asarray(predictions)[:, 0]
    return {
        "pearson": float(np.corrcoef(y, predictions)[0, 1]),
        "sse": float(np.sum((predictions - y) ** 2)),
        "rows": len(predictions),
    }


def test_whole_set_metrics_use_every_row_once():
    from keras_isobn.callbacks import WholeSetMetrics

    model = _regressor()
    x, y = _regression_data(rows=11)
    model.fit(x, y, epochs=2, batch_size=4, verbose=0)  # Moves the stats.
    callback = WholeSetMetrics(x, y, _whole_set_scores, batch_size=4)
    scores = callback.evaluate(model)
    assert sorted(scores) == ["val_pearson", "val_rows", "val_sse"]
    assert scores["val_rows"] == 11
    predictions = model.predict(x, batch_size=11, verbose=0)
    want = _whole_set_scores(y, predictions)
    assert scores["val_pearson"] == pytest.approx(want["pearson"], abs=1e-6)
    assert scores["val_sse"] == pytest.approx(want["sse"], rel=1e-5)
    assert callback.predictions.shape == (11, 1)
    assert callback.predictions.dtype == np.float32
    np.testing.assert_allclose(callback.predictions, predictions, atol=1e-6)
    # The inputs given are left as they were (11 rows, not 12).
    assert len(x["a"]) == 11


def test_whole_set_metrics_in_fit_logs():
    from keras_isobn.callbacks import WholeSetMetrics

    model = _regressor()
    x, y = _regression_data(rows=10)
    callback = WholeSetMetrics(
        x, y, _whole_set_scores, batch_size=3, prefix="dev_"
    )
    seen = []
    spy = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: seen.append(
            (dict(logs), _whole_set_scores(y, model.predict(x, verbose=0)))
        )
    )
    history = model.fit(
        x, y, epochs=2, batch_size=5, callbacks=[callback, spy], verbose=0
    )
    assert history.history["dev_rows"] == [10, 10]
    assert len(history.history["dev_pearson"]) == 2
    for logs, want in seen:
        # The callbacks after it see the metrics of the model of that epoch.
        assert logs["dev_sse"] == pytest.approx(want["sse"], rel=1e-5)
        assert logs["dev_pearson"] == pytest.approx(want["pearson"], abs=1e-6)
    assert seen[0][0]["dev_sse"] != seen[1][0]["dev_sse"]


def test_whole_set_metrics_bad_batch_size():
    from keras_isobn.callbacks import WholeSetMetrics

    x, y = _regression_data(rows=4)
    for batch_size in (0, -2, 2.0, True, None, "8"):
        with pytest.raises(ValueError, match="`batch_size`"):
            WholeSetMetrics(x, y, _whole_set_scores, batch_size=batch_size)
    # A batch larger than the set is one padded batch.
    callback = WholeSetMetrics(x, y, _whole_set_scores, batch_size=7)
    assert callback.evaluate(_regressor())["val_rows"] == 4


def test_whole_set_metrics_numpy_integer_batch_size():
    from keras_isobn.callbacks import WholeSetMetrics

    x, y = _regression_data(rows=5)
    callback = WholeSetMetrics(x, y, _whole_set_scores, batch_size=np.int64(2))
    assert callback.evaluate(_regressor())["val_rows"] == 5


def _trained_isobn_classifier(rng):
    model = _isobn_classifier()
    x = _token_inputs(rng, samples=48)
    y = rng.integers(0, 2, size=48)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)  # Moves the stats.
    return model


def _accuracy(y, logits):
    return {"accuracy": float(np.mean(np.argmax(logits, -1) == y))}


def test_whole_set_metrics_trimmed_and_with_ev_k_match_untrimmed(rng):
    from keras_isobn.callbacks import WholeSetMetrics

    model = _trained_isobn_classifier(rng)
    # 37 examples of lengths 3 to 8: 5 batches of 8, in 3 cut lengths.
    x = _token_inputs(rng, samples=37)
    y = rng.integers(0, 2, size=37)
    plain = WholeSetMetrics(x, y, _accuracy, batch_size=8)
    fast = WholeSetMetrics(
        x, y, _accuracy, batch_size=8, trim_padding=2, ev_k=[1, 3]
    )
    expected = plain.evaluate(model)
    logs = fast.evaluate(model)
    # The same predictions, row for row, from batches cut to their length.
    np.testing.assert_allclose(
        fast.predictions, plain.predictions, rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(
        fast.predictions,
        model.predict(x, batch_size=37, verbose=0),
        rtol=1e-4,
        atol=1e-5,
    )
    assert logs["val_accuracy"] == expected["val_accuracy"]
    # EV_k from the same pass: that of EVkCallback, and of an independent
    # computation on the IsoBN layer's inputs and outputs.
    assert sorted(logs) == [
        "ev1_in", "ev1_out", "ev3_in", "ev3_out", "val_accuracy",
    ]  # fmt: skip
    reference = EVkCallback(x, k=[1, 3], batch_size=8).measure(model)
    for key, value in reference.items():
        assert logs[key] == pytest.approx(value, abs=1e-4), key
    layer = model.get_layer("isobn")
    probe = keras.Model(model.input, [layer.input, layer.output])
    inside, outside = probe.predict(x, batch_size=37, verbose=0)
    assert logs["ev3_in"] == pytest.approx(_ev(inside, 3), abs=1e-4)
    assert logs["ev3_out"] == pytest.approx(_ev(outside, 3), abs=1e-4)


def test_whole_set_metrics_trims_only_padding(rng):
    from keras_isobn.callbacks import _predict

    seen = []

    class Recorder:
        def predict_on_batch(self, x):
            seen.append(x["token_ids"].shape)
            # Each batch is cut to its own longest row, rounded up to 4.
            kept = np.flatnonzero(np.asarray(x["padding_mask"]).any(axis=0))
            assert x["token_ids"].shape[1] == -(-(kept[-1] + 1) // 4) * 4
            return np.asarray(x["token_ids"][:, :1], "float32")

    x = _token_inputs(rng, samples=20)
    x["token_ids"][:, 0] = np.arange(20)  # Identifies each row.
    out = _predict(Recorder(), x, batch_size=4, trim=4)
    # Rows come back in their order; no batch cuts a kept position.
    np.testing.assert_array_equal(out[:, 0], np.arange(20))
    lengths = x["padding_mask"].sum(axis=1)
    assert sum(shape[0] for shape in seen) == 20
    assert all(shape[1] in (4, 8) for shape in seen)
    assert max(shape[1] for shape in seen) == -(-lengths.max() // 4) * 4


def test_whole_set_metrics_bad_ev_and_trim_arguments():
    from keras_isobn.callbacks import WholeSetMetrics

    x, y = _regression_data(rows=4)
    with pytest.raises(ValueError, match="`trim_padding`"):
        WholeSetMetrics(x, y, _whole_set_scores, trim_padding=0)
    with pytest.raises(ValueError, match="`ev_k`"):
        WholeSetMetrics(x, y, _whole_set_scores, ev_k=0)
    # A model without IsoBN and no `ev_layer`: the EVkCallback message.
    callback = WholeSetMetrics(x, y, _whole_set_scores, ev_k=3)
    with pytest.raises(ValueError, match="no IsoBatchNormalization"):
        callback.evaluate(_regressor())
