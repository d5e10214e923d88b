"""The GLUE dev-set metrics, computed on a whole split at once."""

import functools

import numpy as np

from keras_isobn.glue.tasks import get_task

__all__ = ["compute_metrics", "metric_fn"]


def compute_metrics(task, labels, predictions):
    """Computes a GLUE task's metrics on a whole evaluation split.

    The metrics are those of GLUE, on all the examples at once (not averaged
    over batches): Matthews correlation for CoLA (`"mcc"`), Pearson and
    Spearman correlations for STS-B (`"pearson"`, `"spearman"`), F1 of the
    positive class (`"f1"`, class 1: equivalent / duplicate) and accuracy
    for MRPC and QQP, accuracy for the other tasks. The keys returned are
    `task.metric_names`; `task.primary_metric` is the one to select a
    model by.

    A correlation is NaN when the predictions (or the labels) are all
    equal; F1 is `0.0` when no example is predicted or labelled positive.

    Args:
        task: String or `GlueTask`.
        labels: Array-like of shape `(n,)`: class ids, or float scores for
            STS-B (as in `GlueSplit.labels`).
        predictions: Array-like of model outputs. For classification, scores
            (logits or probabilities) of shape `(n, num_classes)`; the class
            is their argmax. For regression, scores of shape `(n,)` or
            `(n, 1)`.

    Returns:
        A dict of metric name to Python `float`.

    Example:

    >>> compute_metrics("mrpc", [1, 0, 1], [[0.1, 2.0], [1.0, 0.0], [3., 1.]])
    {'f1': 0.6666666666666666, 'accuracy': 0.6666666666666666}
    """
    from scipy import stats
    from sklearn import metrics

    task = get_task(task)
    labels = np.asarray(labels)
    predictions = np.asarray(predictions)
    if labels.ndim != 1 or len(labels) == 0:
        raise ValueError(
            "`labels` must be a non-empty 1-D array. "
            f"Received: labels.shape={labels.shape}"
        )
    num_examples = len(labels)
    if task.is_regression:
        if predictions.shape not in ((num_examples,), (num_examples, 1)):
            raise ValueError(
                f"{task.name} is a regression task: `predictions` must have "
                f"shape ({num_examples},) or ({num_examples}, 1), one score "
                f"per label. Received: predictions.shape={predictions.shape}"
            )
        scores = predictions.reshape(-1).astype("float64")
        labels = labels.astype("float64")
        metric_fns = {
            "pearson": lambda: stats.pearsonr(labels, scores).statistic,
            "spearman": lambda: stats.spearmanr(labels, scores).statistic,
        }
    else:
        if predictions.shape != (num_examples, task.num_classes):
            raise ValueError(
                f"`predictions` must hold {task.num_classes} class scores "
                f"per label for {task.name}: shape ({num_examples}, "
                f"{task.num_classes}). Received: "
                f"predictions.shape={predictions.shape}"
            )
        if not np.all(np.isin(labels, np.arange(task.num_classes))):
            raise ValueError(
                f"`labels` must be class ids from 0 to "
                f"{task.num_classes - 1} for {task.name}. Received values: "
                f"{np.unique(labels)[:10].tolist()}"
            )
        labels = labels.astype("int64")
        classes = np.argmax(predictions, axis=-1)
        metric_fns = {
            "mcc": lambda: metrics.matthews_corrcoef(labels, classes),
            "f1": lambda: metrics.f1_score(labels, classes, zero_division=0.0),
            "accuracy": lambda: metrics.accuracy_score(labels, classes),
        }
    return {name: float(metric_fns[name]()) for name in task.metric_names}


def metric_fn(task):
    """The metric function of a GLUE task, as `WholeSetMetrics` takes it.

    Args:
        task: String or `GlueTask`.

    Returns:
        A function `fn(labels, predictions)` returning
        `compute_metrics(task, labels, predictions)`: a dict of metric name
        to Python `float`.

    Example:

    >>> fn = metric_fn("mrpc")
    >>> fn([1, 0, 1], [[0.1, 2.0], [1.0, 0.0], [3., 1.]])
    {'f1': 0.6666666666666666, 'accuracy': 0.6666666666666666}

    ```python
    dev = keras_isobn.callbacks.WholeSetMetrics(
        dev_inputs, dev_split.labels, glue.metric_fn("mrpc"), trim_padding=8
    )
    model.fit(..., callbacks=[dev])  # val_f1, val_accuracy
    ```
    """
    return functools.partial(compute_metrics, get_task(task))
