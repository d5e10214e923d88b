import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The recipe turns on JAX's compilation cache (`runtime.cache_compilations`):
# not in the tests' processes, which would write to the user's cache.
# `tests/test_runtime.py` tests it in processes of their own.
os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts from the float32 policy and a fixed seed."""
    keras.mixed_precision.set_global_policy("float32")
    keras.utils.set_random_seed(1337)
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.fixture
def rng():
    return np.random.default_rng(1337)
