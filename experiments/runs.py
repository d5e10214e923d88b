"""The runs of a GLUE experiment as one JSON Lines file.

`recipes/glue.py` writes a folder per run (`TASK/NORM/seed-N/`, with its
`results.json` and checkpoints). An experiment keeps only the results: one
`results.json` dict per line of `runs.jsonl`, beside the tables made from
it by `keras_isobn.glue.report`.

Usage, from the repository root (gathers the recipe's `--output-dir` into
`DIR/runs.jsonl` and writes the tables there; a `runs.jsonl` also works as
`RUNS`, to redo the tables of a committed experiment):

```
python -m experiments.runs RUNS --output DIR
```
"""

import argparse
import json
import os

from keras_isobn.glue import report

__all__ = ["RUNS_FILE", "read_runs", "write_runs", "write_tables", "main"]

RUNS_FILE = "runs.jsonl"


def read_runs(path):
    """The results dicts of a recipe's runs folder or of a `runs.jsonl` file.

    Args:
        path: String, the `--output-dir` of `recipes/glue.py` (every
            `results.json` under it is read) or a JSON Lines file.

    Returns:
        A list of results dicts, sorted by task, norm and seed
        (`keras_isobn.glue.report.load_results`).
    """
    return report.load_results(path)


def write_runs(results, path):
    """Writes results dicts to `path`, one JSON object per line.

    Args:
        results: List of results dicts (as in each `results.json`).
        path: String, the JSON Lines file to write.
    """
    with open(path, "w") as file:
        for result in results:
            file.write(json.dumps(result) + "\n")


def write_tables(runs, output):
    """Writes `output/runs.jsonl` and the report's tables of it.

    Args:
        runs: String, a runs folder or a `runs.jsonl` file (see `read_runs`).
        output: String, the folder of the experiment's results.

    Returns:
        A dict of the written file paths, by name (`"runs.jsonl"`,
        `"table1.md"`, ...).
    """
    os.makedirs(output, exist_ok=True)
    path = os.path.join(output, RUNS_FILE)
    if not (os.path.exists(path) and os.path.samefile(runs, path)):
        write_runs(read_runs(runs), path)
    return {RUNS_FILE: path, **report.main([path, "--output", output])}


def main(argv=None):
    """`python -m experiments.runs RUNS --output DIR`: see `write_tables`."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.runs",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("runs", help="A runs folder or a runs.jsonl file.")
    parser.add_argument("--output", required=True, help="Results folder.")
    args = parser.parse_args(argv)
    return write_tables(args.runs, args.output)


if __name__ == "__main__":
    main()
