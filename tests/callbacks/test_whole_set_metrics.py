import keras
import numpy as np
import pytest

from keras_isobn.callbacks import EVkCallback
from keras_isobn.callbacks import WholeSetMetrics
from keras_isobn.callbacks.prediction import predict
from tests.helpers.probe_models import independent_ev
from tests.helpers.probe_models import isobn_classifier
from tests.helpers.probe_models import token_inputs


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
    x, y = _regression_data(rows=4)
    for batch_size in (0, -2, 2.0, True, None, "8"):
        with pytest.raises(ValueError, match="`batch_size`"):
            WholeSetMetrics(x, y, _whole_set_scores, batch_size=batch_size)
    # A batch larger than the set is one padded batch.
    callback = WholeSetMetrics(x, y, _whole_set_scores, batch_size=7)
    assert callback.evaluate(_regressor())["val_rows"] == 4


def test_whole_set_metrics_numpy_integer_batch_size():
    x, y = _regression_data(rows=5)
    callback = WholeSetMetrics(x, y, _whole_set_scores, batch_size=np.int64(2))
    assert callback.evaluate(_regressor())["val_rows"] == 5


def _trained_isobn_classifier(rng):
    model = isobn_classifier()
    x = token_inputs(rng, samples=48)
    y = rng.integers(0, 2, size=48)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)  # Moves the stats.
    return model


def _accuracy(y, logits):
    return {"accuracy": float(np.mean(np.argmax(logits, -1) == y))}


def test_whole_set_metrics_trimmed_and_with_ev_k_match_untrimmed(rng):
    model = _trained_isobn_classifier(rng)
    # 37 examples of lengths 3 to 8: 5 batches of 8, in 3 cut lengths.
    x = token_inputs(rng, samples=37)
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
    assert logs["ev3_in"] == pytest.approx(independent_ev(inside, 3), abs=1e-4)
    assert logs["ev3_out"] == pytest.approx(independent_ev(outside, 3), abs=1e-4)


def test_whole_set_metrics_trims_only_padding(rng):
    seen = []

    class Recorder:
        def predict_on_batch(self, x):
            seen.append(x["token_ids"].shape)
            # Each batch is cut to its own longest row, rounded up to 4.
            kept = np.flatnonzero(np.asarray(x["padding_mask"]).any(axis=0))
            assert x["token_ids"].shape[1] == -(-(kept[-1] + 1) // 4) * 4
            return np.asarray(x["token_ids"][:, :1], "float32")

    x = token_inputs(rng, samples=20)
    x["token_ids"][:, 0] = np.arange(20)  # Identifies each row.
    out = predict(Recorder(), x, batch_size=4, trim=4)
    # Rows come back in their order; no batch cuts a kept position.
    np.testing.assert_array_equal(out[:, 0], np.arange(20))
    lengths = x["padding_mask"].sum(axis=1)
    assert sum(shape[0] for shape in seen) == 20
    assert all(shape[1] in (4, 8) for shape in seen)
    assert max(shape[1] for shape in seen) == -(-lengths.max() // 4) * 4


def test_whole_set_metrics_bad_ev_and_trim_arguments():
    x, y = _regression_data(rows=4)
    with pytest.raises(ValueError, match="`trim_padding`"):
        WholeSetMetrics(x, y, _whole_set_scores, trim_padding=0)
    with pytest.raises(ValueError, match="`ev_k`"):
        WholeSetMetrics(x, y, _whole_set_scores, ev_k=0)
    # A model without IsoBN and no `ev_layer`: the EVkCallback message.
    callback = WholeSetMetrics(x, y, _whole_set_scores, ev_k=3)
    with pytest.raises(ValueError, match="no IsoBatchNormalization"):
        callback.evaluate(_regressor())
