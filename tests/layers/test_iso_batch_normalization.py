import os

import keras
import numpy as np
import pytest
from keras import ops
from keras.src import testing

from keras_isobn import IsoBatchNormalization
from keras_isobn.isotropy import isobn_reference_scale
from tests.helpers.numpy_isobn import NumpyIsoBN


def anisotropic_batches(rng, steps, batch=32, dim=16):
    """Batches with wildly different stds and correlated groups, like [CLS]."""
    mixing = rng.normal(size=(dim, dim)) * np.logspace(-2, 1, dim)
    offset = rng.normal(size=dim) * 3.0
    return [
        (rng.normal(size=(batch, dim)) @ mixing + offset).astype("float32")
        for _ in range(steps)
    ]


def test_matches_float64_reference_over_training_then_inference(rng):
    batches = anisotropic_batches(rng, steps=8)
    layer = IsoBatchNormalization()
    reference = NumpyIsoBN(16)
    for x in batches:
        y = layer(x, training=True)
        expected = reference(x, training=True)
        np.testing.assert_allclose(
            ops.convert_to_numpy(y), expected, rtol=1e-4, atol=1e-5
        )
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer.moving_covariance),
        reference.covariance,
        rtol=1e-5,
        atol=1e-6,
    )
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer.moving_std), reference.std, rtol=1e-5
    )
    probe = anisotropic_batches(rng, steps=1, batch=5)[0]
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer(probe)), reference(probe), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer.scale()), reference.scale(), rtol=1e-5
    )


@pytest.mark.parametrize(
    "momentum, epsilon, beta", [(1.0, 1e-5, 1.0), (0.3, 0.1, 0.25), (0.05, 1e-3, 0.0)]
)
def test_hyperparameters_match_reference(rng, momentum, epsilon, beta):
    layer = IsoBatchNormalization(momentum=momentum, epsilon=epsilon, beta=beta)
    reference = NumpyIsoBN(16, momentum, epsilon, beta)
    for x in anisotropic_batches(rng, steps=3):
        layer(x, training=True)
        reference.update(x)
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer.scale()), reference.scale(), rtol=1e-4
    )


@pytest.mark.parametrize("beta", [0.5, 1.0])
def test_unit_output_variance_matches_reference(rng, beta):
    layer = IsoBatchNormalization(beta=beta, output_variance="unit")
    reference = NumpyIsoBN(16, beta=beta, output_variance="unit")
    batches = anisotropic_batches(rng, steps=6)
    for x in batches:
        np.testing.assert_allclose(
            ops.convert_to_numpy(layer(x, training=True)),
            reference(x, training=True),
            rtol=1e-4,
            atol=1e-5,
        )
    scale = ops.convert_to_numpy(layer.scale())
    np.testing.assert_allclose(scale, reference.scale(), rtol=1e-5)
    # Unit variance on average: sum_i Var_i * scale_i ** 2 = d (up to
    # epsilon), where the paper's scale keeps trace(Cov), far from d here.
    variance = np.diag(reference.covariance)
    np.testing.assert_allclose(np.sum(variance * scale**2), 16.0, rtol=1e-3)
    paper = NumpyIsoBN(16, beta=beta)
    for x in batches:
        paper.update(x)
    assert abs(np.sum(variance * paper.scale() ** 2) - 16.0) > 1.0
    # Inference uses the same scale.
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer(batches[0])),
        reference(batches[0]),
        rtol=1e-4,
        atol=1e-5,
    )


def test_unit_output_variance_without_data_leaves_inputs_unchanged(rng):
    layer = IsoBatchNormalization(output_variance="unit")
    x = rng.normal(size=(4, 8)).astype("float32")
    np.testing.assert_array_equal(ops.convert_to_numpy(layer(x)), x)
    np.testing.assert_array_equal(ops.convert_to_numpy(layer.scale()), 1.0)
    # Constant features (zero variance): finite, still unchanged.
    constant = np.ones((4, 8), "float32")
    y = ops.convert_to_numpy(layer(constant, training=True))
    assert np.all(np.isfinite(y))
    np.testing.assert_array_equal(y, constant)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16", "bfloat16"])
def test_statistics_stay_float32_under_every_policy(rng, policy):
    keras.mixed_precision.set_global_policy(policy)
    layer = IsoBatchNormalization()
    batches = anisotropic_batches(rng, steps=4)
    reference = NumpyIsoBN(16)
    for x in batches:
        y = layer(x, training=True)
        # The reference sees what the layer sees: inputs in the compute dtype.
        reference.update(ops.convert_to_numpy(ops.cast(x, layer.compute_dtype)))
    assert layer.moving_covariance.dtype == "float32"
    assert layer.moving_std.dtype == "float32"
    assert ops.convert_to_numpy(layer.moving_covariance).dtype == np.float32
    assert keras.backend.standardize_dtype(y.dtype) == layer.compute_dtype
    tolerance = 1e-2 if "float16" in policy else 3e-2
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer.scale()), reference.scale(), rtol=1e-4
    )
    out = ops.convert_to_numpy(ops.cast(layer(batches[0]), "float32"))
    np.testing.assert_allclose(
        out, reference(batches[0]), rtol=tolerance, atol=tolerance
    )


def test_mixed_float16_matches_reference_to_half_precision(rng):
    keras.mixed_precision.set_global_policy("mixed_float16")
    layer = IsoBatchNormalization()
    reference = NumpyIsoBN(16)
    for x in anisotropic_batches(rng, steps=5):
        half = x.astype("float16")
        y = layer(half, training=True)
        expected = reference(half, training=True)
        assert np.all(np.isfinite(ops.convert_to_numpy(y)))
        np.testing.assert_allclose(
            ops.convert_to_numpy(y).astype("float64"),
            expected,
            rtol=2e-3,
            atol=2e-3 * np.abs(expected).max(),
        )


def test_fresh_layer_returns_inputs_unchanged(rng):
    x = rng.normal(size=(4, 8)).astype("float32")
    layer = IsoBatchNormalization()
    np.testing.assert_array_equal(ops.convert_to_numpy(layer(x)), x)
    np.testing.assert_array_equal(ops.convert_to_numpy(layer.scale()), np.ones(8))


def test_zero_variance_and_tiny_std_dimensions_stay_finite(rng):
    x = rng.normal(size=(64, 6)).astype("float32")
    x[:, 0] = 2.5  # constant feature: zero variance
    x[:, 1] = 0.0  # all zero
    x[:, 2] *= 1e-33  # real [CLS] vectors have stds this low
    layer = IsoBatchNormalization()
    for batch in np.split(x, 4):
        y = ops.convert_to_numpy(layer(batch, training=True))
        assert np.all(np.isfinite(y))
    scale = ops.convert_to_numpy(layer.scale())
    assert np.all(np.isfinite(scale)) and np.all(scale > 0)
    # The degenerate features get the formula's limit (gamma * std -> 0,
    # correlations 0 where a std is 0); the others are normalised as usual.
    # A std of 1e-33 squares to 1e-66, which is 0 in float32: that feature
    # is seen as having no variance, as it practically has.
    seen = x.copy()
    seen[:, 2] = 0.0
    reference = NumpyIsoBN(6, degenerate_limit=True)
    for batch in np.split(seen, 4):
        reference.update(batch)
    np.testing.assert_allclose(scale, reference.scale(), rtol=1e-4)
    np.testing.assert_allclose(scale[:3], scale[0], rtol=1e-6)
    assert scale[0] > scale[3:].max()


def test_tiny_stds_keep_their_correlations(rng):
    # A std of 1e-15 is far from float32's limits: its feature is counted
    # in the correlated groups exactly as the float64 formula does.
    x = rng.normal(size=(64, 6)).astype("float32")
    x[:, 1] = 1e-15 * x[:, 0]  # fully correlated with feature 0
    x[:, 2] = 1e-12 * (x[:, 0] + x[:, 3])
    layer = IsoBatchNormalization()
    reference = NumpyIsoBN(6)
    for batch in np.split(x, 4):
        layer(batch, training=True)
        reference.update(batch)
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer.scale()), reference.scale(), rtol=1e-4
    )


def test_subnormal_moving_std_gives_a_finite_scale():
    # A moving std that decayed below the smallest normal float32 (or was
    # set so) has an inverse that overflows: its correlations count as 0.
    layer = IsoBatchNormalization()
    layer.build((None, 3))
    std = np.array([1.0, 1e-39, 0.5], "float32")
    covariance = np.outer(std, std).astype("float32")
    covariance[0, 2] = covariance[2, 0] = 0.25
    layer.moving_std.assign(std)
    layer.moving_covariance.assign(covariance)
    scale = ops.convert_to_numpy(layer.scale())
    assert np.all(np.isfinite(scale)) and np.all(scale > 0)
    reference = NumpyIsoBN(3, degenerate_limit=True)
    reference.std = std.astype(np.float64)
    reference.std[1] = 0.0
    reference.covariance = covariance.astype(np.float64)
    reference.covariance[1, :] = reference.covariance[:, 1] = 0.0
    np.testing.assert_allclose(scale, reference.scale(), rtol=1e-5)


def test_batch_of_one_is_safe(rng):
    layer = IsoBatchNormalization()
    x = rng.normal(size=(1, 8)).astype("float32")
    y = ops.convert_to_numpy(layer(x, training=True))
    np.testing.assert_array_equal(y, x)  # no statistics yet: unchanged
    for batch in anisotropic_batches(rng, steps=2, dim=8):
        layer(batch, training=True)
    y = ops.convert_to_numpy(layer(x, training=True))
    assert np.all(np.isfinite(y))
    assert np.all(np.isfinite(ops.convert_to_numpy(layer.moving_covariance)))


def test_non_finite_batch_does_not_poison_statistics(rng):
    layer = IsoBatchNormalization()
    good = anisotropic_batches(rng, steps=2, dim=8)
    for batch in good:
        layer(batch, training=True)
    before_cov = ops.convert_to_numpy(layer.moving_covariance)
    before_std = ops.convert_to_numpy(layer.moving_std)
    # 1e20 is finite, but its square overflows float32: the covariance of
    # its batch would be infinite.
    for value in (np.nan, np.inf, -np.inf, 1e20):
        bad = good[0].copy()
        bad[3, 2] = value
        layer(bad, training=True)
        np.testing.assert_array_equal(
            ops.convert_to_numpy(layer.moving_covariance), before_cov
        )
        np.testing.assert_array_equal(
            ops.convert_to_numpy(layer.moving_std), before_std
        )
    assert np.all(np.isfinite(ops.convert_to_numpy(layer.scale())))


def test_mask_leaves_padded_positions_out_of_statistics(rng):
    batch, seq, dim = 4, 6, 8
    x = rng.normal(size=(batch, seq, dim)).astype("float32") * np.logspace(
        -1, 1, dim
    )
    mask = np.ones((batch, seq), bool)
    mask[0, 3:] = False
    mask[2, 1:] = False
    x_padded = x.copy()
    x_padded[~mask] = 1e4  # garbage at padded positions
    layer = IsoBatchNormalization()
    reference = NumpyIsoBN(dim)
    for _ in range(3):
        y = layer(x_padded, training=True, mask=mask)
        reference.update(x[mask])
    assert tuple(y.shape) == (batch, seq, dim)
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer.moving_covariance),
        reference.covariance,
        rtol=1e-5,
        atol=1e-6,
    )
    np.testing.assert_allclose(
        ops.convert_to_numpy(y)[mask],
        x[mask] * reference.scale(),
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.parametrize("output_variance", ["total", "unit"])
def test_masked_bias_corrected_training_skips_bad_batches_like_reference(
    rng, output_variance
):
    # Masks, skipped batches (non-finite values at kept positions, no kept
    # position at all) and bias correction together, step by step, against
    # the float64 reference updated with the good batches' kept rows only.
    batch, seq, dim, momentum = 4, 6, 8, 0.2
    layer = IsoBatchNormalization(
        momentum=momentum, bias_correction=True, output_variance=output_variance
    )
    reference = NumpyIsoBN(dim, momentum, output_variance=output_variance)
    mixing = rng.normal(size=(dim, dim)) * np.logspace(-2, 1, dim)
    steps = 0
    for bad in [None, "nan", None, "empty", "inf", None, "-inf", None]:
        x = (rng.normal(size=(batch, seq, dim)) @ mixing + 50.0).astype(
            "float32"
        )
        mask = rng.random((batch, seq)) > 0.3
        mask[0, 0] = True
        x[~mask] = 1e4  # garbage at padded positions
        if bad == "empty":
            mask[:] = False
        elif bad is not None:
            x[0, 0, 3] = float(bad)
        y = ops.convert_to_numpy(layer(x, training=True, mask=mask))
        if bad is None:
            reference.update(x[mask])
            steps += 1
        weight = 1.0 - (1.0 - momentum) ** steps
        expected_scale = isobn_reference_scale(
            reference.covariance / weight,
            reference.std / weight,
            output_variance=output_variance,
        )
        np.testing.assert_allclose(
            ops.convert_to_numpy(layer.moving_weight), weight, rtol=1e-6
        )
        np.testing.assert_allclose(
            ops.convert_to_numpy(layer.moving_covariance),
            reference.covariance,
            rtol=1e-5,
            atol=1e-4,
        )
        np.testing.assert_allclose(
            ops.convert_to_numpy(layer.moving_std), reference.std, rtol=1e-5
        )
        np.testing.assert_allclose(
            ops.convert_to_numpy(layer.moving_scale), expected_scale, rtol=1e-4
        )
        finite = np.isfinite(x)
        np.testing.assert_allclose(
            y[finite], (x * expected_scale)[finite], rtol=1e-4
        )


def test_all_masked_batch_leaves_statistics_unchanged(rng):
    layer = IsoBatchNormalization()
    x = rng.normal(size=(2, 3, 4)).astype("float32")
    layer(x, training=True)
    before = ops.convert_to_numpy(layer.moving_covariance)
    layer(x, training=True, mask=np.zeros((2, 3), bool))
    np.testing.assert_array_equal(
        ops.convert_to_numpy(layer.moving_covariance), before
    )


def test_keras_masking_propagates_through_the_layer(rng):
    tokens = rng.integers(1, 20, size=(3, 5))
    tokens[0, 3:] = 0
    inputs = keras.Input(shape=(5,), dtype="int32")
    embedded = keras.layers.Embedding(20, 8, mask_zero=True)(inputs)
    normalised = IsoBatchNormalization()(embedded)
    model = keras.Model(inputs, normalised)
    out = model(tokens)
    assert tuple(out.shape) == (3, 5, 8)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(out._keras_mask), tokens != 0
    )


def test_rank_3_inputs_use_every_position(rng):
    x = rng.normal(size=(3, 5, 8)).astype("float32")
    layer = IsoBatchNormalization()
    reference = NumpyIsoBN(8)
    y = layer(x, training=True)
    reference.update(x.reshape(-1, 8))
    assert tuple(y.shape) == x.shape
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer.moving_covariance),
        reference.covariance,
        rtol=1e-5,
        atol=1e-6,
    )


def test_bias_correction_removes_zero_start(rng):
    x = anisotropic_batches(rng, steps=1)[0]
    corrected = IsoBatchNormalization(bias_correction=True)
    corrected(x, training=True)
    # After one step the debiased statistics are the batch's own ones.
    batch_only = NumpyIsoBN(16, momentum=1.0)
    batch_only.update(x)
    np.testing.assert_allclose(
        ops.convert_to_numpy(corrected.scale()), batch_only.scale(), rtol=1e-4
    )
    np.testing.assert_allclose(
        ops.convert_to_numpy(corrected.moving_weight), 0.05, rtol=1e-6
    )
    # Without the correction correlations are inflated by 1 / momentum.
    plain = IsoBatchNormalization()
    plain(x, training=True)
    reference = NumpyIsoBN(16)
    reference.update(x)
    np.testing.assert_allclose(
        ops.convert_to_numpy(plain.scale()), reference.scale(), rtol=1e-4
    )
    assert not np.allclose(reference.scale(), batch_only.scale(), rtol=1e-2)


def test_frozen_layer_does_not_update(rng):
    layer = IsoBatchNormalization()
    x = anisotropic_batches(rng, steps=1)[0]
    layer(x, training=True)
    before = ops.convert_to_numpy(layer.moving_covariance)
    layer.trainable = False
    layer(x * 3.0, training=True)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(layer.moving_covariance), before
    )


def _input_gradient(layer, x, weights):
    """d sum(layer(x, training=True) * weights) / dx on the current backend."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(layer(x, training=True) * weights)
        return tape.gradient(loss, x).numpy()
    if backend == "jax":
        import jax

        def loss(x, non_trainable):
            y, _ = layer.stateless_call([], non_trainable, x, training=True)
            return (y * weights).sum()

        values = [v.value for v in layer.non_trainable_variables]
        return np.asarray(jax.grad(loss)(x, values))
    import torch

    x = torch.tensor(x, requires_grad=True)
    loss = (layer(x, training=True) * torch.tensor(weights)).sum()
    loss.backward()
    return x.grad.numpy()


def test_gradient_is_the_detached_scale(rng):
    batches = anisotropic_batches(rng, steps=3, dim=8)
    layer = IsoBatchNormalization()
    for x in batches[:2]:
        layer(x, training=True)
    weights = rng.normal(size=batches[2].shape).astype("float32")
    grad = _input_gradient(layer, batches[2], weights)
    reference = NumpyIsoBN(8)
    for x in batches:
        reference.update(x)
    np.testing.assert_allclose(
        grad, weights * reference.scale(), rtol=1e-4, atol=1e-6
    )


def test_compiled_fit_updates_statistics_like_the_reference(rng):
    x = np.concatenate(anisotropic_batches(rng, steps=6, batch=16, dim=8))
    y = rng.normal(size=(len(x), 1)).astype("float32")
    inputs = keras.Input(shape=(8,))
    layer = IsoBatchNormalization()
    outputs = keras.layers.Dense(1)(layer(inputs))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    reference = NumpyIsoBN(8)
    for _ in range(2):
        for batch in np.split(x, 6):
            reference.update(batch)
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer.moving_covariance),
        reference.covariance,
        rtol=1e-4,
        atol=1e-6,
    )
    np.testing.assert_allclose(
        model.predict(x, verbose=0),
        ops.convert_to_numpy(model.layers[-1](x * reference.scale())),
        rtol=1e-4,
        atol=1e-5,
    )


def test_saved_and_reloaded_model_is_identical(rng, tmp_path):
    x = np.concatenate(anisotropic_batches(rng, steps=4, batch=16, dim=8))
    inputs = keras.Input(shape=(8,))
    outputs = keras.layers.Dense(2)(
        IsoBatchNormalization(beta=0.4, bias_correction=True)(inputs)
    )
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, x[:, :2], batch_size=16, epochs=1, verbose=0)
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    layer, restored_layer = model.layers[1], restored.layers[1]
    assert isinstance(restored_layer, IsoBatchNormalization)
    assert restored_layer.get_config() == layer.get_config()
    for a, b in zip(layer.weights, restored_layer.weights):
        np.testing.assert_array_equal(
            ops.convert_to_numpy(a), ops.convert_to_numpy(b)
        )
    np.testing.assert_array_equal(
        model.predict(x, verbose=0), restored.predict(x, verbose=0)
    )


def test_inference_multiplies_by_the_scale_of_the_last_update(rng):
    layer = IsoBatchNormalization()
    reference = NumpyIsoBN(8)
    for batch in anisotropic_batches(rng, steps=3, dim=8):
        layer(batch, training=True)
        reference.update(batch)
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer.moving_scale), reference.scale(), rtol=1e-4
    )
    x = rng.normal(size=(5, 8)).astype("float32")
    np.testing.assert_array_equal(
        ops.convert_to_numpy(layer(x)),
        x * ops.convert_to_numpy(layer.moving_scale),
    )
    # Statistics assigned by hand reach inference once the scale is updated.
    layer.moving_covariance.assign(np.eye(8, dtype="float32"))
    layer.moving_std.assign(np.ones(8, "float32"))
    assert not np.allclose(ops.convert_to_numpy(layer(x)), x)
    layer.update_moving_scale()
    np.testing.assert_allclose(ops.convert_to_numpy(layer(x)), x, rtol=1e-4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"momentum": 0.0}, "momentum=0.0"),
        ({"momentum": 1.5}, "momentum=1.5"),
        ({"epsilon": 0.0}, "epsilon=0.0"),
        ({"epsilon": -1e-3}, "epsilon=-0.001"),
        ({"beta": -0.5}, "beta=-0.5"),
        ({"output_variance": "same"}, "output_variance='same'"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        IsoBatchNormalization(**kwargs)


def test_bad_input_shapes_raise():
    with pytest.raises(ValueError, match="rank >= 2"):
        IsoBatchNormalization()(np.ones((4,), "float32"))
    with pytest.raises(ValueError, match="last axis"):
        IsoBatchNormalization().build((None, None))


class IsoBatchNormalizationLayerTest(testing.TestCase):
    def test_keras_layer_conventions(self):
        self.run_layer_test(
            IsoBatchNormalization,
            init_kwargs={"momentum": 0.1, "beta": 0.5},
            input_shape=(4, 3),
            expected_output_shape=(4, 3),
            expected_num_trainable_weights=0,
            expected_num_non_trainable_weights=3,
            expected_num_seed_generators=0,
            expected_num_losses=0,
            supports_masking=True,
        )
        self.run_layer_test(
            IsoBatchNormalization,
            init_kwargs={"bias_correction": True, "synchronized": False},
            input_shape=(2, 5, 3),
            expected_output_shape=(2, 5, 3),
            expected_num_trainable_weights=0,
            expected_num_non_trainable_weights=4,
            supports_masking=True,
        )

    def test_config_round_trip(self):
        layer = IsoBatchNormalization(
            momentum=0.1,
            epsilon=1e-4,
            beta=0.7,
            output_variance="unit",
            bias_correction=True,
            name="iso",
        )
        clone = IsoBatchNormalization.from_config(layer.get_config())
        self.assertEqual(clone.get_config(), layer.get_config())
        self.assertEqual(clone.name, "iso")


def test_synchronized_outside_a_strategy_is_the_plain_batch(rng):
    if keras.backend.backend() == "torch":
        with pytest.raises(ValueError, match="synchronized=True"):
            IsoBatchNormalization(synchronized=True)
        return
    layer = IsoBatchNormalization(synchronized=True)
    reference = NumpyIsoBN(16)
    for x in anisotropic_batches(rng, steps=3):
        y = layer(x, training=True)
        np.testing.assert_allclose(
            ops.convert_to_numpy(y), reference(x, training=True), rtol=1e-4, atol=1e-5
        )
    mask = np.arange(32) % 3 > 0
    layer(x, training=True, mask=mask)
    reference.update(x[mask])
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer.moving_covariance),
        reference.covariance,
        rtol=1e-5,
        atol=1e-6,
    )
