"""How fast does JAX itself stop a survivor when a peer is SIGKILLed?

KERAS_BACKEND=jax python -m experiments.reproductions.jax_heartbeat HEARTBEAT SHUTDOWN [watchdog]
(KILL=0 kills the chief instead of process 1.) Results: jax_heartbeat.md.
Starts 2 JAX CPU processes (gloo) on 127.0.0.1, both loop on a cross-process
all-reduce; process 1 is SIGKILLed after 3 s; prints how long the survivor
(process 0) takes to exit, its exit status and the tail of its stderr.
"""
import os
import signal
import socket
import subprocess
import sys
import time

WORKER = r'''
import os, sys, time
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
hb, sd, pid, port, guard = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
if guard == "watchdog":
    os.environ.update(KERAS_BACKEND="jax", KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{port}",
                      KERAS_DISTRIBUTION_NUM_PROCESSES="2", KERAS_DISTRIBUTION_PROCESS_ID=str(pid))
    from keras_isobn import distribution
    distribution.join_cluster()
    ctx = distribution.stop_cluster_on_error()
else:
    import contextlib
    jax.distributed.initialize(f"127.0.0.1:{port}", 2, pid,
        heartbeat_timeout_seconds=hb, shutdown_timeout_seconds=sd)
    ctx = contextlib.nullcontext()
from jax.experimental import multihost_utils
import numpy as np
with ctx:
    print("ready", flush=True)
    i = 0
    while True:
        multihost_utils.process_allgather(np.ones(4) * i)
        i += 1
'''


def main():
    hb, sd = int(sys.argv[1]), int(sys.argv[2])
    guard = sys.argv[3] if len(sys.argv) > 3 else "none"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(hb), str(sd), str(i), str(port), guard],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            cwd="/work/main",
        )
        for i in range(2)
    ]
    for p in procs:
        while (line := p.stdout.readline()) and line.strip() != "ready":
            pass
    time.sleep(3)
    victim = int(os.environ.get("KILL", "1")); procs[victim].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    try:
        survivor = procs[1 - victim]; out, err = survivor.communicate(timeout=240)
        took = time.monotonic() - killed
        print(f"guard={guard} heartbeat={hb}s shutdown={sd}s: survivor exited "
              f"after {took:.1f} s with status {survivor.returncode} (killed process {victim})")
    except subprocess.TimeoutExpired:
        procs[0].kill()
        out, err = procs[0].communicate()
        print(f"guard={guard} heartbeat={hb}s shutdown={sd}s: survivor still "
              "running after 240 s (killed)")
    print("--- survivor stderr (last 1500 chars) ---")
    open(f"err_{guard}_{hb}_{sd}_{os.environ.get('KILL','1')}.txt","w").write(err); print(err[-1500:])


if __name__ == "__main__":
    main()
