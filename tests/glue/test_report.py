import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from keras_isobn import glue
from keras_isobn.glue import report

TASKS = {  # task: its dev metrics, primary first.
    "cola": ("mcc",),
    "stsb": ("pearson", "spearman"),
    "sst2": ("accuracy",),
    "mnli": ("accuracy", "mismatched_accuracy"),
    "wnli": ("accuracy",),
}


def _write_runs(root, rng):
    """Synthetic results.json files: 3 seeds of none and isobn per task."""
    runs = []
    for task, metrics in TASKS.items():
        for norm in ("none", "isobn"):
            for seed in (1, 2, 3):
                results = {
                    "task": task,
                    "norm": norm,
                    "seed": seed,
                    "dev_metrics": {
                        name: float(rng.uniform(0.3, 0.9)) for name in metrics
                    },
                    "ev": {
                        "k": 3,
                        "before": {"in": float(rng.uniform(0.5, 0.9))},
                        "after": {
                            "in": float(rng.uniform(0.5, 0.9)),
                            "out": float(rng.uniform(0.05, 0.5)),
                        },
                    },
                }
                results["ev"]["before"]["out"] = results["ev"]["before"]["in"]
                folder = root / task / norm / f"seed-{seed}"
                folder.mkdir(parents=True)
                (folder / "results.json").write_text(json.dumps(results))
                runs.append(results)
    return runs


def _csv(path):
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def test_report_tables_from_synthetic_results(tmp_path, rng):
    runs = _write_runs(tmp_path / "runs", rng)
    paths = report.main(
        [str(tmp_path / "runs"), "--output", str(tmp_path / "out")]
    )
    for path in paths.values():
        assert os.path.getsize(path) > 0
    with open(paths["table1.png"], "rb") as file:
        assert file.read(8) == b"\x89PNG\r\n\x1a\n"

    rows = {(r["norm"], r["column"]): r for r in _csv(paths["table1.csv"])}
    medians = {}
    for task, metrics in TASKS.items():
        # Table 1 shows the primary metric, and MNLI's mismatched one.
        for metric in [m for m in metrics if m != "spearman"]:
            for norm in ("none", "isobn"):
                values = [
                    r["dev_metrics"][metric]
                    for r in runs
                    if r["task"] == task and r["norm"] == norm
                ]
                column = {"mismatched_accuracy": "MNLI-mm"}.get(
                    metric, glue.get_task(task).tsv_folder
                )
                row = rows[(norm, column)]
                assert float(row["median"]) == pytest.approx(np.median(values))
                assert float(row["std"]) == pytest.approx(
                    np.std(values, ddof=1)
                )
                assert int(row["seeds"]) == 3
                if metric == metrics[0]:
                    medians[(task, norm)] = np.median(values)
    # Averages over the medians: small = CoLA, STS-B; large = SST-2, MNLI
    # (matched); WNLI and MNLI-mm in none.
    for norm in ("none", "isobn"):
        small = [medians[("cola", norm)], medians[("stsb", norm)]]
        large = [medians[("sst2", norm)], medians[("mnli", norm)]]
        groups = (("small", small), ("large", large), ("all", small + large))
        for group, members in groups:
            row = rows[(norm, f"{group} avg")]
            assert float(row["median"]) == pytest.approx(np.mean(members))
            assert row["std"] == ""

    table1 = open(paths["table1.md"]).read()
    cola = medians[("cola", "isobn")]
    assert "| IsoBN | " + f"{100 * cola:.1f} ± " in table1
    assert "| Fine-tuning |" in table1 and "MNLI-mm" in table1

    ev_rows = {(r["task"], r["norm"]): r for r in _csv(paths["table2.csv"])}
    assert len(ev_rows) == 2 * len(TASKS)
    for (task, norm), row in ev_rows.items():
        selected = [r for r in runs if r["task"] == task and r["norm"] == norm]
        for column, side in (
            ("pretrained", ("before", "in")),
            ("pooled", ("after", "in")),
            ("normalized", ("after", "out")),
        ):
            expected = np.median([r["ev"][side[0]][side[1]] for r in selected])
            assert float(row[column]) == pytest.approx(expected)
    table2 = open(paths["table2.md"]).read()
    stsb = ev_rows[("stsb", "isobn")]
    assert (
        f"| STS-B | IsoBN | 3 | {float(stsb['pretrained']):.3f} | "
        f"{float(stsb['pooled']):.3f} | {float(stsb['normalized']):.3f} |"
    ) in table2


def test_report_without_results(tmp_path):
    with pytest.raises(ValueError, match="No results.json under"):
        report.main([str(tmp_path)])


def test_report_names_a_broken_results_file(tmp_path):
    folder = tmp_path / "rte" / "isobn" / "seed-1"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text('{"task": "rte"}')
    with pytest.raises(ValueError, match=r"seed-1.results\.json: missing"):
        report.main([str(tmp_path)])


def test_report_of_a_json_lines_file_is_the_folders(tmp_path, rng):
    runs = _write_runs(tmp_path / "runs", rng)
    lines = tmp_path / "runs.jsonl"
    lines.write_text("".join(json.dumps(r) + "\n" for r in runs[::-1]))
    assert report.load_results(str(lines)) == report.load_results(
        str(tmp_path / "runs")
    )
    paths = report.main([str(lines)])  # Next to the file by default.
    assert os.path.dirname(paths["table1.md"]) == str(tmp_path)
    folder = report.main([str(tmp_path / "runs")])
    for name in ("table1.md", "table1.csv", "table2.md", "table2.csv"):
        with open(paths[name]) as a, open(folder[name]) as b:
            assert a.read() == b.read()
    (tmp_path / "bad.jsonl").write_text(json.dumps(runs[0]) + "\n{\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not valid JSON"):
        report.load_results(str(tmp_path / "bad.jsonl"))


def test_report_command(tmp_path, rng):
    _write_runs(tmp_path / "runs", rng)
    done = subprocess.run(
        [sys.executable, "-m", "keras_isobn.glue.report", "runs"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| IsoBN |" in done.stdout
    assert (tmp_path / "runs" / "report" / "table1.png").is_file()
    assert done.stderr == ""  # No start-up lines of TensorFlow or CUDA.
