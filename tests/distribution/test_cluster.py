import keras
import pytest

from keras_isobn import distribution

BACKEND = keras.backend.backend()
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
