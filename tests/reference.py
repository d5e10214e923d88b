"""Independent float64 NumPy statements of IsoBN, for the tests."""

import numpy as np


def numpy_isobn_scale(
    covariance,
    std,
    epsilon=1e-3,
    beta=0.5,
    degenerate_limit=False,
    output_variance="total",
):
    """IsoBN's scale `m * a` from its moving statistics, in float64.

    `output_variance="unit"`: `m` brings the total variance to the number
    of features instead of keeping it.

    With `degenerate_limit=True`, correlations of zero-std features are 0
    (the limit the layer takes) instead of NaN.
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


class NumpyIsoBN:
    """Independent float64 NumPy statement of the IsoBN equations."""

    def __init__(
        self,
        dim,
        momentum=0.05,
        epsilon=1e-3,
        beta=0.5,
        degenerate_limit=False,
        output_variance="total",
    ):
        self.degenerate_limit = degenerate_limit
        self.output_variance = output_variance
        self.covariance = np.zeros((dim, dim))
        self.std = np.zeros(dim)
        self.momentum, self.epsilon, self.beta = momentum, epsilon, beta

    def update(self, x):
        x = np.asarray(x, np.float64).reshape(-1, self.std.shape[0])
        y = x - x.mean(axis=0)
        covariance = y.T @ y / len(y)
        std = np.sqrt(np.mean(y**2, axis=0))
        self.covariance += self.momentum * (covariance - self.covariance)
        self.std += self.momentum * (std - self.std)

    def scale(self):
        return numpy_isobn_scale(
            self.covariance,
            self.std,
            self.epsilon,
            self.beta,
            self.degenerate_limit,
            self.output_variance,
        )

    def __call__(self, x, training=False):
        if training:
            self.update(x)
        return np.asarray(x, np.float64) * self.scale()
