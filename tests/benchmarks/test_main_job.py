"""Smoke test of `benchmarks.main_job` at tiny size (no timing checks)."""

import json
import os
import time

import keras
import pytest

from benchmarks import main_job
from keras_isobn import glue

BACKEND = keras.backend.backend()
JOB = f"recipe-{BACKEND}-isobn"


@pytest.fixture(scope="module")
def payload(tmp_path_factory):
    """One recipe job, `--quick`, on the loaded backend."""
    folder = tmp_path_factory.mktemp("results")
    path = main_job.main(["--quick", "--jobs", JOB, "--output", str(folder)])
    with open(path) as f:
        payload = json.load(f)
    with open(os.path.splitext(path)[0] + ".md") as f:
        payload["markdown"] = f.read()
    return payload


def test_the_quick_recipe_job_records_every_field(payload):
    assert payload["benchmark"] == "main_job"
    assert payload["settings"]["quick"] is True
    assert payload["settings"]["jobs"] == [JOB]
    assert payload["environment"]["versions"]["keras"] == keras.__version__
    (r,) = payload["results"]
    assert "error" not in r, r.get("error")
    assert r["job"] == JOB and r["backend"] == BACKEND
    assert r["recipe_command"].startswith("python recipes/glue.py --task sst2")
    assert "--train-limit 64" in r["recipe_command"]
    assert f"--child {JOB}" in r["command"]
    phases = r["phases_s"]
    for name in ("startup", "imports", "data", "model", "tokenize", "compile",
                 "evaluation", "saving", "fit", "train", "exit", "other"):
        assert phases[name] >= 0 or name == "other", (name, phases)
    # The phases and the steps make up the whole job.
    assert sum(phases.values()) == pytest.approx(r["wall_s"])
    assert r["fixed_s"] == pytest.approx(r["wall_s"] - phases["train"])
    assert 0 < r["fixed_s"] < r["wall_s"]
    assert len(r["epochs"]) == payload["settings"]["epochs"] == 2
    epochs = sum(e["train_s"] for e in r["epochs"])
    assert epochs == pytest.approx(phases["train"])
    assert r["train_examples_per_s"] == r["epochs"][1]["examples_per_s"] > 0
    assert r["epoch_examples"] == 64
    # Evaluations: the whole dev set (120 rows) before training (EV_3 of the
    # pre-trained model) and after each epoch; none after training, as the
    # best epoch's predictions are kept.
    assert [n for n, _ in r["evaluations"]] == [120, 120, 120]
    assert r["eval_examples_per_s"] > 0
    assert r["peak_rss_bytes"] > 100 * 2**20
    assert 0 <= r["dev_accuracy"] <= 1
    assert len(r["epoch_accuracy"]) == 2
    # The recipe reports its best epoch's score.
    assert r["dev_accuracy"] == max(r["epoch_accuracy"])
    # JAX's compilations, by epochs ended: the first epoch compiles.
    assert (r["xla_compilations"].get("0", [0])[0] > 0) == (BACKEND == "jax")
    steps = r["xla_compilations_by_function"].get("jit(train_step)", [0])
    assert (steps[0] > 0) == (BACKEND == "jax")
    train = glue.load_split("sst2", "train", data_dir=glue.sample_data_dir())
    train = train.limit(64, seed=0)
    assert r["rows"] == main_job.fingerprint(train.features, train.labels)


def test_the_markdown_shows_the_job_and_the_goals(payload):
    text = payload["markdown"]
    assert f"| `{JOB}` |" in text
    assert "needs hf-trainer and a recipe job" in text
    assert "the same in every job" in text


def test_read_sst2_keeps_the_rows_of_the_recipe():
    data_dir = glue.sample_data_dir()
    split = glue.load_split("sst2", "train", data_dir=data_dir).limit(50)
    texts, labels = main_job.read_sst2(data_dir, "train", limit=50)
    assert list(texts) == list(split.features)
    assert list(labels) == list(split.labels)
    dev = glue.load_split("sst2", "validation", data_dir=data_dir)
    rows = main_job.read_sst2(data_dir, "dev")
    expected = main_job.fingerprint(dev.features, dev.labels)
    assert main_job.fingerprint(*rows) == expected


def test_phases_count_nested_time_once(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(main_job.time, "perf_counter", lambda: now[0])

    def spend(seconds):
        now[0] += seconds

    phases = main_job.Phases()
    with phases("fit"):
        spend(0.5)
        phases.epoch_begin()
        with phases("evaluation"):  # Within the epoch: not training.
            spend(2.0)
        spend(1.0)
        phases.epoch_end()
        with phases("saving"):
            with phases("saving"):
                spend(1.0)
            spend(0.25)
    assert phases.epochs == [1.0]
    assert phases.seconds == {
        "evaluation": 2.0, "train": 1.0, "saving": 1.25, "fit": 0.5
    }


def record(job, wall, fixed):
    return {"job": job, "wall_s": wall, "fixed_s": fixed}


def test_goals_compare_every_recipe_job_with_hf():
    rows = main_job.goals([
        record("hf-trainer", 100.0, 20.0),
        record("recipe-jax-isobn", 90.0, 25.0),
        record("recipe-torch-isobn", 160.0, 40.0),
        {"job": "recipe-tensorflow-isobn", "error": "failed"},
        record("recipe-jax-isobn-bfloat16", 10.0, 1.0),  # Not a goal's.
        record("recipe-jax-isobn-cached", 10.0, 1.0),  # Not a goal's.
    ])
    fastest, every, fixed = rows
    assert fastest[2] == "jax-isobn: 0.90x" and fastest[3] == "met"
    assert "torch-isobn: 1.60x" in every[2] and every[3] == "**missed**"
    assert "jax-isobn: 25%" in fixed[2] and fixed[3] == "**missed**"


def test_bfloat16_jobs_run_the_recipe_in_mixed_bfloat16(
    monkeypatch, tmp_path
):
    from recipes import glue as recipe

    class Stop(Exception):
        pass

    def main(argv, step=None):
        raise Stop(argv)

    # Only the command line: no recipe run, no timers left on classes.
    monkeypatch.setattr(recipe, "main", main)
    monkeypatch.setattr(main_job.Phases, "wrap", lambda *a, **k: None)
    monkeypatch.setattr(main_job, "time_keras_epochs", lambda phases: None)
    args = main_job.parse_args(["--quick", "--child", JOB + "-bfloat16",
                                "--work-dir", str(tmp_path)])
    with pytest.raises(Stop) as info:
        main_job.run_recipe(args, main_job.Phases())
    argv = info.value.args[0]
    assert argv[argv.index("--norm") + 1] == "isobn"
    assert argv[-2:] == ["--mixed-precision", "bfloat16"]


def test_jax_jobs_start_with_an_empty_cache_and_cached_ones_run_twice(
    monkeypatch,
):
    calls = []

    def run_module(module, argv, backend, threads=None, env=None):
        calls.append((argv[argv.index("--work-dir") + 1], env))
        return json.dumps(dict(
            phases_s={}, ended_at=time.time(), epoch_train_s=[1.0, 1.0],
            epoch_examples=32, evaluations=[[8, 1.0]],
        ))

    monkeypatch.setattr(main_job.harness, "run_module", run_module)
    args = main_job.parse_args(["--quick"])
    for job, runs in (("recipe-jax-isobn", 1), ("recipe-jax-isobn-cached", 2)):
        calls.clear()
        assert main_job.run_job(args, job)["job"] == job
        work_dirs, envs = zip(*calls)
        caches = {env["JAX_COMPILATION_CACHE_DIR"] for env in envs}
        # A fresh cache per job, deleted with it; the runs of a cached job
        # in work directories of their own.
        assert len(calls) == len(set(work_dirs)) == runs and len(caches) == 1
        assert not os.path.exists(caches.pop())
    assert "recipe-jax-isobn-cached" in main_job.JOBS
