"""A recipe run killed (SIGKILL) at several points ends as if never killed."""

import json
import os
import subprocess
import sys
import zipfile

import h5py
import numpy as np
import pytest

from keras_isobn import files

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
WORKER = ["-m", "tests.helpers.kill_worker"]  # Run from the repository root.
# 3 epochs of 4 batches of the shipped SST-2 sample, on the built-in BERT.
ARGS = [
    *("--task", "sst2", "--norm", "isobn", "--epochs", "3"),
    *("--train-limit", "64", "--batch-size", "16"),
    *("--max-sequence-length", "24", "--verbose", "0"),
    "--no-report",
]
# Killed in turn: mid-epoch 2, while saving the state of epoch 2, in the
# evaluation of epoch 3, while writing best.keras, then results.json.
KILL_POINTS = [
    "batch:1:1",
    "write:state.npz:1",
    "evaluate:2",
    "write:best.keras:1",
    "write:results.json:1",
]


def recipe(kill_point, output_dir):
    return subprocess.run(
        [
            sys.executable,
            *WORKER,
            kill_point,
            *ARGS,
            "--output-dir",
            output_dir,
        ],
        cwd=REPO_ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("uninterrupted")
    done = recipe("none", str(output_dir))
    assert done.returncode == 0, done.stderr[-5000:]
    return output_dir / "sst2" / "isobn" / "seed-1"


def weights(keras_file):
    """Every array of the weights file in a `.keras` archive, by path."""
    arrays = {}
    with zipfile.ZipFile(keras_file) as archive:
        with archive.open("model.weights.h5") as file, h5py.File(file) as h5:
            h5.visititems(
                lambda name, item: (
                    arrays.__setitem__(name, item[()])
                    if isinstance(item, h5py.Dataset)
                    else None
                )
            )
    return arrays


def comparable(results):
    """`results.json` without what may differ: times and the resume flag."""
    for row in results["epochs"]:
        del row["epoch_time_s"]
    for key in ("train_time_s", "wall_time_s", "resumed"):
        del results[key]
    return results


def test_killed_run_ends_bit_identical(uninterrupted, tmp_path):
    seed_dir = tmp_path / "sst2" / "isobn" / "seed-1"
    for kill_point in KILL_POINTS:
        done = recipe(kill_point, str(tmp_path))
        assert done.returncode == -9, (kill_point, done.stderr[-5000:])
        assert not (seed_dir / "results.json").exists(), kill_point
    # The files the kills caught half-written were never read as whole.
    assert (seed_dir / "results.partial.json").exists()
    done = recipe("none", str(tmp_path))
    assert done.returncode == 0, done.stderr[-5000:]
    assert "resuming after epoch 3" in done.stdout

    with open(uninterrupted / "results.json") as file:
        expected = json.load(file)
    with open(seed_dir / "results.json") as file:
        resumed = json.load(file)
    assert resumed["resumed"] is True
    assert comparable(resumed) == comparable(expected)
    assert [row["epoch"] for row in resumed["epochs"]] == [0, 1, 2]
    assert (seed_dir / "epochs.csv").read_text().count("\n") == 4
    predictions = np.load(seed_dir / "dev_predictions.npz")["validation"]
    expected_predictions = np.load(uninterrupted / "dev_predictions.npz")
    np.testing.assert_array_equal(
        predictions, expected_predictions["validation"]
    )
    # The same weights and IsoBN statistics, to the last bit.
    got = weights(seed_dir / "best.keras")
    want = weights(uninterrupted / "best.keras")
    assert sorted(got) == sorted(want)
    assert "layers/iso_batch_normalization/vars/0" in got  # Its covariance.
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert not (seed_dir / "backup").exists()


def test_best_model_loads_compiled_without_the_recipe(uninterrupted):
    code = (
        "import sys, keras, numpy as np\n"
        "import keras_isobn.models\n"
        "model = keras.saving.load_model(sys.argv[1])\n"
        "assert 'recipes.glue' not in sys.modules  # The recipe never ran.\n"
        "assert 'glue' not in sys.modules\n"
        "schedule = model.optimizer.get_config()['learning_rate']\n"
        "print(type(model).__name__, schedule['class_name'],\n"
        "      int(model.optimizer.iterations.numpy()),\n"
        "      model.predict(['a great film'], verbose=0).shape)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(uninterrupted / "best.keras")],
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    name, schedule, iterations, shape = done.stdout.split(maxsplit=3)
    assert (name, schedule) == ("IsoBNBertTextClassifier", "WarmupLinearDecay")
    assert int(iterations) == 12  # 3 epochs of 4 steps: the optimizer state.
    assert shape.strip() == "(1, 2)"


def test_a_second_run_on_the_same_output_dir_fails_at_once(tmp_path):
    with files.exclusive(str(tmp_path)):
        done = recipe("none", str(tmp_path))
    assert done.returncode == 1
    assert "another process is using" in done.stderr.lower()
    assert not (tmp_path / "sst2").exists()
