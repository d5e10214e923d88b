"""A process that stops (killed, or failed) stops its whole cluster."""

import os
import subprocess
import sys
import time

import keras
import pytest

BACKEND = keras.backend.backend()


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
