"""What each backend's distributed engine supports, and the error if not."""

import keras

__all__ = ["unsupported_backend_error"]

_MWMS_BUG = (
    "Keras 3's `fit` fails under tf.distribute.MultiWorkerMirroredStrategy "
    "(keras-team/keras#20585; reproduced with Keras 3.15 and TensorFlow "
    "2.21, experiments/reproductions/mwms_repro.py)"
)


def unsupported_backend_error(feature, reason, fix):
    """The error for a feature that the current backend does not support.

    Every "not supported on this backend" error of keras-isobn reads the
    same way: the feature, the backend, why, and what to do instead.

    Args:
        feature: String, what was asked for, starting with a capital (e.g.
            `"Data-parallel training"`).
        reason: String, why the backend cannot do it.
        fix: String, one or more sentences saying what to do instead (e.g.
            the backends that can, and the argument to change).

    Returns:
        A `ValueError` to raise.

    Example:

    >>> error = unsupported_backend_error(
    ...     "Splitting the CPU into virtual devices",
    ...     "it has no data-parallel engine",
    ...     "Use KERAS_BACKEND=jax or KERAS_BACKEND=tensorflow.",
    ... )
    >>> isinstance(error, ValueError)
    True
    """
    backend = keras.backend.backend()
    return ValueError(
        f"{feature} is not supported on the {backend} backend: {reason}. {fix}"
    )


def check_multi_process_backend():
    """Raises unless the backend trains with several processes (JAX)."""
    backend = keras.backend.backend()
    if backend == "jax":
        return
    if backend == "tensorflow":
        cause = _MWMS_BUG
    else:
        cause = "Keras has no multi-process training on PyTorch"
    raise unsupported_backend_error(
        "Training with several processes",
        cause,
        "Use KERAS_BACKEND=jax (keras.distribution, tested on the loopback), "
        "or one process with `data_parallel_scope('data_parallel')` on "
        "TensorFlow.",
    )
