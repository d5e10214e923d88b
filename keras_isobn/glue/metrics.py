"""The GLUE dev-set metrics, computed on a whole split at once."""

import functools

import numpy as np

from keras_isobn.glue.tasks import get_task


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


def dev_set_metrics(
    task,
    splits,
    inputs,
    batch_size=32,
    trim_padding=None,
    ev_layer=None,
    ev_k=None,
):
    """`WholeSetMetrics` callbacks for the dev splits of a task.

    Each computes the task's metrics on one whole dev split at every epoch
    end: the first split's as `val_<metric>` (e.g. `val_mcc`), the others'
    (MNLI's mismatched split) as `val_mismatched_<metric>`. With `ev_k`,
    the first also logs EV_k of the embeddings around `ev_layer`. In a
    cluster of processes, every process computes them alike.

    Args:
        task: A `GlueTask` or a task name.
        splits: The dev `GlueSplit`s, first the one to monitor.
        inputs: The model inputs of each split (e.g. token ids).
        batch_size: Integer, the prediction batch size. Defaults to `32`.
        trim_padding: As `WholeSetMetrics`'s. Defaults to `None`.
        ev_layer: As `WholeSetMetrics`'s. Defaults to `None`.
        ev_k: `None` (the default) or an integer: EV_k of the first split.

    Returns:
        A list of `keras_isobn.callbacks.WholeSetMetrics`, one per split.
    """
    from keras_isobn.callbacks import WholeSetMetrics

    task = get_task(task)
    metric_fn = functools.partial(compute_metrics, task)
    return [
        WholeSetMetrics(
            x,
            split.labels,
            metric_fn,
            batch_size,
            prefix="val_" if index == 0 else f"val_{split.split[11:]}_",
            trim_padding=trim_padding,
            ev_k=ev_k if index == 0 else None,
            ev_layer=ev_layer,
        )
        for index, (split, x) in enumerate(zip(splits, inputs))
    ]
