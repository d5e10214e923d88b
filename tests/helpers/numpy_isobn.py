"""An independent float64 NumPy statement of IsoBN, for the tests."""

import numpy as np

from keras_isobn.isotropy import isobn_reference_scale


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
        return isobn_reference_scale(
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
