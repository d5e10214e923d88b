"""Full whitening layers, for comparison with IsoBN. Benchmark-only code.

Both whiten the centred features, `outputs = (x - mean) @ W` with
`W ~ Cov^(-1/2)`, differentiating through `W` in training as their papers
do, and keep a moving mean and whitening matrix for inference. Statistics
are float32 under every dtype policy (no backend has a float16
eigendecomposition on the CPU), as IsoBN's and BatchNormalization's are.

Whitening is over all `d` features at once (one group): the "ZCA
whitening of the covariance" the IsoBN paper argues against. Decorrelated
BN and IterNorm recommend groups of 16-64 features, whose eigenproblems
are small and whose batch covariances are non-singular.
"""

import keras
from keras import ops


class _Whitening(keras.layers.Layer):
    """Moving statistics and the training/inference split of whitening.

    Args:
        momentum: Float. Weight of the current batch in the moving
            statistics. Defaults to `0.1`.
        epsilon: Float added to the diagonal of the covariance. Defaults
            to `1e-5`.
        **kwargs: Base layer keyword arguments.
    """

    def __init__(self, momentum=0.1, epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.momentum = float(momentum)
        self.epsilon = float(epsilon)

    def build(self, input_shape):
        dim = input_shape[-1]
        self.moving_mean = self.add_weight(
            shape=(dim,), initializer="zeros", dtype="float32",
            trainable=False, autocast=False, name="moving_mean",
        )
        self.moving_whitening = self.add_weight(
            shape=(dim, dim), initializer="identity", dtype="float32",
            trainable=False, autocast=False, name="moving_whitening",
        )
        self.built = True

    def call(self, inputs, training=None):
        dim = self.moving_mean.shape[0]
        x = ops.reshape(ops.cast(inputs, "float32"), (-1, dim))
        if training and self.trainable:
            mean = ops.mean(x, axis=0)
            centred = x - mean
            count = ops.cast(ops.shape(x)[0], "float32")
            covariance = ops.matmul(ops.transpose(centred), centred) / count
            covariance = covariance + self.epsilon * ops.eye(dim)
            whitening = self.whitening_matrix(covariance)
            for moving, value in ((self.moving_mean, mean),
                                  (self.moving_whitening, whitening)):
                update = ops.stop_gradient(value) - moving
                moving.assign(moving + self.momentum * update)
        else:
            centred = x - self.moving_mean
            whitening = self.moving_whitening
        outputs = ops.reshape(ops.matmul(centred, whitening), ops.shape(inputs))
        return ops.cast(outputs, self.compute_dtype)

    def whitening_matrix(self, covariance):
        raise NotImplementedError

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"momentum": self.momentum, "epsilon": self.epsilon})
        return config


class ZCAWhitening(_Whitening):
    """ZCA whitening by eigendecomposition (Decorrelated BN, one group).

    `Cov + epsilon * I = U diag(lambda) U^T` and
    `W = U diag(lambda ** -1/2) U^T`, as in Huang et al., "Decorrelated
    Batch Normalization", CVPR 2018. The gradient flows through the
    eigendecomposition, whose backward pass divides by the differences
    of eigenvalues `lambda_i - lambda_j`. Arguments: see `_Whitening`.
    """

    def whitening_matrix(self, covariance):
        eigenvalues, eigenvectors = ops.eigh(covariance)
        scaled = eigenvectors * ops.rsqrt(eigenvalues)[None, :]
        return ops.matmul(scaled, ops.transpose(eigenvectors))


class IterNormWhitening(_Whitening):
    """Whitening by Newton's iterations (IterNorm, one group).

    With `S = (Cov + epsilon * I) / trace` and `P_0 = I`, iterates
    `P_k = 1.5 * P_(k-1) - 0.5 * P_(k-1) ** 3 @ S` and takes
    `W = P_T / sqrt(trace)`, as in Huang et al., "Iterative
    Normalization: Beyond Standardization towards Efficient Whitening",
    CVPR 2019. Each iteration costs three d x d matrix products.

    Args:
        iterations: Integer `T`, number of Newton's iterations. Defaults
            to `5`, the paper's value.
        **kwargs: `momentum`, `epsilon` (see `_Whitening`) and base layer
            keyword arguments.
    """

    def __init__(self, iterations=5, **kwargs):
        super().__init__(**kwargs)
        self.iterations = int(iterations)

    def whitening_matrix(self, covariance):
        trace = ops.trace(covariance)
        normalized = covariance / trace
        p = ops.eye(ops.shape(covariance)[0])
        for _ in range(self.iterations):
            p3 = ops.matmul(ops.matmul(p, p), p)
            p = 1.5 * p - 0.5 * ops.matmul(p3, normalized)
        return p * ops.rsqrt(trace)

    def get_config(self):
        config = super().get_config()
        config.update({"iterations": self.iterations})
        return config
