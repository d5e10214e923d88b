"""The lab's GPU pretraining at a tiny size, its runner without TensorFlow.

The bundle is built here; `pretrain-bundle` runs in a subprocess where
`import tensorflow` fails (a `sitecustomize` that sets
`sys.modules["tensorflow"] = None`), on JAX (the GPU host's backend) when
this suite runs on TensorFlow, else on this suite's backend.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from experiments.anisotropy_lab import command_line
from experiments.anisotropy_lab import gpu_pretraining
from keras_isobn import glue

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
BACKEND = keras.backend.backend().replace("tensorflow", "jax")


def _bundle(folder, *extra):
    return command_line.main(
        ["bundle", "--glue-dir", glue.sample_data_dir(), "--output", folder]
        + "--corpus sst2 mrpc --vocabulary-size 300 --sequence-length 32".split()
        + "--mask-length 5 --epochs 2 --held-out 16 --no-wheels".split()
        + list(extra)
    )


def test_pack_epoch_round_trips_an_epoch():
    x = {
        "token_ids": np.array([[2, 7, 4, 3, 0], [2, 9, 3, 8, 3]]),
        "segment_ids": np.array([[0, 0, 0, 0, 0], [0, 0, 0, 1, 1]]),
        "padding_mask": np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]),
        "mask_positions": np.array([[2, 0], [1, 3]]),
    }
    y = {"mlm": np.array([[5, 0], [9, 8]]), "pair": np.array([0, 1])}
    weights = {"mlm": np.float32([[1, 0], [1, 1]]), "pair": np.float32([0, 1])}
    packed = gpu_pretraining.pack_epoch(x, y, weights)
    assert packed["token_ids"].dtype == np.uint16
    assert len(packed["token_ids"]) == 9  # Padding is not stored.
    x2, y2, weights2 = gpu_pretraining.unpack_epoch(packed, 5)
    for key in x:
        np.testing.assert_array_equal(x2[key], x[key])
        assert x2[key].dtype == np.int32
    for key in y:
        np.testing.assert_array_equal(y2[key], y[key])
        np.testing.assert_array_equal(weights2[key], weights[key])


def test_pretrain_bundle_writes_a_preset_without_tensorflow(tmp_path):
    import keras_hub

    folder = str(tmp_path / "bundle")
    manifest = _bundle(folder, "--pair-objective")
    assert manifest["corpus"]["rows"] == 960  # 480 SST-2 sentences, 480 pairs.
    assert manifest["epochs"] == 2 and manifest["pair_objective"]
    assert set(manifest["files"]) >= {"corpus.npz", "tokenizer/tokenizer.json"}
    assert manifest["bytes"] < 1e6
    with pytest.raises(FileExistsError, match="not empty"):
        _bundle(folder)  # Never written over.
    with pytest.raises(ValueError, match="fewer --epochs"):
        _bundle(str(tmp_path / "big"), "--max-mb", "0.001")

    # The runner, in a process that cannot import TensorFlow.
    site = tmp_path / "no_tf"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\nsys.modules['tensorflow'] = None\n"
    )
    env = dict(os.environ, KERAS_BACKEND=BACKEND)
    env["PYTHONPATH"] = os.pathsep.join([str(site), REPO_ROOT])
    preset = str(tmp_path / "preset")
    command = [sys.executable, "-m", "experiments.anisotropy_lab"]
    command += ["pretrain-bundle", folder, "--output", preset]
    command += "--layers 1 --heads 2 --width 16 --batch-size 8".split()
    command += "--steps 5 --log-every 2 --learning-rate 1e-3".split()
    done = subprocess.run(
        command, env=env, cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "wrote the preset" in done.stdout

    summary = json.loads(open(os.path.join(preset, "pretraining.json")).read())
    assert summary["environment"]["backend"] == BACKEND
    assert summary["backbone"]["hidden_dim"] == 16
    assert summary["corpus"]["masked_epochs_stored"] == 2
    assert summary["epochs_started"] == 1  # 5 steps of about 100 an epoch.
    curve = open(os.path.join(preset, "pretraining.csv")).read().splitlines()
    assert [row.split(",")[0] for row in curve[1:]] == ["0", "2", "4", "5"]
    header = curve[0].split(",")
    last = curve[-1].split(",")
    for key in (
        "held_out_mlm_accuracy",
        "held_out_pair_accuracy",
        "pooled_ev3",
    ):
        assert np.isfinite(float(last[header.index(key)]))
    backbone = keras_hub.models.BertBackbone.from_preset(preset)
    tokenizer = keras_hub.models.BertTokenizer.from_preset(preset)
    assert backbone.vocabulary_size == tokenizer.vocabulary_size()
    assert tokenizer.vocabulary_size() == manifest["vocabulary_size"]
    assert tokenizer.token_to_id("[MASK]") == 4
