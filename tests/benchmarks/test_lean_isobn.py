import keras
import numpy as np
import pytest

import keras_isobn
from benchmarks.lean_isobn import LeanIsoBatchNormalization


def to_numpy(x):
    return keras.ops.convert_to_numpy(x).astype("float64")


def batches(rng, count=4, rows=32, dim=12):
    stds = np.exp(rng.uniform(np.log(1e-6), 0.0, size=dim))
    out = [
        (rng.normal(size=(rows, dim)) * stds + 1.0).astype("float32")
        for _ in range(count)
    ]
    out[1][3, 5] = np.nan  # A batch to skip.
    out[2][:, 0] = 0.5  # A feature without variance.
    return out


def scale64(covariance, std, epsilon=1e-3, beta=0.5):
    """IsoBN's scale, written out in float64 NumPy."""
    dim = len(std)
    gamma = np.zeros(dim)
    for i in range(dim):
        for j in range(dim):
            denominator = std[i] * std[j]
            rho = covariance[i, j] / denominator if denominator > 0 else 0.0
            gamma[i] += min(rho * rho, 1.0) / dim
    a = (gamma * std + epsilon) ** -beta
    variance = np.diag(covariance)
    m = np.sqrt(variance.sum() / ((variance * a * a).sum() + epsilon))
    return m * a


@pytest.mark.parametrize("bias_correction", [False, True])
def test_lean_layer_matches_isobn(rng, bias_correction):
    lean = LeanIsoBatchNormalization(bias_correction=bias_correction)
    layer = keras_isobn.IsoBatchNormalization(bias_correction=bias_correction)
    for x in batches(rng):
        y_lean = lean(x, training=True)
        y = layer(x, training=True)
        # NaN in, NaN out, alike.
        np.testing.assert_allclose(to_numpy(y_lean), to_numpy(y), rtol=1e-5)
    for name in ("moving_covariance", "moving_std"):
        np.testing.assert_allclose(
            to_numpy(getattr(lean, name)),
            to_numpy(getattr(layer, name)),
            rtol=1e-5,
            atol=1e-12,
        )
    np.testing.assert_allclose(
        to_numpy(lean.scale()), to_numpy(layer.scale()), rtol=1e-5
    )


def test_lean_scale_matches_float64_formula(rng):
    lean = LeanIsoBatchNormalization(momentum=1.0)
    x = batches(rng)[0]
    lean(x, training=True)
    x64 = x.astype("float64")
    centred = x64 - x64.mean(axis=0)
    covariance = centred.T @ centred / len(x)
    std = np.sqrt(np.diag(covariance))
    np.testing.assert_allclose(
        to_numpy(lean.moving_covariance), covariance, rtol=1e-4, atol=1e-12
    )
    np.testing.assert_allclose(
        to_numpy(lean.scale()),
        scale64(to_numpy(lean.moving_covariance), to_numpy(lean.moving_std)),
        rtol=1e-5,
    )
    # Inputs near 1 hold their small deviations to float32's ~1e-7.
    np.testing.assert_allclose(
        to_numpy(lean.moving_std), std, rtol=1e-4, atol=1e-8
    )


def test_lean_layer_skips_non_finite_batches(rng):
    lean = LeanIsoBatchNormalization()
    x = batches(rng)[1]  # Holds a NaN.
    lean(x, training=True)
    assert np.all(to_numpy(lean.moving_covariance) == 0.0)
    assert np.all(to_numpy(lean.moving_std) == 0.0)
    np.testing.assert_array_equal(to_numpy(lean.scale()), np.ones(12))


def test_lean_layer_rejects_a_mask(rng):
    lean = LeanIsoBatchNormalization()
    x = rng.normal(size=(2, 3, 4)).astype("float32")
    with pytest.raises(ValueError, match="mask"):
        lean(x, training=True, mask=np.ones((2, 3), bool))
