"""Isotropic Batch Normalization (IsoBN)."""

import keras
from keras import ops

__all__ = ["IsoBatchNormalization"]

# The smallest normal float32: a std below it has an inverse that overflows.
_TINY = 2.0**-126


def _diagonal(matrix):
    """The diagonal of a square matrix, as a strided slice of its values."""
    dim = ops.shape(matrix)[-1]
    return ops.reshape(matrix, (-1,))[:: dim + 1]


@keras.saving.register_keras_serializable(package="keras_isobn")
class IsoBatchNormalization(keras.layers.Layer):
    """Isotropic Batch Normalization (IsoBN).

    IsoBN rescales each feature of a pre-trained embedding so that no group
    of highly correlated, high-variance features dominates what comes next.
    It keeps running estimates of the feature covariance `Cov` and of the
    per-feature standard deviation `std`, and computes from them, with no
    matrix inverse:

    ```
    rho     = clip(Cov / outer(std, std), -1, 1)   # correlations
    gamma_i = mean_j rho_ij ** 2                   # size of i's group
    a_i     = (gamma_i * std_i + epsilon) ** -beta
    m       = sqrt(trace(Cov) / (sum_i Cov_ii * a_i ** 2 + epsilon))
    outputs = inputs * (m * a)
    ```

    The scale `m * a` is treated as a constant by backpropagation (gradients
    flow through `inputs` only), no mean is subtracted, and the total
    variance of the features is kept. With `output_variance="unit"`, the
    outputs get unit variance on average over the `d` features instead,
    `m = sqrt(d / (sum_i Cov_ii * a_i ** 2 + epsilon))`, the scale that
    `keras.layers.BatchNormalization` gives, with IsoBN's relative scales
    (an extension of the paper, for features whose scale is far from 1).

    In training (`training=True` and the layer trainable), the statistics
    of the batch are computed first, in float32, over every axis but the
    last: with `Y` the centred batch of `n` rows, `C = Y^T Y / n` and
    `s = sqrt(mean(Y ** 2))`, the root of that product's diagonal
    (`s_i = sqrt(C_ii)`). They update the moving statistics,
    `moving_covariance += momentum * (C - moving_covariance)` and likewise
    `moving_std`, and the batch is then normalised with the *updated*
    moving statistics, exactly as in the authors' implementation. Each
    update also stores the new scale in the non-trainable `moving_scale`,
    so that inference is a single product, `inputs * moving_scale`, at the
    cost of `keras.layers.BatchNormalization`'s.

    The moving statistics and `moving_scale` are non-trainable float32
    weights under every dtype policy (`"mixed_float16"` and `"bfloat16"`
    included), and the computation never yields NaN or Inf from the
    statistics: a layer that has seen no data returns its input unchanged,
    features with zero variance get the limit of the formula
    (`gamma_i * std_i -> 0`), a batch that holds a non-finite value or only
    masked positions leaves the moving statistics as they were.

    Args:
        momentum: Float in `(0, 1]`. Weight of the current batch in the
            moving statistics. Defaults to `0.05`, the paper's value. Note
            that this is the weight of the *new* batch, the complement of
            `keras.layers.BatchNormalization`'s `momentum`.
        epsilon: Float `> 0` added to `gamma * std` before the power, and to
            the denominator of the variance-preserving factor. Defaults to
            `1e-3`.
        beta: Float `>= 0`. Strength of the normalisation: `0` leaves the
            inputs unchanged, `0.5` (the default, the paper's value) divides
            each feature by the square root of `gamma * std`, `1` by
            `gamma * std`.
        output_variance: `"total"` (the default, the paper's) to keep the
            total variance of the features, `trace(Cov)`; `"unit"` to bring
            it to `d`, the number of features (unit variance on average).
        bias_correction: Boolean. If `True`, the moving statistics are
            divided by the weight that data already has in them,
            `1 - (1 - momentum) ** t` after `t` updates, before use (as Adam
            does). Without it, the zero start shrinks the moving covariance
            by `momentum` and the moving std product by `momentum ** 2`
            after the first step, which inflates every correlation by
            `1 / momentum` (20x with the default). Defaults to `False`, the
            paper's behaviour.
        synchronized: Boolean. Only needed with the TensorFlow backend under
            a `tf.distribute` strategy (e.g. `MirroredStrategy`): if `True`,
            the batch statistics are all-reduced across replicas so that
            they are those of the global batch. Without it each replica
            updates from its own share of the batch. On JAX,
            `keras.distribution.DataParallel` computes the global batch's
            statistics either way; on PyTorch only single-process training
            is supported and `True` raises an error. Defaults to `False`.
        **kwargs: Base layer keyword arguments, such as `name` and `dtype`.

    Call arguments:
        inputs: Tensor of rank 2 or more, features on the last axis.
        training: Python boolean. Whether to update the moving statistics
            from this batch before normalising with them.
        mask: Optional boolean tensor of the shape of `inputs` without its
            last axis (e.g. `(batch, sequence)` for `(batch, sequence,
            features)` inputs). Masked-out positions are left out of the
            batch statistics. The outputs at those positions are scaled
            like any other.

    Reference:
        - [Zhou et al., 2021](https://arxiv.org/abs/2005.02178), "IsoBN:
          Fine-Tuning BERT with Isotropic Batch Normalization", AAAI 2021.

    Example:

    >>> import numpy as np
    >>> import keras_isobn
    >>> layer = keras_isobn.IsoBatchNormalization()
    >>> x = np.random.default_rng(0).normal(size=(32, 8)).astype("float32")
    >>> for _ in range(10):
    ...     y = layer(x, training=True)
    >>> tuple(layer(x).shape)
    (32, 8)
    >>> layer.moving_covariance.dtype
    'float32'
    """

    def __init__(
        self,
        momentum=0.05,
        epsilon=1e-3,
        beta=0.5,
        output_variance="total",
        bias_correction=False,
        synchronized=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if synchronized and keras.backend.backend() == "torch":
            raise ValueError(
                "`synchronized=True` is not supported on the PyTorch backend: "
                "keras-isobn supports single-process training there, whose "
                "statistics are those of the whole batch already. Use "
                "`synchronized=False`, or the TensorFlow backend "
                "(tf.distribute) or the JAX backend (keras.distribution) for "
                "data-parallel training. Received: synchronized=True"
            )
        if not 0.0 < float(momentum) <= 1.0:
            raise ValueError(
                "`momentum` must be in (0, 1], the weight of each new batch "
                f"in the moving statistics. Received: momentum={momentum}"
            )
        if float(epsilon) <= 0.0:
            raise ValueError(
                "`epsilon` must be > 0 so the scale stays finite. "
                f"Received: epsilon={epsilon}"
            )
        if float(beta) < 0.0:
            raise ValueError(
                "`beta` must be >= 0 (0 leaves the inputs unchanged). "
                f"Received: beta={beta}"
            )
        if output_variance not in ("total", "unit"):
            raise ValueError(
                '`output_variance` must be "total" (keep the total variance, '
                'the paper\'s) or "unit" (unit variance on average). '
                f"Received: output_variance={output_variance!r}"
            )
        self.momentum = float(momentum)
        self.epsilon = float(epsilon)
        self.beta = float(beta)
        self.output_variance = output_variance
        self.bias_correction = bool(bias_correction)
        self.synchronized = bool(synchronized)
        self.supports_masking = True

    def build(self, input_shape):
        if len(input_shape) < 2:
            raise ValueError(
                "IsoBatchNormalization expects inputs of rank >= 2, "
                "(batch, ..., features), with statistics taken over every "
                f"axis but the last. Received: input_shape={input_shape}. "
                "Add a batch axis, e.g. `x[None]` for a single vector."
            )
        dim = input_shape[-1]
        if dim is None:
            raise ValueError(
                "The last axis (features) of the input of "
                "IsoBatchNormalization must be known when the layer is "
                f"built. Received: input_shape={input_shape}"
            )
        self.moving_covariance = self.add_weight(
            shape=(dim, dim),
            initializer="zeros",
            dtype="float32",
            trainable=False,
            autocast=False,
            name="moving_covariance",
        )
        self.moving_std = self.add_weight(
            shape=(dim,),
            initializer="zeros",
            dtype="float32",
            trainable=False,
            autocast=False,
            name="moving_std",
        )
        if self.bias_correction:
            # The moving average of the constant 1: the weight that data
            # has in the moving statistics, 1 - (1 - momentum) ** steps.
            self.moving_weight = self.add_weight(
                shape=(),
                initializer="zeros",
                dtype="float32",
                trainable=False,
                autocast=False,
                name="moving_weight",
            )
        # `scale()` as of the last update, what inference multiplies by.
        self.moving_scale = self.add_weight(
            shape=(dim,),
            initializer="ones",
            dtype="float32",
            trainable=False,
            autocast=False,
            name="moving_scale",
        )
        self.input_spec = keras.layers.InputSpec(
            min_ndim=2, axes={-1: dim}
        )
        self.built = True

    def call(self, inputs, training=None, mask=None):
        if training and self.trainable:
            scale = self._scale(*self._update_moving_statistics(inputs, mask))
            self.moving_scale.assign(scale)
        else:
            scale = ops.convert_to_tensor(self.moving_scale)
        scale = ops.stop_gradient(scale)
        return inputs * ops.cast(scale, inputs.dtype)

    def scale(self):
        """The per-feature scale `m * a` from the moving statistics.

        Computed from `moving_covariance` and `moving_std` as they are now;
        after statistics are assigned by hand, `update_moving_scale()`
        makes inference use them.

        Returns:
            A float32 tensor of shape `(features,)`; all ones while the
            layer has seen no data.
        """
        covariance = ops.convert_to_tensor(self.moving_covariance)
        weight = None
        if self.bias_correction:
            weight = ops.convert_to_tensor(self.moving_weight)
        variance = _diagonal(covariance)
        return self._scale(
            covariance,
            variance,
            ops.sum(variance),
            ops.convert_to_tensor(self.moving_std),
            weight,
        )

    def update_moving_scale(self):
        """Sets `moving_scale`, the scale inference uses, to `scale()`."""
        self.moving_scale.assign(self.scale())

    def _scale(self, covariance, variance, total, std, weight):
        """`scale()` from given statistics: `variance` is the diagonal of
        `covariance`, `total` its sum, `weight` the moving weight (`None`
        without bias correction)."""
        if self.bias_correction:
            correction = ops.where(weight > 0.0, 1.0 / weight, 0.0)
            covariance = covariance * correction
            variance = variance * correction
            total = total * correction
            std = std * correction

        # rho_ij ** 2 = (Cov_ij / std_i / std_j) ** 2, clipped at 1, is
        # min(t_ij ** 2, std_i ** 2) / std_i ** 2 with t_ij = Cov_ij / std_j:
        # three elementwise passes over the `d x d` matrix and a row mean,
        # the fewest `keras.ops` can state (eager PyTorch runs each as its
        # own kernel). A feature without variance gets correlations 0, the
        # limit of the formula (its gamma * std is 0 either way); so does one
        # whose std is below the smallest normal float32, whose inverse
        # would overflow. `inverse * (inverse * mean)` cannot overflow: the
        # clipped mean is at most std_i ** 2.
        inverse = ops.where(std >= _TINY, 1.0 / ops.maximum(std, _TINY), 0.0)
        clipped = ops.minimum(
            ops.square(covariance * inverse[None, :]),
            ops.square(std)[:, None],
        )
        gamma = inverse * (inverse * ops.mean(clipped, axis=1))
        a = ops.power(gamma * std + self.epsilon, -self.beta)
        target = total
        if self.output_variance == "unit":
            target = ops.cast(ops.shape(variance)[0], "float32")
        m = ops.sqrt(target / (ops.sum(variance * ops.square(a)) + self.epsilon))
        # No statistics yet (or all zero): leave the inputs unchanged.
        return ops.where(total > 0.0, m * a, ops.ones_like(a))

    def _update_moving_statistics(self, inputs, mask):
        """Updates the moving statistics from a batch.

        Returns:
            The arguments of `_scale()` for the updated statistics: the
            moving covariance, its diagonal and trace, the moving std and
            the moving weight (`None` without bias correction), as tensors,
            so that the scale is computed without reading the variables
            again.
        """
        dim = self.moving_std.shape[0]
        x = ops.cast(ops.stop_gradient(inputs), "float32")
        x = ops.reshape(x, (-1, dim))
        if mask is None:
            rows = ops.cast(ops.shape(x)[0], "float32")
        else:
            weights = ops.reshape(ops.cast(mask, "float32"), (-1, 1))
            rows = ops.sum(weights)
            x = x * weights
        count, sums = self._batch_sum(rows, ops.sum(x, axis=0))
        # The mean by a division, as `sums * (1 / n)` is further from a
        # nearly constant feature's values, which centring turns into std.
        centred = x - ops.divide_no_nan(sums, count)
        if mask is not None:
            # With 0/1 weights, (w * y)^T (w * y) = sum_k w_k y_k y_k^T.
            centred = centred * weights
        # A batch with no unmasked position or with a non-finite value is
        # skipped: it must not poison the moving statistics. The check reads
        # the `d` sums of squares `S_i = (Y^T Y)_ii`: by Cauchy-Schwarz,
        # |(Y^T Y)_ij| <= sqrt(S_i S_j), so they cover the `d x d` product.
        moving_covariance = ops.convert_to_tensor(self.moving_covariance)
        inverse_count = ops.divide_no_nan(1.0, count)  # 0 without rows
        if keras.backend.backend() == "torch":
            # Eager PyTorch runs each op as its own kernel, and a `d x d`
            # select costs three additions there: the check comes first,
            # from the centred batch, which a skipped batch then zeroes, so
            # that the moving average is one scaling and one addition.
            _, squares = self._batch_sum(
                rows, ops.sum(ops.square(centred), axis=0)
            )
            keep = ops.logical_and(count > 0.0, ops.isfinite(ops.sum(squares)))
            rate = ops.where(keep, self.momentum * inverse_count, 0.0)
            # `rate * Y^T Y` as the product of `sqrt(rate) * Y`.
            centred = ops.where(keep, centred * ops.sqrt(rate), 0.0)
            _, product = self._batch_sum(
                rows, ops.matmul(ops.transpose(centred), centred)
            )
            decay = ops.where(keep, 1.0 - self.momentum, 1.0)
            covariance = decay * moving_covariance + product
            variance = _diagonal(covariance)
            total = ops.sum(variance)
        else:
            # XLA fuses the select into the moving average, so the check
            # reads the product's diagonal, and one reduction of the two
            # diagonals (the product's, the old moving covariance's) gives
            # it and the updated trace. A skipped batch keeps every
            # statistic through a `where`, not a zero rate: a non-finite
            # product times 0 is NaN.
            _, product = self._batch_sum(
                rows, ops.matmul(ops.transpose(centred), centred)
            )
            squares = _diagonal(product)
            traces = ops.sum(
                ops.stack([squares, _diagonal(moving_covariance)]), axis=1
            )
            keep = ops.logical_and(count > 0.0, ops.isfinite(traces[0]))
            rate = self.momentum * inverse_count

            def update(moving, batch):
                # The moving average of `batch / n`; `moving` if skipped.
                updated = (1.0 - self.momentum) * moving + rate * batch
                return ops.where(keep, updated, moving)

            covariance = update(moving_covariance, product)
            # The diagonal of the result: reading the old one after the
            # update would make XLA copy the variable it updates in place.
            variance = _diagonal(covariance)
            total = update(traces[1], traces[0])
        moving_std = ops.convert_to_tensor(self.moving_std)
        std = ops.sqrt(squares * inverse_count)
        std = ops.where(
            keep, moving_std + self.momentum * (std - moving_std), moving_std
        )
        self.moving_covariance.assign(covariance)
        self.moving_std.assign(std)
        weight = None
        if self.bias_correction:
            weight = ops.convert_to_tensor(self.moving_weight)
            weight = ops.where(
                keep, weight + self.momentum * (1.0 - weight), weight
            )
            self.moving_weight.assign(weight)
        return covariance, variance, total, std, weight

    def _batch_sum(self, rows, total):
        """The batch's number of rows and a sum over them.

        With `synchronized=True` in a `tf.distribute` replica context, both
        are first added up over all replicas (through
        `keras.ops.moments(..., synchronized=True)`), so that they are those
        of the global batch, up to a common factor (the number of replicas)
        that cancels in their ratio, the only thing used.

        Returns:
            The (global) number of rows, positive iff the batch has a row,
            and the (global) sum, of the shape of `total`.
        """
        if self.synchronized and keras.backend.backend() == "tensorflow":
            row = ops.concatenate(
                [ops.reshape(rows, (1,)), ops.reshape(total, (-1,))]
            )
            # The mean over the replicas' rows: the global sums / replicas.
            row, _ = ops.moments(row[None, :], axes=[0], synchronized=True)
            return row[0], ops.reshape(row[1:], ops.shape(total))
        return rows, total

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_mask(self, inputs, mask=None):
        return mask

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "momentum": self.momentum,
                "epsilon": self.epsilon,
                "beta": self.beta,
                "output_variance": self.output_variance,
                "bias_correction": self.bias_correction,
                "synchronized": self.synchronized,
            }
        )
        return config
