"""The recipe over tasks x norms x seeds on the lab's preset, and its tables.

`recipes/glue.py` fine-tunes the preset once per task (all norms and seeds,
the same recipe arguments for every norm); the results go to one
`runs.jsonl`, then `keras_isobn.glue.report`'s Table 1 and 2 and the paired
comparison of each norm with plain fine-tuning (`paired_statistics`).
"""

import json
import os
import subprocess
import sys

from benchmarks import harness
from experiments import runs
from experiments.anisotropy_lab import paired_statistics
from keras_isobn.glue.report import NORMS

__all__ = ["NORMS", "experiment", "tables"]

RECIPE = os.path.join(harness.REPO_ROOT, "recipes", "glue.py")


def experiment(args, recipe_args):
    """Runs `recipes/glue.py` once per task (all norms and seeds), then tables.

    A run already finished is skipped by the recipe, so the same command
    resumes an interrupted experiment. Each call first adds its machine,
    versions and date to `environments.jsonl` in `args.output` (the
    recipe's results record the versions only).

    Args:
        args: The parsed `experiment` command line (see `command_line.py`).
        recipe_args: List of strings, more arguments of the recipe.

    Returns:
        What `tables` returns.
    """
    os.makedirs(args.output, exist_ok=True)
    with open(os.path.join(args.output, "environments.jsonl"), "a") as file:
        file.write(json.dumps(harness.environment()) + "\n")
    for task in args.task:
        command = [
            sys.executable,
            RECIPE,
            "--preset",
            args.preset,
            "--task",
            task,
            "--data-dir",
            args.glue_dir,
            "--norm",
            *args.norm,
            "--seeds",
            *map(str, args.seeds),
            "--output-dir",
            args.runs,
            "--no-report",
            "--verbose",
            "0",
            *recipe_args,
        ]
        print("[lab] " + " ".join(command), flush=True)
        subprocess.run(command, check=True)
    return tables(args)


def tables(args):
    """`runs.jsonl`, the report's Table 1 and 2 and the paired comparison.

    Args:
        args: With `runs` (the recipe's `--output-dir`, or a `runs.jsonl`)
            and `output` (the folder of the tables).

    Returns:
        A dict: `"tables"`, the written paths by name, and `"paired"`, the
        rows of `paired_statistics.paired_comparison`.
    """
    paths = runs.write_tables(args.runs, args.output)
    rows = paired_statistics.paired_comparison(
        runs.read_runs(paths[runs.RUNS_FILE])
    )
    text = paired_statistics.paired_markdown(rows)
    with open(os.path.join(args.output, "paired.md"), "w") as file:
        file.write(text)
    harness.write_json(os.path.join(args.output, "paired.json"), rows)
    print(text, flush=True)
    return {"tables": paths, "paired": rows}
