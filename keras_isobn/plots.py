"""Plots of the isotropy measures of `keras_isobn.isotropy`.

The figures are `matplotlib.figure.Figure` objects made without `pyplot`:
no window opens and no global matplotlib state changes; `path=` writes them
as PNG files with the Agg renderer, and notebooks display the returned
figure.
"""

import os
import re

import numpy as np
from matplotlib.figure import Figure

__all__ = [
    "plot_correlation_heatmap",
    "plot_ev_curves",
    "plot_logit_variance_share",
    "plot_std_histogram",
]


def plot_std_histogram(std, bins=50, limits=None, title=None, path=None):
    """Histogram of per-feature standard deviations, on a log x axis.

    Args:
        std: Standard deviations of shape `(features,)` (e.g. from
            `keras_isobn.isotropy.feature_std`), or a dict `{label: std}` to
            overlay several sets of embeddings.
        bins: Integer, the number of logarithmic bins. Defaults to `50`.
        limits: Optional `(low, high)` range of the x axis, both `> 0`.
            Defaults to the smallest and largest positive std. Features
            outside it, and those with std 0 (which a log axis cannot
            show), are counted in the legend instead.
        title: Optional string, the title of the axes.
        path: Optional path of a PNG file to write the figure to.

    Returns:
        The `matplotlib.figure.Figure`.

    Example:

    ```python
    std = keras_isobn.isotropy.feature_std(cls_embeddings)
    keras_isobn.plots.plot_std_histogram(std, path="std.png")
    ```
    """
    series = _as_series(std, "std")
    for label, value in series.items():
        if not np.all(np.isfinite(value)) or np.any(value < 0.0):
            raise ValueError(
                "Standard deviations must be finite and >= 0. Received "
                f"{np.sum(~np.isfinite(value))} non-finite and "
                f"{np.sum(value < 0.0)} negative values in '{label}'."
            )
    if limits is None:
        positive = np.concatenate([v[v > 0.0] for v in series.values()])
        if not positive.size:
            raise ValueError("All standard deviations are 0: nothing to plot.")
        low, high = positive.min(), positive.max()
        if high == low:
            low, high = low / 1.1, high * 1.1
    else:
        low, high = (float(limit) for limit in limits)
        if not 0.0 < low < high:
            raise ValueError(
                "`limits` must be (low, high) with 0 < low < high. "
                f"Received: limits={limits!r}"
            )
    edges = np.geomspace(low, high, int(bins) + 1)
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.add_subplot()
    left_out = False
    for label, value in series.items():
        value = np.ravel(value)
        shown = (value >= low) & (value <= high)
        if not shown.all():
            label = f"{label} ({np.sum(~shown)} outside the axis)"
            left_out = True
        axes.hist(value[shown], bins=edges, alpha=0.6, label=label)
    axes.set_xscale("log")
    axes.set_xlabel("standard deviation of a feature")
    axes.set_ylabel("number of features")
    if len(series) > 1 or left_out:
        axes.legend()
    if title:
        axes.set_title(title)
    return _finish(figure, path)


def plot_correlation_heatmap(correlation, title=None, path=None):
    """Heatmap of correlation matrices, e.g. clustered ones.

    Args:
        correlation: A square matrix of correlations in `[-1, 1]` (e.g. the
            first output of `keras_isobn.isotropy.clustered_correlation`), or
            a dict `{label: matrix}` for side-by-side heatmaps.
        title: Optional string, the title of the figure.
        path: Optional path of a PNG file to write the figure to.

    Returns:
        The `matplotlib.figure.Figure`.

    Example:

    ```python
    correlation, _ = keras_isobn.isotropy.clustered_correlation(embeddings)
    keras_isobn.plots.plot_correlation_heatmap(correlation, path="rho.png")
    ```
    """
    series = _as_series(correlation, "correlation")
    for label, matrix in series.items():
        if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
            raise ValueError(
                "Each correlation matrix must be square. Received shape "
                f"{matrix.shape} for '{label}'."
            )
    figure = Figure(figsize=(4.2 * len(series) + 0.8, 4), layout="constrained")
    axes = figure.subplots(1, len(series), squeeze=False)[0]
    for ax, (label, matrix) in zip(axes, series.items()):
        image = ax.imshow(
            matrix, cmap="RdBu_r", vmin=-1.0, vmax=1.0, interpolation="nearest"
        )
        ax.set_xticks([])
        ax.set_yticks([])
        if len(series) > 1:
            ax.set_title(label)
    figure.colorbar(image, ax=list(axes), label="correlation", shrink=0.9)
    if title:
        figure.suptitle(title)
    return _finish(figure, path)


def plot_ev_curves(history, keys=None, title=None, path=None):
    """EV_k over training, for the inputs (dashed) and outputs of a layer.

    Args:
        history: The `history` dict of an `EVkCallback` (or the callback
            itself), whose `"epoch"` list gives the x axis; or a Keras
            `History` (what `fit` returns) or its `history` dict, plotted
            against epochs 1, 2, ...
        keys: Optional list of keys to plot. Defaults to every key of the
            form `"...<k>_in"` / `"...<k>_out"`, e.g. `"ev3_in"`.
        title: Optional string, the title of the axes.
        path: Optional path of a PNG file to write the figure to.

    Returns:
        The `matplotlib.figure.Figure`.

    Example:

    ```python
    callback = keras_isobn.EVkCallback(probe_data, k=[1, 3, 10])
    classifier.fit(train_ds, epochs=3, callbacks=[callback])
    keras_isobn.plots.plot_ev_curves(callback, path="ev.png")
    ```
    """
    history = getattr(history, "history", history)
    if not isinstance(history, dict):
        raise ValueError(
            "`history` must be an EVkCallback, a keras History or their "
            f"`history` dict. Received: {type(history).__name__}"
        )
    if keys is None:
        keys = [key for key in history if re.search(r"\d+_(in|out)$", key)]
    missing = [key for key in keys if key not in history]
    if not keys or missing:
        raise ValueError(
            f"No EV_k values to plot: keys {missing or keys} are not in "
            f"`history` (its keys: {sorted(history)}). Record them with "
            "`keras_isobn.EVkCallback`."
        )
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.add_subplot()
    colors = {}
    for key in keys:
        values = np.asarray(history[key], dtype=float)
        if "epoch" in history:
            epochs = np.asarray(history["epoch"], dtype=float)
        else:  # A keras History: one value per epoch.
            epochs = np.arange(1, values.size + 1, dtype=float)
        if epochs.size != values.size:
            raise ValueError(
                f"`history['{key}']` has {values.size} values for "
                f"{epochs.size} epochs. Plot the EVkCallback's own `history`,"
                " which has one epoch per value."
            )
        group = re.sub(r"_(in|out)$", "", key)
        color = colors.setdefault(group, f"C{len(colors)}")
        axes.plot(
            epochs,
            values,
            marker="o",
            color=color,
            linestyle="--" if key.endswith("_in") else "-",
            label=key,
        )
    axes.set_xlabel("epoch")
    axes.set_ylabel("EV_k (share of variance on the top-k components)")
    axes.set_ylim(0.0, 1.02)
    axes.legend()
    if title:
        axes.set_title(title)
    return _finish(figure, path)


def plot_logit_variance_share(shares, top=10, title=None, path=None):
    """Bars of the logits' variance share of the top principal components.

    Args:
        shares: Shares of shape `(features,)`, largest component first (from
            `keras_isobn.isotropy.logit_variance_share`), or a dict
            `{label: shares}`, e.g. `{"fine-tuned": ..., "optimal": ...}`.
        top: Integer, the number of leading components to show. Defaults to
            `10`.
        title: Optional string, the title of the axes.
        path: Optional path of a PNG file to write the figure to.

    Returns:
        The `matplotlib.figure.Figure`.

    Example:

    ```python
    from keras_isobn import isotropy
    shares = {
        "fine-tuned": isotropy.logit_variance_share(h, dense.kernel),
        "optimal": isotropy.optimal_logit_variance_share(h, labels),
    }
    keras_isobn.plots.plot_logit_variance_share(shares, path="logits.png")
    ```
    """
    series = _as_series(shares, "shares")
    top = int(top)
    if top < 1:
        raise ValueError(f"`top` must be >= 1. Received: top={top}")
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.add_subplot()
    width = 0.8 / len(series)
    for i, (label, value) in enumerate(series.items()):
        value = np.ravel(value)[:top]
        offset = (i - (len(series) - 1) / 2) * width
        positions = np.arange(1, value.size + 1) + offset
        axes.bar(positions, value, width=width, label=label)
    axes.set_xlabel("principal component (largest variance first)")
    axes.set_ylabel("share of the logits' variance")
    axes.set_xticks(np.arange(1, top + 1))
    if len(series) > 1:
        axes.legend()
    if title:
        axes.set_title(title)
    return _finish(figure, path)


def _as_series(values, name):
    if isinstance(values, dict):
        if not values:
            raise ValueError(f"`{name}` is an empty dict.")
        return {str(label): np.asarray(v, float) for label, v in values.items()}
    return {name: np.asarray(values, dtype=float)}


def _finish(figure, path):
    if path is not None:
        path = os.fspath(path)
        if not path.lower().endswith(".png"):
            raise ValueError(
                f"Figures are saved as PNG: `path` must end in '.png'. "
                f"Received: path={path!r}"
            )
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        figure.savefig(path, format="png", dpi=100)
    return figure
