"""Writes the notebooks of this folder from their sources, and runs them.

The source of `NAME.ipynb` is `NAME.py`, in jupytext's percent format:
`# %%` starts a code cell, `# %% [markdown]` a markdown cell (its lines
commented), `# %% tags=["parameters"]` the parameters cell, and IPython
magics are commented (`# %matplotlib inline`). The notebooks are committed
with their outputs (so GitHub shows the figures). To change one, edit its
source, then write and execute the notebooks, each from a fresh kernel in
this folder, on the default parameters, with:

```bash
python notebooks/build_notebooks.py --execute
```

Without `--execute` the notebooks are written without outputs. Executing
needs `nbclient` and `ipykernel` (the `test` extras); each notebook takes a
few minutes on a 2-core CPU.
"""

import argparse
import glob
import os

import jupytext
import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = sorted(glob.glob(os.path.join(HERE, "[0-9]*.py")))
TIMEOUT = 900  # Seconds per cell.


def build(source):
    """The notebook, without outputs, of the percent-format file `source`."""
    notebook = jupytext.read(source, fmt="py:percent")
    notebook.metadata = {
        "kernelspec": {
            "name": "python3",
            "display_name": "Python 3",
            "language": "python",
        },
        "language_info": {"name": "python"},
    }
    return notebook


def execute(notebook, cwd=HERE, timeout=TIMEOUT):
    """Runs all cells of `notebook` in place, from a fresh kernel in `cwd`."""
    from nbclient import NotebookClient

    NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": cwd}},
    ).execute()
    return notebook


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--execute", action="store_true", help="Run them and keep the outputs."
    )
    parser.add_argument(
        "sources",
        nargs="*",
        default=SOURCES,
        help="Sources of the notebooks to write (default: all).",
    )
    args = parser.parse_args()
    for source in args.sources:
        notebook = build(source)
        if args.execute:
            execute(notebook)
        nbformat.validate(notebook)
        path = os.path.splitext(source)[0] + ".ipynb"
        nbformat.write(notebook, path)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
