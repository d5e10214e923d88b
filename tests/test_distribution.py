"""Data-parallel training and fault tolerance of IsoBN models.

The data-parallel runs need 4 virtual CPU devices, set before the backend
starts, so `distribution_worker.py` runs them in a subprocess (once per
test session) and saves what they end with; the tests assert on it against
independent float64 NumPy statistics and a single-device run. They exist
on TensorFlow and JAX; on PyTorch the tests check the errors instead.
"""

import os
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from keras_isobn import distribution
from keras_isobn.layers import IsoBatchNormalization

BACKEND = keras.backend.backend()
WORKER = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "distribution_worker.py"
)
# As in the worker: 4 replicas, global batches of 16, IsoBN's momentum.
REPLICAS, BATCH, MOMENTUM = 4, 16, 0.05
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


# --- Data parallelism: 4 virtual devices, in a subprocess. ----------------

if PARALLEL_RUNS:

    @pytest.fixture(scope="module")
    def runs(tmp_path_factory):
        """What the worker's runs on 1 device and on 4 replicas end with."""
        path = tmp_path_factory.mktemp("distribution") / "runs.npz"
        env = dict(os.environ, KERAS_BACKEND=BACKEND, TF_CPP_MIN_LOG_LEVEL="3")
        done = subprocess.run(
            [sys.executable, WORKER, str(path)],
            env=env,
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


# --- The helpers, in process. ---------------------------------------------


def small_model(seed=0):
    """Dense -> IsoBN -> BatchNormalization -> Dense, seeded."""
    inputs = keras.Input((6,))
    x = keras.layers.Dense(
        6,
        activation="tanh",
        kernel_initializer=keras.initializers.GlorotUniform(seed),
        name="hidden",
    )(inputs)
    x = IsoBatchNormalization(name="iso")(x)
    x = keras.layers.BatchNormalization(name="bn")(x)
    outputs = keras.layers.Dense(
        3,
        kernel_initializer=keras.initializers.GlorotUniform(seed + 1),
        name="logits",
    )(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        keras.optimizers.Adam(0.01),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def small_data(n=24):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 6)) * np.logspace(0, -2, 6) + 1.0
    return x.astype("float32"), rng.integers(0, 3, size=n)


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


# --- Fault tolerance, in process. -----------------------------------------


class Interrupted(Exception):
    pass


class Interrupt(keras.callbacks.Callback):
    """Raises after batch `batch` of epoch `epoch`, as a killed run stops."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.at = (epoch, batch)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise Interrupted(f"killed after batch {batch}, epoch {self.epoch}")


class Recorder(keras.callbacks.Callback):
    """Records the training state: weights, IsoBN statistics, optimizer."""

    def __init__(self):
        super().__init__()
        self.states = {}

    def state(self):
        model = self.model  # On JAX, this syncs the state of `fit` first.
        state = {
            v.path: keras.ops.convert_to_numpy(v) for v in model.weights
        }
        # Optimizer variables by position (their paths hold its name).
        for i, v in enumerate(model.optimizer.variables):
            state[f"optimizer/{i}"] = keras.ops.convert_to_numpy(v)
        return state

    def on_train_begin(self, logs=None):
        self.states["begin"] = self.state()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.states[(self.epoch, batch)] = self.state()

    def on_train_end(self, logs=None):
        self.states["end"] = self.state()


def assert_same_state(actual, expected):
    assert sorted(actual) == sorted(expected)
    assert "iso/moving_covariance" in actual and "iso/moving_std" in actual
    for name in expected:
        np.testing.assert_array_equal(
            actual[name], expected[name], err_msg=name
        )


def fit(model, callbacks):
    x, y = small_data()  # 6 batches of 4, always in this order.
    return model.fit(
        x,
        y,
        batch_size=4,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )


@pytest.fixture(scope="module")
def uninterrupted():
    """The state after each batch of a run that was not interrupted."""
    recorder = Recorder()
    fit(small_model(), [recorder])
    return recorder.states


def test_killed_mid_epoch_resumes_from_the_epoch_backup(
    tmp_path, uninterrupted
):
    expected = uninterrupted
    path = str(tmp_path / "backup")
    with pytest.raises(Interrupted):
        fit(
            small_model(),
            [keras.callbacks.BackupAndRestore(path), Interrupt(1, batch=3)],
        )
    # As in a new process: a new, differently initialised model restores
    # the backup of the end of epoch 0, then trains epoch 1 again.
    recorder = Recorder()
    history = fit(
        small_model(seed=7),
        [keras.callbacks.BackupAndRestore(path), recorder],
    )
    assert len(history.history["loss"]) == 1
    assert_same_state(recorder.states["begin"], expected[(0, 5)])
    assert_same_state(recorder.states["end"], expected["end"])
    assert not os.path.exists(path)  # Deleted once training completes.


def test_batch_backup_restores_the_statistics_exactly(
    tmp_path, uninterrupted
):
    expected = uninterrupted
    path = str(tmp_path / "backup")
    with pytest.raises(Interrupted):
        fit(
            small_model(),
            [
                keras.callbacks.BackupAndRestore(path, save_freq=4),
                Interrupt(1, batch=3),
            ],
        )
    # Backups after 4 and 8 batches: the last one after batch 1 of epoch 1
    # (counting from 0), two batches before the kill.
    recorder = Recorder()
    with pytest.raises(Interrupted):
        fit(
            small_model(seed=7),
            [
                keras.callbacks.BackupAndRestore(path, save_freq=4),
                recorder,
                Interrupt(1, batch=0),
            ],
        )
    restored = recorder.states["begin"]
    assert_same_state(restored, expected[(1, 1)])
    assert int(restored["optimizer/0"]) == 8  # Adam's step counter.


# --- Several processes. ----------------------------------------------------

CLUSTER_VARIABLES = distribution.ENVIRONMENT


def test_cluster_environment(monkeypatch):
    for name in CLUSTER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert distribution.cluster_environment() is None
    monkeypatch.setenv(CLUSTER_VARIABLES[0], "10.0.0.1:1234")
    with pytest.raises(ValueError, match="KERAS_DISTRIBUTION_NUM_PROCESSES"):
        distribution.cluster_environment()  # Only some variables set.
    monkeypatch.setenv(CLUSTER_VARIABLES[1], "2")
    monkeypatch.setenv(CLUSTER_VARIABLES[2], "2")
    with pytest.raises(ValueError, match="0 <= process id"):
        distribution.cluster_environment()
    monkeypatch.setenv(CLUSTER_VARIABLES[2], "1")
    assert distribution.cluster_environment() == {
        "job_addresses": "10.0.0.1:1234", "num_processes": 2, "process_id": 1
    }  # fmt: skip


def test_one_process_is_its_own_chief():
    # Without a cluster: one process, the chief; the barrier and the fault
    # guard do nothing.
    assert distribution.join_cluster() is False
    assert distribution.process_count() == 1
    assert distribution.process_index() == 0
    assert distribution.is_chief()
    distribution.barrier("nothing to wait for")
    with distribution.stop_cluster_on_error():
        pass
    with pytest.raises(KeyError):
        with distribution.stop_cluster_on_error():
            raise KeyError("raised as usual")


def test_multi_process_requests_off_jax_or_outside_a_cluster(monkeypatch):
    for name in CLUSTER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    if BACKEND == "jax":
        with pytest.raises(RuntimeError, match="initialize_cluster"):
            with distribution.data_parallel_scope("multi_worker"):
                pass
        with pytest.raises(ValueError, match="keras_isobn.launch"):
            distribution.initialize_cluster()  # Nothing describes one.
        assert distribution.process_count() == 1
        return
    cause = {
        "tensorflow": r"MultiWorkerMirroredStrategy \(keras-team/keras#20585",
        "torch": "no multi-process training on PyTorch",
    }[BACKEND]
    with pytest.raises(ValueError, match=cause):
        distribution.initialize_cluster("127.0.0.1:1234", 2, 0)
    with pytest.raises(ValueError, match="KERAS_BACKEND=jax"):
        with distribution.data_parallel_scope("multi_worker"):
            pass
    if BACKEND == "tensorflow":  # TF_CONFIG asks for the same strategy.
        monkeypatch.setenv("TF_CONFIG", '{"cluster": {}}')
        with pytest.raises(ValueError, match="keras-team/keras#20585"):
            with distribution.data_parallel_scope("data_parallel"):
                pass


FAULT_SCRIPT = """
import os, sys, time
from keras_isobn import distribution
distribution.join_cluster()
from jax.experimental import multihost_utils
with distribution.stop_cluster_on_error():
    multihost_utils.sync_global_devices("start")
    print("started", flush=True)
    if distribution.process_index() == 1:
        if sys.argv[1] == "kill":
            os.kill(os.getpid(), 9)
        raise KeyError("a failure in process 1")
    multihost_utils.sync_global_devices("never reached by process 1")
"""


@pytest.mark.skipif(BACKEND != "jax", reason="several processes on JAX")
@pytest.mark.parametrize("fault", ["kill", "raise"])
def test_a_stopped_process_stops_the_cluster(fault, tmp_path):
    from keras_isobn import launch

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", FAULT_SCRIPT, fault], env=cluster_env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for cluster_env in launch.environments(2, base=env)
    ]
    processes[1].wait(timeout=300)
    stopped = time.monotonic()
    try:
        processes[0].wait(timeout=60)  # Not JAX's 100 s heartbeat.
    finally:
        processes[0].kill()
    waited = time.monotonic() - stopped
    print(f"\n[{fault}] the chief stopped {waited:.2f} s after process 1")
    (out, err), (_, worker_err) = [p.communicate() for p in processes]
    assert "started" in out, err[-3000:]
    assert processes[0].returncode == 1, err[-3000:]
    assert waited < 10, waited
    assert "process 1 of the 2-process cluster (a worker) stopped" in err
    if fault == "kill":
        assert processes[1].returncode == -9
    else:
        assert processes[1].returncode == 1
        assert "KeyError: 'a failure in process 1'" in worker_err
        assert "process 1 stops, and so the 2-process cluster" in worker_err
