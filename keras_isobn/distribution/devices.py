"""The devices a backend trains on: accelerators, virtual CPU devices."""

import os

import keras

from keras_isobn.distribution.backend_support import unsupported_backend_error

__all__ = ["accelerator_visible", "virtual_cpu_devices"]


def accelerator_visible():
    """Whether the backend sees a GPU or TPU (without starting it twice)."""
    if keras.backend.backend() == "torch":  # No `list_devices` there.
        import torch

        return torch.cuda.is_available()
    devices = keras.distribution.list_devices()
    return any(not device.lower().startswith("cpu") for device in devices)


def virtual_cpu_devices(count):
    """Splits the host CPU into `count` devices, to try data parallelism.

    With them, `data_parallel_scope()` (or any `keras.distribution` or
    `tf.distribute` engine) runs `count` replicas on one machine without
    accelerators, e.g. in tests or on a laptop. Call it first thing, before
    the backend computes anything (on JAX, before any JAX operation; on
    TensorFlow, before its runtime starts).

    Args:
        count: Integer `>= 1`, the number of CPU devices.

    Returns:
        The device names, as `keras.distribution.list_devices("cpu")` gives
        them.

    Raises:
        RuntimeError: if the backend has already started with another
            number of CPU devices.
        ValueError: for `count < 1`, or on a backend without virtual
            devices (PyTorch).
    """
    if int(count) != count or count < 1:
        raise ValueError(
            f"`count` must be an integer >= 1. Received: count={count}"
        )
    count = int(count)
    backend = keras.backend.backend()
    try:
        if backend == "jax":
            import jax

            if hasattr(jax.config, "jax_num_cpu_devices"):
                jax.config.update("jax_num_cpu_devices", count)
            else:  # JAX < 0.4.38
                os.environ["XLA_FLAGS"] = (
                    os.environ.get("XLA_FLAGS", "")
                    + f" --xla_force_host_platform_device_count={count}"
                )
        elif backend == "tensorflow":
            import tensorflow as tf

            cpu = tf.config.list_physical_devices("CPU")[0]
            current = tf.config.get_logical_device_configuration(cpu)
            if len(current or [None]) != count:
                tf.config.set_logical_device_configuration(
                    cpu, [tf.config.LogicalDeviceConfiguration()] * count
                )
        else:
            raise unsupported_backend_error(
                "Splitting the CPU into virtual devices",
                "it has no data-parallel engine",
                "Use KERAS_BACKEND=jax or KERAS_BACKEND=tensorflow.",
            )
    except RuntimeError as error:
        if len(keras.distribution.list_devices("cpu")) == count:
            return keras.distribution.list_devices("cpu")
        raise RuntimeError(
            f"Cannot split the CPU into {count} devices: the {backend} "
            "backend has already started. Call `virtual_cpu_devices()` "
            "before anything is computed, e.g. right after `import keras`. "
            f"Cause: {error}"
        ) from error
    return keras.distribution.list_devices("cpu")
