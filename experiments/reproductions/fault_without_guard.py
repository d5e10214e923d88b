"""How long a JAX cluster process waits when a peer dies, without the guard.

Two processes on 127.0.0.1 (as `python -m keras_isobn.launch` starts them)
meet at a barrier; process 1 then kills itself (SIGKILL) while process 0
enters a collective, with no `stop_cluster_on_error()`. Prints how long
process 0 takes to exit, and how. The output of a run is in
`fault_without_guard.md`; with the guard the tests see 0.03-0.2 s.

Usage, from the repository root:
`python -m experiments.reproductions.fault_without_guard`
"""

import os
import subprocess
import sys
import time

__all__ = ["PROCESS", "main"]

PROCESS = """
import os
from keras_isobn import distribution
distribution.join_cluster()
from jax.experimental import multihost_utils
multihost_utils.sync_global_devices("start")
if distribution.process_index() == 1:
    os.kill(os.getpid(), 9)
multihost_utils.sync_global_devices("never reached by process 1")
"""


def main():
    from keras_isobn import launch

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="jax")
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS],
            env=cluster_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for cluster_env in launch.environments(2, base=env)
    ]
    processes[1].wait()
    killed = time.monotonic()
    try:
        processes[0].wait(timeout=300)
    except subprocess.TimeoutExpired:
        processes[0].kill()
        print("process 0 still running 300 s after the kill; killed")
    waited = time.monotonic() - killed
    output = processes[0].communicate()[0]
    lines = [
        line
        for line in output.splitlines()
        if "Error" in line or "Barrier result" in line
    ]
    print("\n".join(line[:300] for line in lines))
    print(
        f"process 0 exited with status {processes[0].returncode} "
        f"{waited:.1f} s after process 1 was killed"
    )


if __name__ == "__main__":
    main()
