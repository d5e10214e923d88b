import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from keras_isobn.optimizers import WarmupLinearDecay
from keras_isobn.optimizers import fine_tuning_adamw


def _rates(schedule, steps):
    return [float(keras.ops.convert_to_numpy(schedule(step))) for step in steps]


def test_warmup_peak_decay_and_end():
    schedule = WarmupLinearDecay(2e-3, total_steps=100, warmup_steps=20)
    steps = [0, 10, 19, 20, 60, 99, 100, 150]
    expected = [0.0, 1e-3, 1.9e-3, 2e-3, 1e-3, 2.5e-5, 0.0, 0.0]
    np.testing.assert_allclose(_rates(schedule, steps), expected, atol=1e-9)
    # Integer and float tensors as steps (optimizer iterations are int).
    np.testing.assert_allclose(
        _rates(schedule, [keras.ops.convert_to_tensor(10, "int32")]), [1e-3]
    )


def test_no_warmup_starts_at_the_peak():
    schedule = WarmupLinearDecay(1.0, total_steps=4)
    np.testing.assert_allclose(
        _rates(schedule, [0, 1, 2, 3, 4, 5]), [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    )
    # All steps warmup: linear to the peak at the end, then 0 after it.
    schedule = WarmupLinearDecay(1.0, total_steps=4, warmup_steps=4)
    np.testing.assert_allclose(
        _rates(schedule, [0, 2, 3, 5]), [0.0, 0.5, 0.75, 0.0]
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"total_steps": 0},
        {"total_steps": -3},
        {"total_steps": 10, "warmup_steps": -1},
        {"total_steps": 10, "warmup_steps": 11},
    ],
)
def test_bad_arguments_raise(kwargs):
    with pytest.raises(ValueError, match="total_steps"):
        WarmupLinearDecay(1e-3, **kwargs)


def test_config_and_registered_serialization_round_trip():
    schedule = WarmupLinearDecay(3e-4, total_steps=50, warmup_steps=5)
    config = schedule.get_config()
    assert config == {
        "peak_learning_rate": 3e-4,
        "total_steps": 50,
        "warmup_steps": 5,
    }
    assert json.loads(json.dumps(config)) == config
    clone = WarmupLinearDecay.from_config(config)
    assert clone.get_config() == config

    serialized = keras.saving.serialize_keras_object(schedule)
    assert serialized["registered_name"] == "keras_isobn>WarmupLinearDecay"
    assert (
        keras.saving.get_registered_object("keras_isobn>WarmupLinearDecay")
        is WarmupLinearDecay
    )
    restored = keras.saving.deserialize_keras_object(
        json.loads(json.dumps(serialized))
    )
    assert type(restored) is WarmupLinearDecay
    assert restored.get_config() == config
    steps = [0, 3, 5, 27, 50]
    assert _rates(restored, steps) == _rates(schedule, steps)


def test_fine_tuning_adamw_schedule_and_options():
    optimizer = fine_tuning_adamw(
        5e-5, total_steps=200, warmup_ratio=0.1, weight_decay=0.01
    )
    assert isinstance(optimizer, keras.optimizers.AdamW)
    config = optimizer.get_config()
    assert config["weight_decay"] == 0.01
    assert config["epsilon"] == 1e-6
    schedule = keras.saving.deserialize_keras_object(config["learning_rate"])
    assert type(schedule) is WarmupLinearDecay
    assert schedule.get_config() == {
        "peak_learning_rate": 5e-5,
        "total_steps": 200,
        "warmup_steps": 20,
    }
    for ratio in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match="warmup_ratio"):
            fine_tuning_adamw(1e-3, total_steps=10, warmup_ratio=ratio)


def test_weight_decay_spares_biases_and_normalization_scales():
    # Zero gradients: Adam's step is 0, so only the decoupled weight decay
    # moves a variable, by `learning_rate * weight_decay * value`.
    names = ["kernel", "bias", "gamma", "beta", "embeddings"]
    variables = [
        keras.Variable(np.full((3,), 2.0, "float32"), name=name)
        for name in names
    ]
    optimizer = fine_tuning_adamw(
        0.1, total_steps=10, warmup_ratio=0.0, weight_decay=0.5
    )
    optimizer.apply_gradients(
        [(keras.ops.zeros((3,)), variable) for variable in variables]
    )
    values = {
        name: keras.ops.convert_to_numpy(variable)
        for name, variable in zip(names, variables)
    }
    decayed = 2.0 * (1.0 - 0.1 * 0.5)
    np.testing.assert_allclose(values["kernel"], decayed, rtol=1e-6)
    np.testing.assert_allclose(values["embeddings"], decayed, rtol=1e-6)
    for name in ("bias", "gamma", "beta"):
        np.testing.assert_array_equal(values[name], 2.0)


def test_weight_decay_in_a_model_with_layer_normalization():
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(4, bias_initializer="ones", name="dense"),
            keras.layers.LayerNormalization(name="layer_normalization"),
        ]
    )
    optimizer = fine_tuning_adamw(
        0.1, total_steps=10, warmup_ratio=0.0, weight_decay=0.5
    )
    before = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
    optimizer.apply_gradients(
        [(keras.ops.zeros(v.shape), v) for v in model.trainable_variables]
    )
    after = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
    changed = {
        "/".join(variable.path.split("/")[-2:]): not np.array_equal(old, new)
        for variable, old, new in zip(model.trainable_variables, before, after)
    }
    assert changed == {
        "dense/kernel": True,
        "dense/bias": False,
        "layer_normalization/gamma": False,
        "layer_normalization/beta": False,
    }
    np.testing.assert_allclose(after[0], before[0] * 0.95, rtol=1e-6)



NAMES = ["kernel", "bias", "gamma", "beta", "embeddings"]


def _train_by_hand(optimizer, steps=5):
    """Variable values after `steps` updates with fixed random gradients."""
    rng = np.random.default_rng(7)
    variables = [
        keras.Variable(rng.normal(size=(4, 3)).astype("float32"), name=name)
        for name in NAMES
    ]
    for _ in range(steps):
        gradients = [
            keras.ops.convert_to_tensor(rng.normal(size=(4, 3)), "float32")
            for _ in variables
        ]
        optimizer.apply_gradients(zip(gradients, variables))
    return [keras.ops.convert_to_numpy(v) for v in variables]


@pytest.mark.parametrize("weight_decay", [0.0, 0.3])
def test_updates_exactly_as_keras_adamw_with_the_schedule_by_hand(
    weight_decay,
):
    schedule = dict(total_steps=8, warmup_ratio=0.25)
    ours = _train_by_hand(
        fine_tuning_adamw(0.1, weight_decay=weight_decay, **schedule)
    )
    reference = keras.optimizers.AdamW(
        learning_rate=WarmupLinearDecay(0.1, total_steps=8, warmup_steps=2),
        weight_decay=weight_decay,
        epsilon=1e-6,
    )
    reference.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    expected = _train_by_hand(reference)
    for name, value, want in zip(NAMES, ours, expected):
        np.testing.assert_array_equal(value, want, err_msg=name)
    if weight_decay:
        # The decay did act, on the kernel and embeddings only.
        undecayed = keras.optimizers.Adam(
            learning_rate=WarmupLinearDecay(0.1, total_steps=8, warmup_steps=2),
            epsilon=1e-6,
        )
        plain = dict(zip(NAMES, _train_by_hand(undecayed)))
        for name, value in zip(NAMES, ours):
            if name in ("bias", "gamma", "beta"):
                np.testing.assert_allclose(value, plain[name], rtol=1e-6)
            else:
                assert np.abs(value - plain[name]).max() > 1e-3, name


def test_is_an_instance_of_the_class_keras_adamw_builds():
    # On PyTorch, Keras's batched update belongs to that class only.
    optimizer = fine_tuning_adamw(1e-4, total_steps=10)
    assert isinstance(optimizer, type(keras.optimizers.AdamW()))
    assert isinstance(optimizer, keras.optimizers.AdamW)


@pytest.mark.skipif(
    keras.backend.backend() != "torch", reason="PyTorch's profiler"
)
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_torch_step_runs_no_more_operations_than_keras_adamw(weight_decay):
    import torch

    def operations(optimizer, count=40):
        variables = [
            keras.Variable(np.ones((3,), "float32"), name=f"kernel_{i}")
            for i in range(count)
        ]
        pairs = [(keras.ops.ones((3,)), v) for v in variables]
        optimizer.apply_gradients(pairs)  # Builds the optimizer.
        with torch.profiler.profile() as profile:
            optimizer.apply_gradients(pairs)
        names = [
            event.name
            for event in profile.events()
            if event.name.startswith("aten::")
            and not (
                event.cpu_parent is not None
                and event.cpu_parent.name.startswith("aten::")
            )
        ]
        return len(names), names.count("aten::_local_scalar_dense")

    ours, ours_syncs = operations(
        fine_tuning_adamw(1e-4, total_steps=1000, weight_decay=weight_decay)
    )
    reference = keras.optimizers.AdamW(
        WarmupLinearDecay(1e-4, total_steps=1000, warmup_steps=60),
        weight_decay=weight_decay,
        epsilon=1e-6,
    )
    keras_ops, keras_syncs = operations(reference)
    # An update variable by variable would add about 20 per variable (800
    # here).
    assert ours <= keras_ops, (ours, keras_ops)
    assert ours_syncs == keras_syncs == 0

# Loads the model with only `keras_isobn` imported and reports its optimizer.
RELOAD = textwrap.dedent(
    """
    import json
    import sys

    import keras
    import keras_isobn  # noqa: F401

    model = keras.saving.load_model(sys.argv[1])
    optimizer = model.optimizer
    config = optimizer.get_config() if optimizer is not None else None
    x = keras.ops.ones((2, 3))
    print(json.dumps({
        "compiled": bool(model.compiled),
        "adamw": isinstance(optimizer, keras.optimizers.AdamW),
        "iterations": int(keras.ops.convert_to_numpy(optimizer.iterations)),
        "schedule": config["learning_rate"]["class_name"],
        "schedule_config": config["learning_rate"]["config"],
        "weight_decay": config["weight_decay"],
        "recipe_loaded": any(name.startswith("recipes") for name in sys.modules),
        "outputs": keras.ops.convert_to_numpy(model(x)).tolist(),
    }))
    """
)


def test_saved_model_reloads_compiled_in_a_fresh_process(tmp_path):
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(
        optimizer=fine_tuning_adamw(
            1e-2, total_steps=20, warmup_ratio=0.25, weight_decay=0.01
        ),
        loss="mse",
    )
    rng = np.random.default_rng(0)
    model.fit(
        rng.normal(size=(12, 3)).astype("float32"),
        rng.normal(size=(12, 2)).astype("float32"),
        batch_size=4,
        epochs=1,
        verbose=0,
    )
    path = str(tmp_path / "model.keras")
    model.save(path)
    result = subprocess.run(
        [sys.executable, "-c", RELOAD, path],
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        timeout=300,
        cwd=str(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["compiled"]
    assert report["adamw"]
    assert report["iterations"] == 3
    assert report["schedule"] == "WarmupLinearDecay"
    assert report["schedule_config"] == {
        "peak_learning_rate": 1e-2,
        "total_steps": 20,
        "warmup_steps": 5,
    }
    assert report["weight_decay"] == 0.01
    assert not report["recipe_loaded"]
    np.testing.assert_allclose(
        report["outputs"],
        keras.ops.convert_to_numpy(model(keras.ops.ones((2, 3)))),
        rtol=1e-6,
    )


def test_reloaded_optimizer_still_spares_biases(tmp_path):
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(2, bias_initializer="ones")]
    )
    model.compile(
        optimizer=fine_tuning_adamw(
            0.1, total_steps=10, warmup_ratio=0.0, weight_decay=0.5
        ),
        loss="mse",
    )
    model.optimizer.build(model.trainable_variables)
    model.save(str(tmp_path / "model.keras"))
    reloaded = keras.saving.load_model(str(tmp_path / "model.keras"))
    reloaded.optimizer.apply_gradients(
        [(keras.ops.zeros(v.shape), v) for v in reloaded.trainable_variables]
    )
    bias = keras.ops.convert_to_numpy(reloaded.layers[0].bias)
    np.testing.assert_array_equal(bias, 1.0)


def test_docstring_examples():
    import doctest

    import keras_isobn.optimizers

    result = doctest.testmod(keras_isobn.optimizers)
    assert result.attempted >= 2 and result.failed == 0
