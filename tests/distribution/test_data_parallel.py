"""Data-parallel training of IsoBN models.

The data-parallel runs need 4 virtual CPU devices, set before the backend
starts, so `tests/helpers/distribution_worker.py` runs them in a subprocess
(once per test module) and saves what they end with; the tests assert on it
against independent float64 NumPy statistics and a single-device run. They
exist on TensorFlow and JAX; on PyTorch the tests check the errors instead.
"""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_isobn import distribution
from tests.helpers.small_models import small_data
from tests.helpers.small_models import small_model

BACKEND = keras.backend.backend()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
# As in the worker: 4 replicas, global batches of 16, IsoBN's momentum.
REPLICAS, BATCH, MOMENTUM = 4, 16, 0.05
# The worker's runs on several devices: JAX also runs a 2x2 model-parallel
# layout; TensorFlow also runs without synchronized statistics.
# The worker's runs on several devices: JAX also runs a 2x2 model-parallel
# layout; TensorFlow also runs without synchronized statistics.
PARALLEL_RUNS = {
    "tensorflow": ["data_parallel"],
    "jax": ["data_parallel", "model_parallel"],
}.get(BACKEND, [])


def reference_statistics(batches):
    """Float64 moving covariance and std after updating on each batch.

    Args:
        batches: List of `(rows, features)` arrays, the unmasked positions
            of each batch.
    """
    dim = batches[0].shape[-1]
    covariance, std = np.zeros((dim, dim)), np.zeros(dim)
    for rows in batches:
        centred = rows - rows.mean(axis=0)
        batch_covariance = centred.T @ centred / len(rows)
        covariance += MOMENTUM * (batch_covariance - covariance)
        std += MOMENTUM * (np.sqrt(np.diag(batch_covariance)) - std)
    return covariance, std


def unmasked_rows(x):
    """The positions that `keras.layers.Masking(0.0)` keeps, as rows."""
    x = np.asarray(x, "float64")
    return x[np.any(x != 0.0, axis=-1)]


def assert_close(actual, expected, what):
    np.testing.assert_allclose(
        actual, expected, rtol=1e-5, atol=1e-5, err_msg=what
    )


if PARALLEL_RUNS:

    @pytest.fixture(scope="module")
    def runs(tmp_path_factory):
        """What the worker's runs on 1 device and on 4 replicas end with."""
        path = tmp_path_factory.mktemp("distribution") / "runs.npz"
        env = dict(os.environ, KERAS_BACKEND=BACKEND, TF_CPP_MIN_LOG_LEVEL="3")
        done = subprocess.run(
            [sys.executable, "-m", "tests.helpers.distribution_worker", path],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-5000:]
        with np.load(path) as data:
            return dict(data)

    def test_worker_ran_on_four_devices(runs):
        assert len(runs["devices"]) == REPLICAS
        for run in PARALLEL_RUNS + ["classifier_data_parallel"]:
            name = "pooled_normalization" if "classifier" in run else "iso_in"
            copies = runs[f"{run}/{name}/moving_covariance/replicas"]
            assert copies.shape[0] == REPLICAS, run
        assert runs["single/iso_in/moving_covariance/replicas"].shape[0] == 1

    def test_replicas_hold_the_same_statistics(runs):
        for run in PARALLEL_RUNS + ["classifier_data_parallel"]:
            names = ["pooled_normalization"]
            if "classifier" not in run:
                names = ["iso_in", "iso_hidden"]
            for name in names:
                for stat in ("moving_covariance", "moving_std"):
                    copies = runs[f"{run}/{name}/{stat}/replicas"]
                    for copy in copies[1:]:
                        np.testing.assert_array_equal(
                            copy, copies[0], err_msg=f"{run}/{name}"
                        )

    def test_statistics_are_the_global_batch(runs):
        x = runs["x"]
        batches = [
            unmasked_rows(x[i : i + BATCH]) for i in range(0, len(x), BATCH)
        ]
        covariance, std = reference_statistics(batches)
        for run in ["single"] + PARALLEL_RUNS:
            assert_close(
                runs[f"{run}/iso_in/moving_covariance"], covariance, run
            )
            assert_close(runs[f"{run}/iso_in/moving_std"], std, run)
        # The replicas' shares of a batch hold different numbers of
        # positions: the mean of their own statistics would be wrong.
        share = BATCH // REPLICAS
        counts = {
            len(unmasked_rows(x[i : i + share])) for i in range(0, BATCH, share)
        }
        assert len(counts) > 1

    def test_parallel_training_matches_one_device(runs):
        names = [
            k[len("single/") :]
            for k in runs
            if k.startswith("single/")
            and not k.endswith("/replicas")
            and not k.endswith("shard_shape")
        ]
        assert "predictions" in names
        assert "iso_hidden/moving_covariance" in names
        assert "weights/hidden/kernel" in names
        for run in PARALLEL_RUNS:
            for name in names:
                what = f"{run}/{name}"
                assert_close(runs[what], runs[f"single/{name}"], what)

    def test_classifier_fit_matches_one_device(runs):
        prefix = "classifier_single/"
        names = [
            k[len(prefix) :]
            for k in runs
            if k.startswith(prefix) and not k.endswith("/replicas")
        ]
        assert "pooled_normalization/moving_covariance" in names
        assert "weights/logits/kernel" in names
        for name in names:
            assert_close(
                runs[f"classifier_data_parallel/{name}"],
                runs[f"classifier_single/{name}"],
                name,
            )
        assert np.isfinite(runs["classifier_data_parallel/loss"])
        std = runs["classifier_data_parallel/pooled_normalization/moving_std"]
        assert np.all(std > 0)


if BACKEND == "tensorflow":

    def test_unsynchronized_replicas_keep_their_own_statistics(runs):
        x, share = runs["x"], BATCH // REPLICAS
        copies = runs["unsynchronized/iso_in/moving_covariance/replicas"]
        stds = runs["unsynchronized/iso_in/moving_std/replicas"]
        for replica in range(REPLICAS):
            rows = slice(replica * share, (replica + 1) * share)
            batches = [
                unmasked_rows(x[i : i + BATCH][rows])
                for i in range(0, len(x), BATCH)
            ]
            covariance, std = reference_statistics(batches)
            assert_close(copies[replica], covariance, f"replica {replica}")
            assert_close(stds[replica], std, f"replica {replica}")
        # What `moving_covariance` reads (and a checkpoint saves) is the
        # first replica's.
        np.testing.assert_array_equal(
            runs["unsynchronized/iso_in/moving_covariance"], copies[0]
        )


if BACKEND == "jax":

    def test_model_parallel_split_the_kernel(runs):
        # The (6, 6) kernel of "hidden" is split in 2 along "model".
        np.testing.assert_array_equal(
            runs["model_parallel/hidden_kernel_shard_shape"], [6, 3]
        )
        np.testing.assert_array_equal(
            runs["data_parallel/hidden_kernel_shard_shape"], [6, 6]
        )


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="'data_parallel'.*None"):
        with distribution.data_parallel_scope("model_parallel"):
            pass


def test_without_distribution_training_is_as_usual():
    with distribution.data_parallel_scope(None) as replicas:
        model = small_model()
        x, y = small_data()
        history = model.fit(x, y, batch_size=8, verbose=0)
    assert replicas == 1
    assert np.isfinite(history.history["loss"][0])
    std = keras.ops.convert_to_numpy(model.get_layer("iso").moving_std)
    assert np.all(std > 0)


def test_data_parallel_scope():
    if BACKEND == "torch":
        with pytest.raises(ValueError, match="single process.*tensorflow.*jax"):
            with distribution.data_parallel_scope("data_parallel"):
                pass
        return
    devices = keras.distribution.list_devices()
    with distribution.data_parallel_scope() as replicas:
        assert replicas == len(devices)
        if BACKEND == "jax":
            current = keras.distribution.distribution()
            assert isinstance(current, keras.distribution.DataParallel)
        else:
            import tensorflow as tf

            strategy = tf.distribute.get_strategy()
            assert isinstance(strategy, tf.distribute.MirroredStrategy)
            assert strategy.num_replicas_in_sync == replicas
    # Left as it was after the block.
    assert keras.distribution.distribution() is None
    if BACKEND == "tensorflow":
        import tensorflow as tf

        assert not tf.distribute.has_strategy()
        # The same devices get the same strategy (a second one in the
        # process would abort its collectives).
        with distribution.data_parallel_scope():
            first = tf.distribute.get_strategy()
        with distribution.data_parallel_scope():
            assert tf.distribute.get_strategy() is first


def test_synchronize_statistics():
    model = small_model()
    iso, bn = model.get_layer("iso"), model.get_layer("bn")
    if BACKEND == "torch":
        with pytest.raises(ValueError, match="single process"):
            distribution.synchronize_statistics(model)
        return
    layers = distribution.synchronize_statistics(model)
    if BACKEND == "tensorflow":
        assert layers == [iso, bn]
        assert iso.synchronized and bn.synchronized
        assert iso.get_config()["synchronized"]
    else:
        assert layers == []
        assert not iso.synchronized and not bn.synchronized
