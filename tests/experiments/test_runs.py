"""`experiments.runs`: the runs of an experiment as one JSON Lines file."""

import filecmp
import json
import os

import pytest

from experiments import runs
from experiments.anisotropy_lab import paired_statistics

EXPERIMENTS = os.path.dirname(os.path.abspath(runs.__file__))
COMMITTED = ("anisotropy_lab", "anisotropic_glue", "glue_minilm")


def _result(task, norm, seed, score):
    return {
        "task": task,
        "norm": norm,
        "seed": seed,
        "primary_metric": "accuracy",
        "dev_metrics": {"accuracy": score},
        "ev": {
            "k": 3,
            "before": {"in": 0.5, "out": 0.5},
            "after": {"in": 0.9, "out": 0.8},
        },
    }


def test_a_runs_folder_and_its_jsonl_give_the_same_results(tmp_path):
    folder = tmp_path / "runs"
    expected = []
    for norm in ("none", "isobn"):
        for seed in (1, 2):
            result = _result("sst2", norm, seed, 0.5 + seed / 10)
            seed_dir = folder / "sst2" / norm / f"seed-{seed}"
            seed_dir.mkdir(parents=True)
            (seed_dir / "results.json").write_text(json.dumps(result))
            expected.append(result)
    assert runs.read_runs(str(folder)) == expected
    path = tmp_path / "runs.jsonl"
    runs.write_runs(expected, str(path))
    assert len(path.read_text().splitlines()) == 4
    assert runs.read_runs(str(path)) == expected

    paths = runs.write_tables(str(folder), str(tmp_path / "tables"))
    assert runs.read_runs(paths["runs.jsonl"]) == expected
    assert "| Fine-tuning |" in (tmp_path / "tables" / "table1.md").read_text()


@pytest.mark.parametrize("experiment", COMMITTED)
def test_the_committed_tables_are_those_of_the_committed_runs(
    experiment, tmp_path
):
    results = os.path.join(EXPERIMENTS, experiment, "results")
    runs.main(
        [os.path.join(results, "runs.jsonl"), "--output", str(tmp_path)]
    )
    for name in ("table1.md", "table1.csv", "table2.md", "table2.csv"):
        assert filecmp.cmp(
            tmp_path / name, os.path.join(results, name), shallow=False
        ), name


def test_the_committed_paired_comparison_is_that_of_the_committed_runs():
    results = os.path.join(EXPERIMENTS, "anisotropy_lab", "results")
    rows = paired_statistics.paired_comparison(
        runs.read_runs(os.path.join(results, "runs.jsonl"))
    )
    with open(os.path.join(results, "paired.json")) as file:
        assert rows == json.load(file)
    with open(os.path.join(results, "paired.md")) as file:
        assert paired_statistics.paired_markdown(rows) == file.read()
