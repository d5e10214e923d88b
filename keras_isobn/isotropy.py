"""Isotropy measures of sentence embeddings, as in the IsoBN paper.

Every function takes embeddings `x` of shape `(samples, features)`, as a
NumPy array or a backend tensor, computes in float64 NumPy and returns plain
NumPy arrays or Python floats. `isobn_reference_scale()` states IsoBN's
scale from its statistics in float64 NumPy, the reference that the layer is
tested (and checked on accelerators) against.
"""

import keras
import numpy as np

__all__ = [
    "clustered_correlation",
    "explained_variance",
    "feature_std",
    "isobn_reference_scale",
    "isotropy_summary",
    "logit_variance_share",
    "optimal_logit_variance_share",
]


def explained_variance(x, k=3):
    """EV_k: the share of the total variance on the top-k principal components.

    `EV_k = sum(lambda_1..k) / sum(lambda)` with `lambda` the eigenvalues of
    the covariance of `x`, largest first. It is 1 when all the variance lies
    on `k` directions and `k / features` for isotropic embeddings. The
    eigenvalues are the squared singular values of the centred `x`, computed
    in float64, so the result is exact to about 1e-7 on float32 embeddings.

    Args:
        x: Embeddings of shape `(samples, features)`, NumPy array or backend
            tensor, with at least 2 samples.
        k: Integer in `[1, features]`, or a sequence of such integers.
            Defaults to `3`.

    Returns:
        A Python float in `(0, 1]` for an integer `k`, else a float64 NumPy
        array with one value per entry of `k`.

    Example:

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=(1000, 4)) * [10, 1, 1, 1]
    >>> round(explained_variance(x, k=1), 2)
    0.97
    >>> explained_variance(x, k=[1, 4]).round(2).tolist()
    [0.97, 1.0]
    """
    x = _as_embeddings(x)
    ks = np.atleast_1d(np.asarray(k))
    if ks.ndim != 1 or ks.size == 0 or ks.dtype.kind not in "iu":
        raise ValueError(
            "`k` must be an integer or a non-empty sequence of integers. "
            f"Received: k={k!r}"
        )
    dim = x.shape[1]
    if ks.min() < 1 or ks.max() > dim:
        raise ValueError(
            f"`k` must be in [1, {dim}] (the number of features) for "
            f"embeddings of shape {x.shape}. Received: k={k!r}"
        )
    centred = x - x.mean(axis=0)
    eigenvalues = np.linalg.svd(centred, compute_uv=False) ** 2
    total = eigenvalues.sum()
    if not total > 0.0:
        raise ValueError(
            "EV_k is undefined for embeddings without variance (all rows "
            f"are equal). Received embeddings of shape {x.shape}."
        )
    shares = np.cumsum(eigenvalues) / total
    # More components than the rank of the data hold no more variance.
    values = np.minimum(shares[np.minimum(ks, eigenvalues.size) - 1], 1.0)
    if np.ndim(k) == 0:
        return float(values[0])
    return values


def feature_std(x):
    """The standard deviation of every feature (dimension) of `x`.

    The paper's first finding: the per-dimension std of pre-trained [CLS]
    embeddings spans orders of magnitude; plot it with
    `keras_isobn.plots.plot_std_histogram`.

    Args:
        x: Embeddings of shape `(samples, features)`, NumPy array or backend
            tensor, with at least 2 samples.

    Returns:
        A float64 NumPy array of shape `(features,)`: the population
        standard deviations (`ddof=0`).

    Example:

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=(10000, 2)) * [1, 100]
    >>> feature_std(x).round(0).tolist()
    [1.0, 100.0]
    """
    return _as_embeddings(x).std(axis=0)


def clustered_correlation(x, method="average"):
    """The correlation matrix of `x`, correlated features next to each other.

    The paper's second finding: dimensions of pre-trained [CLS] embeddings
    form groups of strongly correlated features. The features are ordered
    by the leaves of a hierarchical clustering (`scipy.cluster.hierarchy`)
    with the distance `1 - |rho|`, so such groups show as blocks on the
    diagonal; plot it with `keras_isobn.plots.plot_correlation_heatmap`.

    Args:
        x: Embeddings of shape `(samples, features)`, NumPy array or backend
            tensor, with at least 2 samples.
        method: Linkage method of `scipy.cluster.hierarchy.linkage`, e.g.
            `"average"` (the default), `"complete"` or `"single"`.

    Returns:
        A tuple `(correlation, order)`: the float64 correlation matrix of
        shape `(features, features)` with rows and columns reordered, and
        the integer array `order` such that
        `correlation == np.corrcoef(x.T)[order][:, order]`. Features with
        zero variance get correlation 0 with every other feature.

    Example:

    >>> import numpy as np
    >>> z = np.random.default_rng(0).normal(size=(500, 2))
    >>> x = np.stack([z[:, 0], z[:, 1], z[:, 0], z[:, 1]], axis=1)
    >>> correlation, order = clustered_correlation(x)
    >>> sorted([sorted(order[:2].tolist()), sorted(order[2:].tolist())])
    [[0, 2], [1, 3]]
    """
    x = _as_embeddings(x)
    correlation = _correlation(x)
    if x.shape[1] == 1:
        return correlation, np.zeros(1, dtype=int)
    from scipy.cluster import hierarchy
    from scipy.spatial import distance

    dissimilarity = distance.squareform(
        1.0 - np.abs(correlation), checks=False
    )
    linkage = hierarchy.linkage(
        np.clip(dissimilarity, 0.0, None), method=method
    )
    order = hierarchy.leaves_list(linkage)
    return correlation[np.ix_(order, order)], order


def logit_variance_share(x, kernel):
    """The share of the logits' variance carried by each principal component.

    With `u_j`, `lambda_j` the eigenvectors and eigenvalues of the
    covariance of the embeddings `x` (largest first) and `W` the classifier
    kernel, the logits `x W` have total variance
    `sum_j lambda_j * ||W^T u_j||^2` (the components are uncorrelated), and
    component `j` carries the share `lambda_j * ||W^T u_j||^2` of it. The
    paper finds that a fine-tuned classifier draws most of its logits from
    the top components; compare with `optimal_logit_variance_share`. Biases
    do not matter.

    Args:
        x: Embeddings of shape `(samples, features)`, NumPy array or backend
            tensor, with at least 2 samples.
        kernel: Classifier kernel of shape `(features,)` or
            `(features, classes)`, e.g. `dense.kernel` of the layer producing
            the logits.

    Returns:
        A float64 NumPy array of shape `(features,)`, summing to 1: the share
        of each principal component, largest eigenvalue first.

    Example:

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=(10000, 2)) * [3, 1]
    >>> logit_variance_share(x, kernel=np.array([1.0, 1.0])).round(1).tolist()
    [0.9, 0.1]
    """
    x = _as_embeddings(x)
    kernel = _as_float64(kernel)
    if kernel.ndim == 1:
        kernel = kernel[:, None]
    if kernel.ndim != 2 or kernel.shape[0] != x.shape[1]:
        raise ValueError(
            "`kernel` must have shape (features,) or (features, classes), "
            f"with features={x.shape[1]} as in `x`. Received: "
            f"kernel.shape={kernel.shape}"
        )
    eigenvalues, eigenvectors = np.linalg.eigh(np.cov(x, rowvar=False))
    eigenvalues = np.clip(eigenvalues[::-1], 0.0, None)
    eigenvectors = eigenvectors[:, ::-1]
    variance = eigenvalues * np.sum((eigenvectors.T @ kernel) ** 2, axis=1)
    total = variance.sum()
    if not total > 0.0:
        raise ValueError(
            "The logits have no variance on these embeddings (zero kernel or "
            "constant embeddings), so their shares are undefined."
        )
    return variance / total


def optimal_logit_variance_share(x, labels, **kwargs):
    """`logit_variance_share` of an "optimal" classifier fitted on `x`.

    The reference of the paper's analysis: a logistic regression
    (`sklearn.linear_model.LogisticRegression`) trained on the frozen
    embeddings `x` to predict `labels`, whose kernel is then analysed like
    the fine-tuned classifier's.

    Args:
        x: Embeddings of shape `(samples, features)`, NumPy array or backend
            tensor.
        labels: Integer class labels of shape `(samples,)`, at least two
            distinct classes.
        **kwargs: Passed to `LogisticRegression`, e.g. `C`. `max_iter`
            defaults to `1000`.

    Returns:
        A float64 NumPy array of shape `(features,)`, summing to 1: the share
        of each principal component, largest eigenvalue first.

    Example:

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(400, 2)) * [3, 1]
    >>> labels = (x[:, 1] > 0).astype(int)  # only the 2nd component matters
    >>> optimal_logit_variance_share(x, labels).round(1).tolist()
    [0.0, 1.0]
    """
    x = _as_embeddings(x)
    labels = np.asarray(labels).reshape(-1)
    if labels.shape[0] != x.shape[0]:
        raise ValueError(
            "`labels` must have one entry per row of `x`. Received "
            f"{labels.shape[0]} labels for {x.shape[0]} rows."
        )
    if np.unique(labels).size < 2:
        raise ValueError(
            "`labels` must hold at least two classes to fit a classifier."
        )
    kwargs.setdefault("max_iter", 1000)
    from sklearn.linear_model import LogisticRegression

    classifier = LogisticRegression(**kwargs).fit(x, labels)
    return logit_variance_share(x, classifier.coef_.T)


def isotropy_summary(x, k=(1, 3), threshold=0.5):
    """The paper's isotropy measures of `x` in one dict, for tables.

    What notebook 01 plots, as numbers: EV_k; the spread of the per-feature
    std; and the correlated groups, through IsoBN's own `gamma_i` (the mean
    squared correlation of feature `i` with all `n` features: `n * gamma_i`
    is about 1 for a feature correlated with no other and `m` for one of `m`
    identical features) and the share of features correlated above
    `threshold` with at least one other.

    Args:
        x: Embeddings of shape `(samples, features)`, NumPy array or backend
            tensor, with at least 2 samples.
        k: Integers in `[1, features]`: which EV_k to report. Defaults to
            `(1, 3)`.
        threshold: `|rho|` above which two features count as correlated.
            Defaults to `0.5`.

    Returns:
        A dict of Python floats and ints: `"ev<k>"` for each `k`;
        `"std_min"`, `"std_median"`, `"std_max"`, `"std_p95_p5"` (the 95th
        over the 5th percentile, robust to a dead feature or two),
        `"std_cv"` (std over mean of the stds), `"constant_features"` (std
        below 1e-6); `"gamma_median"`, `"gamma_max"`, `"group_size_median"`,
        `"group_size_max"` (`n * gamma`); `"correlated_share"` and
        `"mean_abs_correlation"` (off the diagonal).

    Example:

    >>> import numpy as np
    >>> z = np.random.default_rng(0).normal(size=(2000, 2))
    >>> x = np.concatenate([z[:, :1].repeat(3, axis=1), z[:, 1:]], axis=1)
    >>> summary = isotropy_summary(x, k=[1])
    >>> round(summary["group_size_max"], 1), summary["correlated_share"]
    (3.0, 0.75)
    """
    x = _as_embeddings(x)
    ks = [int(value) for value in np.atleast_1d(k)]
    std = x.std(axis=0)
    correlation = _correlation(x)
    n = correlation.shape[0]
    gamma = np.mean(correlation**2, axis=1)
    off_diagonal = np.abs(correlation[~np.eye(n, dtype=bool)]).reshape(
        n, n - 1
    )
    low, high = np.percentile(std, [5, 95])
    summary = {
        f"ev{value}": float(share)
        for value, share in zip(ks, explained_variance(x, k=ks))
    }
    summary.update(
        std_min=float(std.min()),
        std_median=float(np.median(std)),
        std_max=float(std.max()),
        std_p95_p5=float(high / low) if low > 0 else float("inf"),
        std_cv=float(std.std() / std.mean()),
        constant_features=int(np.sum(std < 1e-6)),
        gamma_median=float(np.median(gamma)),
        gamma_max=float(gamma.max()),
        group_size_median=float(n * np.median(gamma)),
        group_size_max=float(n * gamma.max()),
        correlated_share=(
            float(np.mean(off_diagonal.max(axis=1) > threshold))
            if n > 1
            else 0.0
        ),
        mean_abs_correlation=float(off_diagonal.mean()) if n > 1 else 0.0,
    )
    return summary


def isobn_reference_scale(
    covariance,
    std,
    epsilon=1e-3,
    beta=0.5,
    degenerate_limit=False,
    output_variance="total",
):
    """IsoBN's per-feature scale `m * a` from its statistics, in float64.

    An independent NumPy statement of the equations of
    `keras_isobn.IsoBatchNormalization` (Zhou et al., 2021): with the
    correlations `rho = covariance / outer(std, std)` (clipped to
    `[-1, 1]`) and `gamma_j = mean_i(rho_ij ** 2)`, the scale of feature
    `j` is `a_j = (gamma_j * std_j + epsilon) ** -beta`, times the `m` that
    brings the total variance `sum_j(covariance_jj * a_j ** 2)` back to
    `trace(covariance)` (or, with `output_variance="unit"`, to the number
    of features). The layer multiplies its (centred) inputs by it.

    Args:
        covariance: Array of shape `(features, features)`, the covariance of
            the features (the layer's `moving_covariance`, or a batch's).
        std: Array of shape `(features,)`, their standard deviations.
        epsilon: Float, as the layer's. Defaults to `1e-3`.
        beta: Float, as the layer's. Defaults to `0.5`.
        degenerate_limit: Whether correlations with a zero-std feature are
            `0` (the limit the layer takes) rather than NaN. Defaults to
            `False`.
        output_variance: `"total"` (the default) or `"unit"`, as the
            layer's.

    Returns:
        A float64 NumPy array of shape `(features,)`.

    Example:

    >>> import numpy as np
    >>> covariance = np.array([[4.0, 0.0], [0.0, 1.0]])
    >>> scale = isobn_reference_scale(covariance, np.sqrt(np.diag(covariance)))
    >>> np.round(scale, 3)
    array([0.913, 1.29 ])
    """
    covariance = np.asarray(covariance, np.float64)
    std = np.asarray(std, np.float64)
    outer = np.outer(std, std)
    if degenerate_limit:
        rho = np.divide(
            covariance, outer, out=np.zeros_like(outer), where=outer > 0
        )
    else:
        rho = covariance / outer
    rho = np.clip(rho, -1, 1)
    gamma = np.mean(rho**2, axis=1)
    a = (gamma * std + epsilon) ** -beta
    total = np.trace(covariance)
    new_total = np.sum(np.diag(covariance) * a**2)
    if output_variance == "unit":
        total = len(std)
    return a * np.sqrt(total / (new_total + epsilon))

def _as_float64(x):
    if not isinstance(x, np.ndarray):
        x = keras.ops.convert_to_numpy(x)
    return np.asarray(x, dtype=np.float64)


def _as_embeddings(x):
    x = _as_float64(x)
    if x.ndim != 2:
        raise ValueError(
            "Expected embeddings of shape (samples, features). Received: "
            f"shape={x.shape}. Reshape them, e.g. `x.reshape(-1, "
            "x.shape[-1])` for token embeddings."
        )
    if x.shape[0] < 2:
        raise ValueError(
            "At least 2 samples are needed to estimate a covariance. "
            f"Received embeddings of shape {x.shape}."
        )
    if not np.all(np.isfinite(x)):
        raise ValueError("The embeddings hold NaN or Inf values.")
    return x


def _correlation(x):
    centred = x - x.mean(axis=0)
    std = np.sqrt(np.mean(centred**2, axis=0))
    safe_std = np.where(std > 0.0, std, 1.0)
    scaled = centred / safe_std
    correlation = np.clip(scaled.T @ scaled / x.shape[0], -1.0, 1.0)
    # Features without variance: correlation 0 with the others, 1 with itself.
    constant = std == 0.0
    correlation[constant, :] = 0.0
    correlation[:, constant] = 0.0
    np.fill_diagonal(correlation, 1.0)
    return correlation
