import keras

from keras_isobn import distribution


def test_unsupported_backend_error_names_the_backend_and_the_fix():
    error = distribution.unsupported_backend_error(
        "Data-parallel training", "one device only", "Use kind=None."
    )
    assert isinstance(error, ValueError)
    backend = keras.backend.backend()
    assert str(error) == (
        "Data-parallel training is not supported on the "
        f"{backend} backend: one device only. Use kind=None."
    )


def test_docstring_examples():
    import doctest

    from keras_isobn.distribution import backend_support

    result = doctest.testmod(backend_support)
    assert result.attempted >= 2 and result.failed == 0
