import keras
import pytest

from keras_isobn import distribution

BACKEND = keras.backend.backend()


def test_virtual_cpu_devices_errors():
    with pytest.raises(ValueError, match="integer >= 1"):
        distribution.virtual_cpu_devices(0)
    if BACKEND == "torch":
        with pytest.raises(ValueError, match="KERAS_BACKEND=jax"):
            distribution.virtual_cpu_devices(2)
        return
    keras.ops.convert_to_numpy(keras.ops.ones(2) + 1)  # The backend runs.
    count = len(keras.distribution.list_devices("cpu"))
    assert distribution.virtual_cpu_devices(count) == (
        keras.distribution.list_devices("cpu")
    )
    with pytest.raises(RuntimeError, match="already started"):
        distribution.virtual_cpu_devices(count + 3)
