import keras
import numpy as np

from benchmarks.whitening import IterNormWhitening
from benchmarks.whitening import ZCAWhitening


def correlated(rng, rows=64, dim=6):
    mixing = rng.normal(size=(dim, dim)) * rng.uniform(0.2, 3.0, size=dim)
    return (rng.normal(size=(rows, dim)) @ mixing + 2.0).astype("float32")


def covariance64(x, epsilon):
    x = x.astype("float64")
    centred = x - x.mean(axis=0)
    return centred, centred.T @ centred / len(x) + epsilon * np.eye(x.shape[1])


def test_zca_whitens_like_float64_eigh(rng):
    x = correlated(rng)
    layer = ZCAWhitening(momentum=0.1, epsilon=1e-5)
    y = keras.ops.convert_to_numpy(layer(x, training=True))

    centred, cov = covariance64(x, 1e-5)
    values, vectors = np.linalg.eigh(cov)
    whitening = vectors @ np.diag(values**-0.5) @ vectors.T
    np.testing.assert_allclose(y, centred @ whitening, rtol=1e-3, atol=1e-3)
    # Whitened: identity covariance (up to epsilon).
    covariance = np.cov(y.astype("float64"), rowvar=False, bias=True)
    np.testing.assert_allclose(covariance, np.eye(6), atol=1e-3)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(layer.moving_whitening),
        np.eye(6) + 0.1 * (whitening - np.eye(6)), rtol=1e-3, atol=1e-3,
    )
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(layer.moving_mean),
        0.1 * x.astype("float64").mean(axis=0), rtol=1e-5,
    )


def test_iternorm_is_newton_iteration_in_float64(rng):
    x = correlated(rng)
    layer = IterNormWhitening(iterations=5, epsilon=1e-5)
    y = keras.ops.convert_to_numpy(layer(x, training=True))

    centred, cov = covariance64(x, 1e-5)
    trace = np.trace(cov)
    p = np.eye(6)
    for _ in range(5):
        p = 1.5 * p - 0.5 * np.linalg.matrix_power(p, 3) @ (cov / trace)
    whitened = centred @ (p / np.sqrt(trace))
    np.testing.assert_allclose(y, whitened, rtol=1e-3, atol=1e-3)


def test_iternorm_whitens_a_well_conditioned_batch(rng):
    # Newton's iteration converges in ~8 steps here (and, being unstable
    # in floating point, diverges after ~20: IterNorm keeps T small).
    x = rng.normal(size=(256, 4)).astype("float32") * [1.0, 1.5, 2.0, 0.8]
    layer = IterNormWhitening(iterations=8, epsilon=1e-5)
    y = keras.ops.convert_to_numpy(layer(x, training=True)).astype("float64")
    covariance = np.cov(y, rowvar=False, bias=True)
    np.testing.assert_allclose(covariance, np.eye(4), atol=1e-3)


def test_inference_uses_moving_statistics(rng):
    x = correlated(rng)
    layer = ZCAWhitening(momentum=0.5)
    layer(x, training=True)
    mean = keras.ops.convert_to_numpy(layer.moving_mean).astype("float64")
    whitening = keras.ops.convert_to_numpy(layer.moving_whitening)
    y = keras.ops.convert_to_numpy(layer(x, training=False))
    expected = (x - mean) @ whitening.astype("float64")
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)


def test_mixed_float16_keeps_float32_statistics(rng):
    x = correlated(rng).astype("float16")
    for layer in (ZCAWhitening(dtype="mixed_float16"),
                  IterNormWhitening(dtype="mixed_float16")):
        y = layer(x, training=True)
        assert keras.backend.standardize_dtype(y.dtype) == "float16"
        assert layer.moving_whitening.dtype == "float32"
        assert np.all(np.isfinite(keras.ops.convert_to_numpy(y)))
