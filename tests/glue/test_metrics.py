import math
import warnings

import numpy as np
import pytest

from keras_isobn.glue import TASKS
from keras_isobn.glue import compute_metrics


def _logits(classes, num_classes=2):
    """Scores whose argmax is `classes`, not one-hot (noise on every class)."""
    rng = np.random.default_rng(0)
    scores = rng.uniform(-1.0, 1.0, size=(len(classes), num_classes))
    scores[np.arange(len(classes)), classes] = 2.0
    return scores.astype("float32")


def test_cola_matthews_correlation_by_hand():
    labels = [1, 1, 1, 0, 0, 0, 1, 0]
    predicted = [1, 1, 0, 0, 0, 1, 1, 0]
    # TP = 3, FN = 1, TN = 3, FP = 1.
    tp, fn, tn, fp = 3, 1, 3, 1
    expected = (tp * tn - fp * fn) / math.sqrt(
        (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)
    )
    assert expected == 0.5
    result = compute_metrics("cola", labels, _logits(predicted))
    assert result == {"mcc": pytest.approx(expected, abs=1e-12)}


def test_mrpc_f1_and_accuracy_by_hand():
    labels = [1, 1, 1, 1, 0, 0]
    predicted = [1, 1, 0, 1, 1, 0]
    # TP = 3, FN = 1, FP = 1, TN = 1: precision = recall = 3/4.
    precision, recall = 3 / 4, 3 / 4
    result = compute_metrics("mrpc", labels, _logits(predicted))
    assert list(result) == ["f1", "accuracy"]
    assert result["f1"] == pytest.approx(
        2 * precision * recall / (precision + recall), abs=1e-12
    )
    assert result["accuracy"] == pytest.approx(4 / 6, abs=1e-12)


def test_qqp_f1_is_for_the_duplicate_class():
    # All predicted duplicate: precision 2/5, recall 1, F1 = 4/7.
    labels = [1, 1, 0, 0, 0]
    result = compute_metrics("qqp", labels, _logits([1, 1, 1, 1, 1]))
    assert result["f1"] == pytest.approx(2 * 0.4 / 1.4, abs=1e-12)
    assert result["accuracy"] == pytest.approx(0.4, abs=1e-12)


def test_f1_without_positives_is_zero():
    result = compute_metrics("mrpc", [0, 0, 1], _logits([0, 0, 0]))
    assert result["f1"] == 0.0
    assert result["accuracy"] == pytest.approx(2 / 3, abs=1e-12)


def test_stsb_pearson_and_spearman_by_hand():
    labels = np.array([1.0, 2.0, 3.0, 4.0, 5.0], dtype="float32")
    scores = np.array([0.5, 2.5, 2.0, 4.0, 6.0], dtype="float32")
    # Pearson: deviations (-2, -1, 0, 1, 2) and (-2.5, -0.5, -1, 1, 3).
    pearson = 12.5 / math.sqrt(10.0 * 17.5)
    # Spearman: ranks (1, 2, 3, 4, 5) and (1, 3, 2, 4, 5), sum d^2 = 2.
    spearman = 1 - 6 * 2 / (5 * (5**2 - 1))
    for predictions in (scores, scores[:, None]):
        result = compute_metrics("stsb", labels, predictions)
        assert list(result) == ["pearson", "spearman"]
        assert result["pearson"] == pytest.approx(pearson, abs=1e-6)
        assert result["spearman"] == pytest.approx(spearman, abs=1e-12)


def test_mnli_accuracy_from_three_class_logits():
    labels = [0, 1, 2, 2, 1, 0, 2]
    predicted = [0, 1, 1, 2, 1, 2, 2]
    result = compute_metrics("mnli", labels, _logits(predicted, 3))
    assert result == {"accuracy": pytest.approx(5 / 7, abs=1e-12)}


def test_probabilities_and_logits_give_the_same_classes():
    logits = _logits([1, 0, 1, 1, 0, 0])
    probabilities = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    labels = [1, 0, 0, 1, 1, 0]
    assert compute_metrics("sst2", labels, logits) == compute_metrics(
        "sst2", labels, probabilities
    )


@pytest.mark.parametrize("name", sorted(TASKS))
def test_keys_are_the_task_metric_names_as_python_floats(name):
    task = TASKS[name]
    labels = np.array([0, 1, 1, 0, 1, 0], dtype="int32")
    if task.is_regression:
        predictions = np.array([0.1, 0.9, 0.7, 0.3, 0.8, 0.2])
    else:
        predictions = _logits([0, 1, 0, 0, 1, 1], task.num_classes)
    result = compute_metrics(name, labels, predictions)
    assert tuple(result) == task.metric_names
    assert task.primary_metric in result
    assert all(type(value) is float for value in result.values())


def test_constant_regression_predictions_give_nan():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = compute_metrics("stsb", [1.0, 2.0, 3.0], [2.0, 2.0, 2.0])
    assert math.isnan(result["pearson"]) and math.isnan(result["spearman"])


@pytest.mark.parametrize(
    "task, predictions",
    [
        ("sst2", np.zeros((4,))),
        ("sst2", np.zeros((4, 3))),
        ("sst2", np.zeros((3, 2))),
        ("mnli", np.zeros((4, 2))),
        ("stsb", np.zeros((4, 2))),
        ("stsb", np.zeros((5,))),
    ],
)
def test_prediction_shape_errors(task, predictions):
    with pytest.raises(ValueError, match="predictions.shape="):
        compute_metrics(task, [0, 1, 1, 0], predictions)


@pytest.mark.parametrize("labels", [[0, 1, 2], [0, -1, 1], [0.5, 1, 0]])
def test_labels_must_be_class_ids(labels):
    with pytest.raises(ValueError, match="class ids from 0 to 1"):
        compute_metrics("rte", labels, np.zeros((3, 2)))


@pytest.mark.parametrize("labels", [[], [[0, 1]]])
def test_labels_must_be_a_non_empty_vector(labels):
    with pytest.raises(ValueError, match="non-empty 1-D"):
        compute_metrics("cola", labels, np.zeros((1, 2)))


def test_unknown_task():
    with pytest.raises(ValueError, match="Unknown GLUE task"):
        compute_metrics("imdb", [0], np.zeros((1, 2)))


def test_metric_fn_is_compute_metrics_for_its_task():
    from keras_isobn.glue import metric_fn

    labels, scores = [1, 0, 1, 1], _logits([1, 0, 0, 1])
    for name in ("mrpc", TASKS["mrpc"]):
        fn = metric_fn(name)
        assert fn(labels, scores) == compute_metrics("mrpc", labels, scores)
    regression = metric_fn("stsb")
    assert sorted(regression([0.0, 1.0, 3.0], [0.1, 0.9, 3.2])) == [
        "pearson",
        "spearman",
    ]
