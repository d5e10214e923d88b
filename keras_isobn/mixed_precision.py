"""Mixed precision for a block of code: `dtype_policy_scope()`."""

import contextlib

import keras

__all__ = ["dtype_policy_scope"]


@contextlib.contextmanager
def dtype_policy_scope(name):
    """Sets Keras's global dtype policy for the block, then restores it.

    Models built in the block compute in the policy's dtype (e.g. float16
    or bfloat16 with float32 variables); the policy in force before is set
    again when the block ends, even on an error.

    Args:
        name: A policy name (e.g. `"mixed_float16"`), or `None` to keep
            the current one.

    Example:

    >>> import keras
    >>> with dtype_policy_scope("mixed_bfloat16"):
    ...     layer = keras.layers.Dense(2)
    >>> layer.dtype_policy.name
    'mixed_bfloat16'
    >>> keras.config.dtype_policy().name
    'float32'
    """
    previous = keras.config.dtype_policy()
    if name:
        keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)
