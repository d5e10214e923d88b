"""The recipe in 2 processes on the loopback, each with 2 CPU devices.

`python -m keras_isobn.launch` starts the processes as a cluster manager
would; the runs are on JAX (keras.distribution over gloo). On TensorFlow
(keras-team/keras#20585) and PyTorch the tests check the clear errors.
"""

import json
import os
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from keras_isobn import launch
from tests.recipes.test_resume_after_kill import comparable
from tests.recipes.test_resume_after_kill import weights

from recipes import glue as recipe

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
WORKER = ["-m", "tests.helpers.kill_worker"]  # Run from the repository root.
RECIPE = os.path.join(REPO_ROOT, "recipes", "glue.py")
# 2 epochs of 4 global batches of 16 (4 rows per device), on the built-in
# BERT; every process runs this same command.
ARGS = [
    *("--task", "sst2", "--norm", "isobn", "--epochs", "2"),
    *("--train-limit", "64", "--batch-size", "16"),
    *("--max-sequence-length", "24", "--verbose", "0"),
]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
SEED_DIR = os.path.join("sst2", "isobn", "seed-1")
JAX = keras.backend.backend() == "jax"


def start(output_dir, kill_points=("none", "none"), audit=None, report=False):
    """Starts the 2 processes, each `kill_worker POINT ARGS...`."""
    processes = []
    for rank, env in enumerate(launch.environments(2, devices=2, base=ENV)):
        if audit:
            env["AUDIT_WRITES"] = f"{audit}.{rank}.json"
        processes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    *WORKER,
                    kill_points[rank],
                    *ARGS,
                    "--output-dir",
                    str(output_dir),
                ]
                + ([] if report else ["--no-report"]),
                cwd=REPO_ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return processes


def finish(processes, timeout=600):
    outputs = [process.communicate(timeout=timeout) for process in processes]
    for process, (_, err) in zip(processes, outputs):
        assert process.returncode == 0, err[-5000:]
    return outputs


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    """An uninterrupted 2-process run, its writes audited."""
    root = tmp_path_factory.mktemp("cluster")
    output_dir = root / "out"
    outputs = finish(start(output_dir, audit=root / "writes", report=True))
    audits = [
        json.loads((root / f"writes.{rank}.json").read_text())
        for rank in (0, 1)
    ]
    return output_dir, outputs, audits


def tree(directory):
    """The files under `directory`; TensorBoard's without host and time."""
    return sorted(
        os.path.relpath(os.path.join(folder, name), directory)
        for folder, _, files in os.walk(directory)
        for name in (
            "events.out.tfevents" if "tfevents" in f else f for f in files
        )
    )


@pytest.mark.skipif(not JAX, reason="multi-process training is on JAX")
def test_two_processes_match_one_process(cluster_run, tmp_path):
    output_dir, outputs, audits = cluster_run
    done = subprocess.run(
        [sys.executable, RECIPE, *ARGS, "--output-dir", str(tmp_path)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    with open(output_dir / SEED_DIR / "results.json") as file:
        cluster = json.load(file)
    with open(tmp_path / SEED_DIR / "results.json") as file:
        single = json.load(file)
    assert (cluster["processes"], cluster["replicas"]) == (2, 4)
    assert cluster["hyperparameters"]["distribution"] == "multi_worker"
    assert (single["processes"], single["replicas"]) == (1, 1)
    # The same global batches, in the same order: the same losses and
    # dev metrics, epoch by epoch...
    for got, want in zip(cluster["epochs"], single["epochs"], strict=True):
        for key in ("loss", "val_accuracy", "ev3_in", "ev3_out"):
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5)
    # ... and the same weights and IsoBN moving statistics.
    got = weights(output_dir / SEED_DIR / "best.keras")
    want = weights(tmp_path / SEED_DIR / "best.keras")
    assert sorted(got) == sorted(want)
    assert "layers/iso_batch_normalization/vars/0" in got  # Covariance.
    for name in want:
        np.testing.assert_allclose(
            got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name
        )
    predictions = np.load(output_dir / SEED_DIR / "dev_predictions.npz")
    expected = np.load(tmp_path / SEED_DIR / "dev_predictions.npz")
    np.testing.assert_allclose(
        predictions["validation"],
        expected["validation"],
        rtol=1e-4,
        atol=1e-5,
    )
    # The chief wrote the files a single process writes, the other none.
    assert tree(output_dir) == tree(tmp_path)
    assert any("results.json" in write for write in audits[0])
    assert audits[1] == []
    for (out, _), rank in zip(outputs, "01"):
        assert "training in" in out, rank


@pytest.mark.skipif(not JAX, reason="multi-process training is on JAX")
def test_killed_process_stops_the_other_and_relaunch_resumes(
    cluster_run, tmp_path
):
    output_dir = cluster_run[0]
    # Process 1 kills itself (SIGKILL) after batch 1 of epoch 2.
    chief, worker = start(tmp_path, ("none", "batch:1:1"))
    worker.wait(timeout=600)
    killed_at = time.monotonic()
    assert worker.returncode == -signal.SIGKILL
    try:
        chief.wait(timeout=60)
    finally:
        chief.kill()
    stopped_after = time.monotonic() - killed_at
    print(f"\nThe chief stopped {stopped_after:.2f} s after the kill.")
    _, err = chief.communicate()
    assert chief.returncode == 1, err[-5000:]
    assert stopped_after < 30, stopped_after
    assert "process 1 of the 2-process cluster" in err
    seed_dir = tmp_path / SEED_DIR
    assert not (seed_dir / "results.json").exists()
    assert (seed_dir / "backup" / "state.npz").exists()  # Epoch 1's.

    # The same commands again: resumed after epoch 1, the same end.
    (out, _), _ = finish(start(tmp_path))
    assert "resuming after epoch 1" in out
    with open(output_dir / SEED_DIR / "results.json") as file:
        expected = json.load(file)
    with open(seed_dir / "results.json") as file:
        resumed = json.load(file)
    assert resumed["resumed"] is True
    assert comparable(resumed) == comparable(expected)
    np.testing.assert_array_equal(
        np.load(seed_dir / "dev_predictions.npz")["validation"],
        np.load(output_dir / SEED_DIR / "dev_predictions.npz")["validation"],
    )
    assert not (seed_dir / "backup").exists()


@pytest.mark.skipif(not JAX, reason="multi-process training is on JAX")
def test_launcher_runs_the_command_in_every_process(tmp_path):
    code = (
        "import os\n"
        "print(os.environ['KERAS_DISTRIBUTION_PROCESS_ID'],\n"
        "      os.environ['KERAS_DISTRIBUTION_NUM_PROCESSES'],\n"
        "      os.environ['KERAS_DISTRIBUTION_JOB_ADDRESSES'],\n"
        "      os.environ['XLA_FLAGS'])\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_isobn.launch",
            "--processes",
            "2",
            "--devices",
            "3",
            "--",
            sys.executable,
            "-c",
            code,
        ],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = sorted(done.stdout.splitlines())
    assert [line.split()[:3] for line in lines] == [
        ["[0]", "0", "2"],
        ["[1]", "1", "2"],
    ]
    assert lines[0].split()[3] == lines[1].split()[3]  # One coordinator.
    assert lines[0].split()[3].startswith("127.0.0.1:")
    assert "--xla_force_host_platform_device_count=3" in lines[0]
    # A failing process: the others are stopped, its status returned.
    failing = "import os, sys, time\n" + (
        "sys.exit(3) if os.environ['KERAS_DISTRIBUTION_PROCESS_ID'] == '1'"
        " else time.sleep(60)\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_isobn.launch",
            "--processes",
            "2",
            "--",
            sys.executable,
            "-c",
            failing,
        ],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3
    assert time.monotonic() - started < 30


def test_multi_worker_outside_jax_or_a_cluster_is_refused(tmp_path, capsys):
    argv = ARGS + [
        "--distribution",
        "multi_worker",
        "--output-dir",
        str(tmp_path),
    ]
    with pytest.raises(SystemExit):
        recipe.main(argv)
    err = capsys.readouterr().err
    backend = keras.backend.backend()
    if backend == "tensorflow":
        assert "keras-team/keras#20585" in err
    elif backend == "torch":
        assert "not supported on the torch backend" in err
    else:  # JAX, no KERAS_DISTRIBUTION_* variables.
        assert "python -m keras_isobn.launch" in err
    assert not (tmp_path / "sst2").exists()
