"""Smoke tests of the benchmark scripts at tiny sizes (no timing checks)."""

import json
import math
import os

import keras
import pytest

from benchmarks import distributed_step
from benchmarks import end_to_end
from benchmarks import import_cost
from benchmarks import layer_cost
from benchmarks import __main__ as suite_runner

BACKEND = keras.backend.backend()


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """The whole suite, `--quick`, on the loaded backend only."""
    folder = tmp_path_factory.mktemp("results")
    markdown = suite_runner.main(["--quick", "--backend", BACKEND,
                                  "--output", str(folder)])
    return folder, markdown


def read(folder, name):
    with open(os.path.join(folder, f"{name}.json")) as f:
        return json.load(f)


def check_environment(payload):
    env = payload["environment"]
    assert env["backend"] == BACKEND
    assert env["cpu_count"] >= 1
    assert env["versions"]["keras"] == keras.__version__
    assert env["date"][:2] == "20"
    assert payload["settings"]["quick"] is True


def test_layer_cost_writes_every_method_and_mode(suite):
    payload = read(suite[0], f"layer_cost_{BACKEND}_quick")
    check_environment(payload)
    keys = {(r["mode"], r["method"], r["dtype"]) for r in payload["results"]}
    for dtype in ("float32", "float16"):
        for method in layer_cost.METHODS + ("noop",):
            assert ("train", method, dtype) in keys
            assert ("inference", method, dtype) in keys
        for piece in layer_cost.PIECES:
            assert ("train", piece, dtype) in keys
    for r in payload["results"]:
        assert r["median_s"] > 0 and math.isfinite(r["median_s"])
        assert r["q1_s"] <= r["median_s"] <= r["q3_s"]


def test_end_to_end_compares_isobn_none_and_folded(suite):
    payload = read(suite[0], f"end_to_end_{BACKEND}_quick")
    check_environment(payload)
    (result,) = payload["results"]
    assert set(result["train"]) == {"none", "isobn"}
    assert set(result["inference"]) == {"none", "isobn", "isobn_folded"}
    assert len(result["train"]["isobn"]["steps"]) == 2
    assert result["train_ratio_isobn_to_none"]["median"] > 0
    folded = result["folded"]
    assert not folded["has_normalization"]
    assert folded["layers"] == folded["layers_without_isobn"]
    assert folded["max_abs_logit_difference"] < 1e-4
    assert 0 < result["analytic"]["share"] < 1


def test_import_cost_compares_keras_and_keras_isobn(suite):
    payload = read(suite[0], "import_cost_quick")
    assert "backend" not in payload["environment"]  # Measured in children.
    assert payload["environment"]["versions"]["keras"] == keras.__version__
    (result,) = payload["results"]
    assert result["backend"] == BACKEND
    statements = result["statements"]
    assert set(statements) == {"keras", "keras_isobn"}
    for name, statement in statements.items():
        assert statement["wall"]["count"] == 1
        # Keras alone takes far more than a bare interpreter's ~10 MiB.
        assert statement["peak_rss_bytes"] > 50 * 2**20, name
        assert set(statement["modules"]) <= set(import_cost.HEAVY_MODULES)
    assert "keras_hub" not in statements["keras"]["modules"]
    peaks = [statements[n]["peak_rss_bytes"] for n in ("keras_isobn", "keras")]
    assert result["ratios"]["peak_rss"] == pytest.approx(peaks[0] / peaks[1])


def test_each_benchmark_writes_its_tables_and_goals(suite):
    folder, markdown = suite
    expected = {
        f"layer_cost_{BACKEND}_quick.md": "## Where IsoBN's train time goes",
        f"end_to_end_{BACKEND}_quick.md": "## Classifiers",
        "import_cost_quick.md": "## Backends",
    }
    paths = [os.path.join(folder, name) for name in expected]
    assert sorted(markdown) == sorted(paths)
    for name, heading in expected.items():
        with open(os.path.join(folder, name)) as f:
            text = f.read()
        for part in ("## Goals", heading, "Machine: "):
            assert part in text, name
        goals = read(folder, name[:-3])["goals"]
        assert goals and all(g["measured"] in text for g in goals), name


@pytest.mark.skipif(BACKEND == "torch", reason="no data-parallel engine")
def test_distributed_step_times_every_head(tmp_path):
    path = distributed_step.main(["--quick", "--backend", BACKEND,
                                  "--output", str(tmp_path)])
    with open(path) as f:
        payload = json.load(f)
    runs = payload["runs"]
    assert [child["results"][0]["devices"] for child in runs] == [1, 2]
    for child in runs:
        heads = [r["head"] for r in child["results"]]
        assert heads == list(distributed_step.HEADS[BACKEND])
        # 1 timed epoch of 3 steps: 2 intervals between step ends.
        assert all(r["count"] == 2 for r in child["results"])
    with open(os.path.splitext(path)[0] + ".md") as f:
        assert "IsoBN, global-batch statistics" in f.read()


@pytest.mark.parametrize("layer_s, expected", [
    (5e-5, "met by the layer alone"),
    (2e-3, "**missed** by the layer alone on jax minilm (0.200%)"),
])
def test_end_to_end_checks_the_layer_alone_against_the_target(
    layer_s, expected
):
    # A paired timing inside its noise defers to the layer's own time over
    # the classifier's step, which must itself be under the target.
    ratio = {"median": 1.02, "q1": 0.97, "q3": 1.07}
    e2e = {
        "environment": {"backend": "jax"},
        "results": [{
            "model": "minilm", "hidden_dim": 8,
            "inference_ratio_isobn_to_none": ratio,
            "inference_ratio_control_to_none": ratio,
            "inference": {"none": {"median_s": 1.0}},
        }],
    }
    layer_cost = {
        "environment": {"backend": "jax"},
        "results": [{"mode": "inference", "method": "isobn", "dim": 8,
                     "dtype": "float32", "median_s": layer_s}],
    }
    measured, status = end_to_end.classifier_goal(e2e, layer_cost,
                                                  "inference", 0.001)
    assert status == "not resolved by the paired timing; " + expected
    assert f"layer alone {100 * layer_s:.3f}%" in measured
