"""Gathers GLUE results into the IsoBN paper's two tables.

The results are the `results.json` files that `recipes/glue.py` writes (a
folder of runs), or a JSON Lines file of them (one results dict a line):

```bash
python -m keras_isobn.glue.report runs/glue --output runs/glue/report
```

- Table 1 (`table1.md`, `table1.csv`, `table1.png`): the dev score of each
  task and normalization, median and standard deviation over seeds (in %,
  the task's primary metric: MCC for CoLA, Pearson for STS-B, F1 for MRPC
  and QQP, accuracy otherwise; MNLI matched and mismatched), with the
  averages of the medians over the small tasks (CoLA, STS-B, MRPC, RTE),
  the large ones (SST-2, MNLI, QNLI, QQP) and all of them.
- Table 2 (`table2.md`, `table2.csv`): EV_3, the share of the variance on
  the top-3 principal components of the dev-set embeddings, median over
  seeds: of the pre-trained pooled output, of the fine-tuned pooled output
  (entering the normalization) and after the normalization (BatchNorm or
  IsoBN).
"""

import argparse
import csv
import json
import os

import numpy as np

from keras_isobn.glue.tasks import TASKS
from keras_isobn.glue.tasks import get_task

__all__ = [
    "NORMS",
    "NORM_NAMES",
    "load_results",
    "main",
    "plot_table1",
    "table1",
    "table1_markdown",
    "table2",
    "table2_markdown",
    "write_csv",
]

NORMS = ("none", "batchnorm", "isobn", "isobn-unit")
NORM_NAMES = {
    "none": "Fine-tuning",
    "batchnorm": "BatchNorm",
    "isobn": "IsoBN",
    "isobn-unit": "IsoBN, unit variance",
}
GROUPS = ("small", "large", "all")


def load_results(runs):
    """Reads the results of GLUE runs.

    Args:
        runs: String, a folder of runs written by `recipes/glue.py` (every
            `results.json` under it, recursively), or a JSON Lines file
            (`.jsonl`) of such results, one a line.

    Returns:
        A list of results dicts, sorted by task, norm and seed.

    Raises:
        ValueError: if there is none, or one lacks a needed key.
    """
    found = [_checked(results, where) for where, results in _read(runs)]
    if not found:
        raise ValueError(
            f"No results.json under {runs!r}. Pass the --output-dir of "
            "recipes/glue.py, or a .jsonl file of results."
        )
    task_order = list(TASKS)
    found.sort(
        key=lambda r: (
            task_order.index(r["task"]),
            NORMS.index(r["norm"]),
            r["seed"],
        )
    )
    return found


def _read(runs):
    """Yields `(where, results)`: each file's path, or `path:line`."""
    if os.path.isfile(runs):
        with open(runs) as file:
            for number, line in enumerate(file, 1):
                if line.strip():
                    yield f"{runs}:{number}", _parse(line, f"{runs}:{number}")
        return
    for root, _, files in sorted(os.walk(runs)):
        if "results.json" in files:
            path = os.path.join(root, "results.json")
            with open(path) as file:
                yield path, _parse(file.read(), path)


def _parse(text, where):
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not valid JSON ({error}).") from None


def _checked(results, where):
    keys = ("task", "norm", "seed", "dev_metrics", "ev")
    missing = [key for key in keys if key not in results]
    if missing:
        raise ValueError(
            f"{where}: missing {missing}; is it a results.json of "
            "recipes/glue.py?"
        )
    return results


def _columns(results):
    """The Table 1 columns: (task, metric key, header), in GLUE order."""
    columns = []
    for name in dict.fromkeys(r["task"] for r in results):
        task = get_task(name)
        columns.append((task, task.primary_metric, task.tsv_folder))
        if len(task.dev_splits) > 1:  # MNLI: matched and mismatched.
            for split in task.dev_splits[1:]:
                tag = split.replace("validation_", "")
                columns.append(
                    (
                        task,
                        f"{tag}_{task.primary_metric}",
                        f"{task.tsv_folder}-{tag[:1]}m",
                    )
                )
    return columns


def _stats(values):
    values = np.asarray(values, dtype="float64")
    std = values.std(ddof=1) if len(values) > 1 else 0.0
    return float(np.median(values)), float(std), len(values)


def table1(results):
    """Median and std over seeds of each task's dev score, per norm.

    Returns:
        A list of dicts, one per (norm, column): `norm`, `task`, `metric`,
        `column`, `median`, `std`, `seeds` (scores as fractions), then one
        per (norm, group) with the average of the medians (`task` is the
        group: `"small"`, `"large"` or `"all"`; `std` is `None`). MNLI
        counts once in the averages, by its matched score; WNLI (which the
        paper leaves out) in none.
    """
    rows = []
    for norm in NORMS:
        runs = [r for r in results if r["norm"] == norm]
        if not runs:
            continue
        medians = {}
        for task, metric, header in _columns(results):
            values = [
                r["dev_metrics"][metric]
                for r in runs
                if r["task"] == task.name and metric in r["dev_metrics"]
            ]
            if not values:
                continue
            median, std, count = _stats(values)
            if metric == task.primary_metric:  # Not MNLI-mm.
                medians[header] = (task, median)
            rows.append(
                dict(
                    norm=norm,
                    task=task.name,
                    metric=metric,
                    column=header,
                    median=median,
                    std=std,
                    seeds=count,
                )
            )
        for group in GROUPS:
            members = [
                median
                for task, median in medians.values()
                if task.group is not None
                and (group == "all" or task.group == group)
            ]
            if members:
                rows.append(
                    dict(
                        norm=norm,
                        task=group,
                        metric="average",
                        column=f"{group} avg",
                        median=float(np.mean(members)),
                        std=None,
                        seeds=len(members),
                    )
                )
    return rows


def table2(results):
    """EV_3 medians over seeds per task: pre-trained, and per norm in/out.

    Returns:
        A list of dicts, one per (task, norm): `task`, `norm`, `k`, `seeds`,
        `pretrained` (EV_k of the pooled output before fine-tuning),
        `pooled` (of the fine-tuned pooled output, entering the
        normalization) and `normalized` (after it; equal to `pooled` for
        `"none"`).
    """
    rows = []
    for task in dict.fromkeys(r["task"] for r in results):
        for norm in NORMS:
            runs = [
                r for r in results if r["task"] == task and r["norm"] == norm
            ]
            if not runs:
                continue
            rows.append(
                dict(
                    task=task,
                    norm=norm,
                    k=runs[0]["ev"]["k"],
                    seeds=len(runs),
                    pretrained=_median(r["ev"]["before"]["in"] for r in runs),
                    pooled=_median(r["ev"]["after"]["in"] for r in runs),
                    normalized=_median(r["ev"]["after"]["out"] for r in runs),
                )
            )
    return rows


def _median(values):
    return float(np.median(list(values)))


def table1_markdown(rows):
    """Table 1 as Markdown: a row per norm, `median ± std (seeds)` in %."""
    columns = list(dict.fromkeys(row["column"] for row in rows))
    lines = [
        "| Method | " + " | ".join(columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for norm in dict.fromkeys(row["norm"] for row in rows):
        cells = {row["column"]: row for row in rows if row["norm"] == norm}
        line = [NORM_NAMES[norm]]
        for column in columns:
            row = cells.get(column)
            if row is None:
                line.append("–")
            elif row["std"] is None:
                line.append(f"{100 * row['median']:.1f}")
            else:
                line.append(
                    f"{100 * row['median']:.1f} ± {100 * row['std']:.1f} "
                    f"({row['seeds']})"
                )
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines) + "\n"


def table2_markdown(rows):
    """Table 2 as Markdown: a row per (task, norm), EV_k to 3 decimals."""
    k = rows[0]["k"]
    lines = [
        f"| Task | Method | Seeds | EV_{k} pre-trained | EV_{k} fine-tuned "
        f"pooled output | EV_{k} after the normalization |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        after = "–" if row["norm"] == "none" else f"{row['normalized']:.3f}"
        lines.append(
            f"| {get_task(row['task']).tsv_folder} | "
            f"{NORM_NAMES[row['norm']]} | {row['seeds']} | "
            f"{row['pretrained']:.3f} | {row['pooled']:.3f} | {after} |"
        )
    return "\n".join(lines) + "\n"


def plot_table1(rows, path):
    """A grouped bar chart of Table 1: medians with std error bars."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    columns = list(dict.fromkeys(row["column"] for row in rows))
    norms = list(dict.fromkeys(row["norm"] for row in rows))
    width = 0.8 / len(norms)
    figure, axes = plt.subplots(figsize=(1.2 + 1.1 * len(columns), 3.6))
    for index, norm in enumerate(norms):
        cells = {row["column"]: row for row in rows if row["norm"] == norm}
        positions = [
            i + (index - (len(norms) - 1) / 2) * width
            for i, column in enumerate(columns)
            if column in cells
        ]
        present = [cells[column] for column in columns if column in cells]
        axes.bar(
            positions,
            [100 * row["median"] for row in present],
            width,
            yerr=[100 * (row["std"] or 0.0) for row in present],
            capsize=2,
            label=NORM_NAMES[norm],
        )
    axes.set_xticks(range(len(columns)), columns, rotation=30, ha="right")
    axes.set_ylabel("dev score (%), median over seeds")
    axes.legend(fontsize="small")
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_csv(rows, path):
    """Writes `rows` (dicts with the same keys) as CSV, with a header."""
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main(argv=None):
    """Writes the report of the runs in `RUNS` (a folder or a `.jsonl`).

    Args:
        argv: List of strings: `RUNS [--output DIR]`.

    Returns:
        A dict of the written file paths, by name (`"table1.md"`, ...).
    """
    parser = argparse.ArgumentParser(
        prog="python -m keras_isobn.glue.report",
        description=(
            "Gather the results.json files of recipes/glue.py into the IsoBN "
            "paper's Table 1 (dev scores, median and std over seeds) and "
            "Table 2 (EV_3), as Markdown, CSV and a bar chart."
        ),
    )
    parser.add_argument(
        "runs",
        help="The --output-dir of recipes/glue.py, or a .jsonl of results.",
    )
    parser.add_argument(
        "--output",
        default=None,
        help="Where to write the tables. Default: RUNS/report (a folder), "
        "or next to the .jsonl file.",
    )
    args = parser.parse_args(argv)
    output = args.output or (
        os.path.dirname(os.path.abspath(args.runs))
        if os.path.isfile(args.runs)
        else os.path.join(args.runs, "report")
    )
    results = load_results(args.runs)
    os.makedirs(output, exist_ok=True)
    rows1, rows2 = table1(results), table2(results)
    paths = {
        name: os.path.join(output, name)
        for name in (
            "table1.md",
            "table1.csv",
            "table1.png",
            "table2.md",
            "table2.csv",
        )
    }
    text1 = (
        "Dev scores (%), median ± std over seeds (number of seeds); the "
        "averages are over the medians.\n\n" + table1_markdown(rows1)
    )
    text2 = (
        f"EV_{rows2[0]['k']} of the dev-set embeddings (median over seeds): "
        "the share of the variance on the top principal components.\n\n"
        + table2_markdown(rows2)
    )
    with open(paths["table1.md"], "w") as file:
        file.write(text1)
    with open(paths["table2.md"], "w") as file:
        file.write(text2)
    write_csv(rows1, paths["table1.csv"])
    write_csv(rows2, paths["table2.csv"])
    plot_table1(rows1, paths["table1.png"])
    print(f"[report] {len(results)} runs from {args.runs}\n")
    print(text1 + "\n" + text2)
    print(f"[report] Wrote {', '.join(paths.values())}")
    return paths


if __name__ == "__main__":
    main()
