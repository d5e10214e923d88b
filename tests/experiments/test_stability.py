"""Smoke test of `experiments.stability` at tiny sizes (no timings)."""

import json
import os

import keras

from experiments.stability import measurement

BACKEND = keras.backend.backend()


def test_stability_counts_trials_and_isobn_never_fails(tmp_path):
    (path,) = measurement.main(
        ["--quick", "--backend", BACKEND, "--output", str(tmp_path)]
    )
    with open(path) as f:
        payload = json.load(f)
    env = payload["environment"]
    assert env["backend"] == BACKEND
    assert env["versions"]["keras"] == keras.__version__
    assert payload["settings"]["quick"] is True
    methods = {r["method"] for r in payload["results"]}
    assert methods == {"isobn", "batchnorm", "zca", "iternorm"}
    for r in payload["results"]:
        assert 0 <= r["failed_trials"] <= r["trials"] == 2
        assert sum(r["failures_by_stage"].values()) >= r["failed_trials"]
        if r["method"] == "isobn":
            assert r["failed_trials"] == 0, r
    cls = [r for r in payload["results"] if r["family"] == "cls_like"]
    # float16 flushes the smallest stds to exactly zero.
    assert any(r["input_zero_std_features"] > 0 for r in cls)
    with open(os.path.splitext(path)[0] + ".md") as f:
        assert "| IsoBN | 0/2 |" in f.read()
