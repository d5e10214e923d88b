import keras
import pytest

from keras_isobn.mixed_precision import dtype_policy_scope


def test_the_policy_holds_in_the_block_only():
    with dtype_policy_scope("mixed_bfloat16"):
        assert keras.config.dtype_policy().name == "mixed_bfloat16"
        layer = keras.layers.Dense(2)
    assert layer.dtype_policy.name == "mixed_bfloat16"
    assert keras.config.dtype_policy().name == "float32"
    with dtype_policy_scope(None):
        assert keras.config.dtype_policy().name == "float32"


def test_the_policy_is_restored_after_an_error():
    with pytest.raises(KeyError):
        with dtype_policy_scope("mixed_float16"):
            raise KeyError("in the block")
    assert keras.config.dtype_policy().name == "float32"


def test_docstring_examples():
    import doctest

    import keras_isobn.mixed_precision

    result = doctest.testmod(keras_isobn.mixed_precision)
    assert result.attempted >= 3 and result.failed == 0
