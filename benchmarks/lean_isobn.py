"""A leaner IsoBN train step, to measure what the layer could save.

Benchmark-only prototype, not part of the package: the same statistics
and scale as `keras_isobn.IsoBatchNormalization` (unmasked inputs), with
fewer passes over `d x d` matrices:

- the finiteness check looks at the `d` sums of squares instead of the
  `d x d` covariance: by Cauchy-Schwarz, `|C_ij| <= sqrt(C_ii C_jj)`, so
  the covariance is finite whenever its diagonal is (up to rounding at the
  float32 limit, where the check is conservative);
- a skipped batch zeroes the `(n, d)` centred batch, not the `d x d`
  product, and the moving covariance is updated as one expression
  `(1 - rate) * moving + (rate / n) * Y^T Y` (a GEMM with accumulation);
- the scale squares `C_ij / (std_i std_j)` with `1 / std` computed once
  per feature, without building `outer(std, std)` or dividing `d x d`
  times, and clips `rho^2` at 1 instead of `rho` at `+-1` (the same).
"""

from keras import ops

import keras_isobn


class LeanIsoBatchNormalization(keras_isobn.IsoBatchNormalization):
    """`IsoBatchNormalization` with fewer `d x d` passes (no mask support).

    Args:
        **kwargs: The arguments of `keras_isobn.IsoBatchNormalization`.
    """

    def call(self, inputs, training=None, mask=None):
        if mask is not None:
            raise ValueError(
                "LeanIsoBatchNormalization is a benchmark prototype without "
                "mask support; use keras_isobn.IsoBatchNormalization."
            )
        return super().call(inputs, training=training)

    def scale(self):
        covariance = ops.convert_to_tensor(self.moving_covariance)
        std = ops.convert_to_tensor(self.moving_std)
        if self.bias_correction:
            weight = ops.convert_to_tensor(self.moving_weight)
            correction = ops.where(weight > 0.0, 1.0 / weight, 0.0)
            covariance = covariance * correction
            std = std * correction
        inverse = ops.divide_no_nan(ops.ones_like(std), std)
        correlation = covariance * inverse[:, None] * inverse[None, :]
        gamma = ops.mean(ops.minimum(ops.square(correlation), 1.0), axis=1)
        a = ops.power(gamma * std + self.epsilon, -self.beta)
        variance = ops.diagonal(covariance)
        total = ops.sum(variance)
        m = ops.sqrt(total / (ops.sum(variance * ops.square(a)) + self.epsilon))
        return ops.where(total > 0.0, m * a, ops.ones_like(a))

    def _update_moving_statistics(self, inputs, mask):
        dim = self.moving_std.shape[0]
        x = ops.reshape(ops.cast(ops.stop_gradient(inputs), "float32"), (-1, dim))
        count = ops.cast(ops.shape(x)[0], "float32")
        centred = x - ops.mean(x, axis=0)
        squares = ops.sum(ops.square(centred), axis=0)
        keep = ops.logical_and(count > 0.0, ops.isfinite(ops.sum(squares)))
        rate = ops.where(keep, self.momentum, 0.0)
        centred = ops.where(keep, centred, 0.0)
        std = ops.sqrt(ops.where(keep, squares, 0.0) / ops.maximum(count, 1.0))
        self.moving_covariance.assign(
            (1.0 - rate) * self.moving_covariance
            + (rate / ops.maximum(count, 1.0))
            * ops.matmul(ops.transpose(centred), centred)
        )
        self.moving_std.assign(self.moving_std + rate * (std - self.moving_std))
        if self.bias_correction:
            self.moving_weight.assign(
                self.moving_weight + rate * (1.0 - self.moving_weight)
            )
