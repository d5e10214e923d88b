"""The GPU check at a tiny size: the bundle, and its runner without TF.

The runner must work on a GPU host that has no TensorFlow: it runs here
in subprocesses where `import tensorflow` fails (a `sitecustomize` that
sets `sys.modules["tensorflow"] = None`), through its own `run` command.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from benchmarks import gpu_bundle
from benchmarks import gpu_check
from benchmarks import gpu_sections

BACKEND = keras.backend.backend()
REPO_ROOT = os.path.dirname(os.path.dirname(gpu_check.__file__))
CHECK = [sys.executable, "-m", "benchmarks.gpu_check"]
SIZES = ["--train-examples", "48", "--dev-examples", "24",
         "--sequence-length", "16"]


def sample_dir():
    from keras_isobn.glue import sample_data_dir

    return sample_data_dir()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("bundle") / "b")
    manifest = gpu_bundle.main(
        [folder, "--glue-dir", sample_dir(), "--checkpoint", "tiny",
         "--no-wheels", *SIZES]
    )
    return folder, manifest


@pytest.fixture(scope="module")
def without_tensorflow(tmp_path_factory):
    """Environment whose Python processes cannot import TensorFlow."""
    folder = tmp_path_factory.mktemp("no_tf")
    (folder / "sitecustomize.py").write_text(
        "import sys\nsys.modules['tensorflow'] = None\n"
    )
    env = dict(os.environ, KERAS_BACKEND=BACKEND)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(folder), REPO_ROOT]
        + [p for p in [env.get("PYTHONPATH")] if p]
    )
    blocked = subprocess.run(
        [sys.executable, "-c", "import tensorflow"], env=env,
        capture_output=True, text=True,
    )
    assert blocked.returncode != 0 and "halted" in blocked.stderr
    return env


def test_bundle_holds_the_token_ids_labels_and_checkpoint(bundle):
    import keras_hub

    from keras_isobn import glue

    folder, manifest = bundle
    assert manifest["task"] == "sst2" and manifest["num_classes"] == 2
    assert manifest["train_examples"] == 48
    assert manifest["dev_examples"] == 24
    assert manifest["wheels"] == []
    assert set(manifest["files"]) == {
        "checkpoint/config.json", "checkpoint/model.safetensors",
        "checkpoint/tokenizer_config.json", "checkpoint/vocab.txt",
        "data.npz",
    }
    b = gpu_bundle.Bundle(folder)
    task = glue.get_task("sst2")
    train = glue.load_split(task, "train", data_dir=sample_dir()).limit(48)
    # The seeded order of `GlueSplit.limit`, tokenized by the checkpoint's
    # own preprocessor.
    np.testing.assert_array_equal(b.labels("train"), train.labels)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor.from_preset(
        b.checkpoint, sequence_length=16
    )
    expected = preprocessor(train.features[:5])
    x = b.inputs("train", slice(0, 5))
    for key in ("token_ids", "segment_ids", "padding_mask"):
        np.testing.assert_array_equal(
            x[key], keras.ops.convert_to_numpy(expected[key])
        )
    assert x["token_ids"].dtype == np.int32
    assert b.arrays["train_token_ids"].dtype == np.uint16
    assert b.inputs("dev")["token_ids"].shape == (24, 16)


def test_checkpoint_is_stored_in_float16_and_loads_as_float32(tmp_path):
    from safetensors.numpy import load_file

    source = tmp_path / "source"
    from keras_isobn.glue import sample_vocabulary_path

    gpu_bundle.write_tiny_checkpoint(str(source), sample_vocabulary_path())
    cast = gpu_bundle.write_checkpoint(str(source), str(tmp_path / "half"))
    full = load_file(str(source / "model.safetensors"))
    half = load_file(str(tmp_path / "half" / "model.safetensors"))
    assert set(full) == set(half) and cast["tensors"] == len(full)
    errors = []
    for name, value in full.items():
        assert half[name].dtype == np.float16
        errors.append(np.max(np.abs(half[name].astype("float32") - value)))
        np.testing.assert_allclose(half[name], value, rtol=1e-3, atol=1e-7)
    assert cast["float16_max_abs_error"] == pytest.approx(max(errors))

    import keras_hub

    backbone = keras_hub.models.BertBackbone.from_preset(
        str(tmp_path / "half"), dtype="float32"
    )
    embeddings = backbone.get_layer("token_embedding").embeddings
    assert embeddings.dtype == "float32"
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(embeddings),
        half["embeddings.word_embeddings.weight"].astype("float32"),
    )


def test_frozen_variant_keeps_its_statistics_and_compiled_steps_copy(
    bundle,
):
    import argparse

    b = gpu_bundle.Bundle(bundle[0])
    args = argparse.Namespace(seed=0, learning_rate=1e-3)
    frozen = gpu_sections.make_classifier(b, "isobn_frozen", "keras_adamw",
                                       10, args)
    trained = gpu_sections.make_classifier(b, "isobn", "keras_adamw", 10,
                                           args)
    assert frozen.normalization.trainable is False
    x, y = b.inputs("train", slice(0, 8)), b.labels("train", slice(0, 8))
    for classifier in (frozen, trained):
        classifier.train_on_batch(x, y)
    covariance = keras.ops.convert_to_numpy(
        frozen.normalization.moving_covariance
    )
    assert not covariance.any()  # Frozen: no update, the scale stays 1.
    assert keras.ops.convert_to_numpy(
        trained.normalization.moving_covariance
    ).any()
    if BACKEND != "jax":
        return
    before = [keras.ops.convert_to_numpy(v) for v in trained.variables]
    blocks = gpu_sections.compiled_step_blocks(
        {"isobn": trained, "isobn_frozen": frozen}, (x, y), block=2, rounds=2
    )
    assert set(blocks) == {"isobn", "isobn_frozen"}
    assert blocks["isobn"]["steps_per_block"] == 2
    assert blocks["isobn"]["examples_per_s"] > 0
    # The steps ran on copies: the classifier's variables are untouched
    # (and still usable: donation did not delete their buffers).
    for value, variable in zip(before, trained.variables):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(variable), value
        )


def test_bundle_errors_name_the_problem(tmp_path, bundle):
    with pytest.raises(FileExistsError, match="not empty"):
        gpu_bundle.main([bundle[0], "--glue-dir", sample_dir(),
                         "--checkpoint", "tiny", "--no-wheels", *SIZES])
    with pytest.raises(FileNotFoundError, match="no config.json"):
        gpu_bundle.main([str(tmp_path / "b"), "--glue-dir", sample_dir(),
                         "--checkpoint", str(tmp_path), "--no-wheels"])
    with pytest.raises(ValueError, match="over --max-mb"):
        gpu_bundle.main([str(tmp_path / "c"), "--glue-dir", sample_dir(),
                         "--checkpoint", "tiny", "--no-wheels",
                         "--max-mb", "0.001", *SIZES])
    with pytest.raises(ValueError, match="regression task"):
        gpu_bundle.main([str(tmp_path / "d"), "--glue-dir", sample_dir(),
                         "--checkpoint", "tiny", "--no-wheels",
                         "--task", "stsb", *SIZES])
    with pytest.raises(FileNotFoundError, match="not a GPU-check bundle"):
        gpu_bundle.Bundle(str(tmp_path))


def test_script_usage_and_bad_bundle(tmp_path):
    shown = subprocess.run([*CHECK, "--help"], capture_output=True,
                           text=True)
    assert shown.returncode == 0
    assert "bundle GLUE_DIR OUT" in shown.stdout and "run OUT" in shown.stdout
    for argv in ([], ["bundle"], ["run", str(tmp_path / "nowhere")]):
        done = subprocess.run([*CHECK, *argv], capture_output=True,
                              text=True)
        assert done.returncode == 2, argv
    assert "is not a bundle" in done.stderr


def test_runner_refuses_tensorflow_and_runs_without_it(
    bundle, without_tensorflow, tmp_path
):
    if BACKEND == "tensorflow":  # A bare GPU host has no TensorFlow.
        done = subprocess.run(
            [*CHECK, "part", bundle[0], "--output", str(tmp_path),
             "--small"],
            capture_output=True, text=True, env=dict(os.environ),
        )
        assert done.returncode != 0
        assert "KERAS_BACKEND=jax or KERAS_BACKEND=torch" in done.stderr
        return
    output = tmp_path / "out"
    done = subprocess.run(
        [*CHECK, "run", bundle[0], "--small", "--backends", BACKEND,
         "--no-hf", "--output", str(output)],
        env=without_tensorflow, capture_output=True, text=True,
        cwd=str(tmp_path),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "gpu_check: PASS" in done.stdout
    assert sorted(os.listdir(output)) == [
        "gpu_check.json", "gpu_check.md", f"part_{BACKEND}.json"
    ]
    with open(output / "gpu_check.json") as f:
        payload = json.load(f)
    assert payload["passed"] is True
    assert payload["environment"]["backend"] == BACKEND
    checks = payload["checks"]
    for section in ("finetune", "bfloat16"):
        for check in ("statistics_float32", "layer_computes_in_policy_dtype",
                      "statistics_finite", "statistics_updated",
                      "scale_finite_positive", "losses_finite"):
            assert checks[f"{BACKEND}/{section}/{check}"] is True
    sections = payload["parts"][BACKEND]["sections"]
    assert list(sections) == ["finetune", "throughput", "numerics", "bfloat16"]
    for policy in ("float32", "mixed_float16"):
        assert checks[
            f"{BACKEND}/numerics/{policy}_statistics_match_float64"
        ] is True
    finetune = sections["finetune"]
    assert finetune["steps"] == 48 // 8
    steps = [r["step"] for r in finetune["statistics_records"]]
    assert steps == [1, 2, 3, 4, 5, 6, "end"]
    assert finetune["layer_compute_dtype"] == "float16"
    assert sections["bfloat16"]["layer_compute_dtype"] == "bfloat16"
    assert 0.0 <= finetune["dev_accuracy"] <= 1.0
    throughput = sections["throughput"]
    assert set(throughput["fit"]) == set(gpu_sections.VARIANTS)
    for timing in throughput["fit"].values():
        assert timing["examples_per_s"] > 0
    assert set(throughput["ratios"]) == {
        "isobn_over_none", "isobn_frozen_over_none", "batchnorm_over_none",
        "fine_tuning_adamw_over_keras_adamw",
    }
    for ratio in throughput["ratios"].values():
        assert ratio["fit_blocks"] > 0
        assert ratio["train_on_batch"]["median"] > 0
        # The compiled step alone, without Keras's loop: JAX only.
        assert (ratio.get("compiled_step_blocks", 0) > 0) == (
            BACKEND == "jax"
        )
    if BACKEND == "jax":
        compiled = throughput["compiled_step_blocks"]
        assert set(compiled) == set(gpu_sections.VARIANTS)
        assert all(t["examples_per_s"] > 0 for t in compiled.values())
    assert f"fine_tuning_adamw_over_keras_adamw_{BACKEND}" in payload["goals"]
    assert any("train examples/s" in row for row in payload["summary"])


def test_merge_fails_on_a_failed_check_or_an_unfinished_section(tmp_path):
    def part(name, sections):
        payload = {"part": name, "environment": {"devices": ["cpu"]},
                   "settings": {"small": True}, "sections": sections}
        with open(tmp_path / f"part_{name}.json", "w") as f:
            json.dump(payload, f)

    part("jax", {"finetune": {"checks": {"statistics_finite": True}}})
    assert gpu_check.merge(str(tmp_path))[1] is True
    part("torch", {"finetune": {"unfinished": True}})
    path, passed = gpu_check.merge(str(tmp_path))
    assert passed is False
    with open(path) as f:
        assert json.load(f)["checks"]["torch/finetune/ran"] is False
