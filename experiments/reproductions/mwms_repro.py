"""Keras 3 `fit` under `tf.distribute.MultiWorkerMirroredStrategy` fails.

Two workers on the loopback, from `TF_CONFIG`, fit a one-layer model for one
epoch. With Keras 3.15.1 and TensorFlow 2.21.0 both fail in `fit` with
"Attempt to convert a value (PerReplica:{...}) with an unsupported type",
keras-team/keras#20585 (open). So keras-isobn refuses multi-process training
on TensorFlow with an error naming the bug, and trains several processes on
JAX. The output of a run is in `mwms_repro.md`.

Usage, from the repository root (exits 0 if `fit` worked):
`python -m experiments.reproductions.mwms_repro`
"""

import json
import os
import socket
import subprocess
import sys

__all__ = ["worker", "main"]


def worker(index, ports):
    os.environ["KERAS_BACKEND"] = "tensorflow"
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
            "task": {"type": "worker", "index": index},
        }
    )
    import keras
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    print(f"worker {index}: {strategy.num_replicas_in_sync} replicas")
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((64, 4), "float32"), np.zeros((64, 2), "float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    history = model.fit(dataset, epochs=1, verbose=0)
    print(f"worker {index}: fit worked: {history.history}")


def main():
    ports = []
    for _ in range(2):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    workers = [
        subprocess.Popen(
            [sys.executable, __file__, str(index), *map(str, ports)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for index in range(2)
    ]
    codes = []
    for index, process in enumerate(workers):
        output, _ = process.communicate(timeout=300)
        lines = [
            line
            for line in output.splitlines()
            if line.startswith("worker") or "Error" in line
        ]
        print(f"--- worker {index}, exit status {process.returncode}")
        print("\n".join(lines))
        codes.append(process.returncode)
    import keras
    import tensorflow as tf

    print(f"Keras {keras.__version__}, TensorFlow {tf.__version__}")
    return 0 if codes == [0, 0] else 1


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker(int(sys.argv[1]), [int(port) for port in sys.argv[2:]])
    else:
        sys.exit(main())
